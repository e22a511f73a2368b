"""Held-out evaluation: does the cost model transfer to workloads and clusters it never saw?

Leave-one-workload-out and leave-one-cluster-out (scikit-learn's ``LeaveOneGroupOut``): for
each held-out group, train on every other group and score the held-out contexts. Per context, with predicted scores ``s`` and
measured speedups ``y``:

- pairwise accuracy: the fraction of pairs ordered as measured, over pairs whose measured
  throughputs differ by more than 2% (closer pairs are within the noise of repeated runs);
- Kendall tau between ``s`` and ``y``;
- top-1 regret: ``1 - y[argmax s] / max y``;
- top-5 hit: whether the measured best is among the five best-scored.

A group's figure is the median over its contexts. Methods side by side: the LightGBM ranker,
the regressor, the analytical simulator alone (scores = its predicted speedup), and the
ranker trained without the simulator's features.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import kendalltau
from sklearn.model_selection import LeaveOneGroupOut

from autosync.models.features import FEATURES, SIM_FEATURES
from autosync.models.ranker import CostModel
from autosync.models.training import TrainingSet

NOISE = 0.02
METHODS = ("ranker", "regressor", "simulator", "ranker_no_sim")


def context_metrics(scores: np.ndarray, speedups: np.ndarray) -> dict[str, float]:
    log_y = np.log(speedups)
    diff_y = log_y[:, None] - log_y[None, :]
    diff_s = scores[:, None] - scores[None, :]
    mask = np.triu(np.abs(diff_y) > np.log1p(NOISE), 1)
    pairs = int(mask.sum())
    pairwise = float((np.sign(diff_s[mask]) == np.sign(diff_y[mask])).mean()) if pairs else float("nan")
    tau = kendalltau(scores, speedups).statistic if len(scores) > 1 else float("nan")
    best_pred = int(np.argmax(scores))
    top5 = np.argsort(-scores)[:5]
    return {"pairwise": pairwise, "kendall_tau": float(tau), "regret": float(1 - speedups[best_pred] / speedups.max()),
            "top5_hit": float(int(np.argmax(speedups)) in set(top5.tolist())), "pairs": pairs, "n": len(scores)}


def _fit(kind: str, data: TrainingSet, features: list[str], seed: int) -> CostModel:
    cols = [data.features.index(f) for f in features]
    return CostModel(kind, features).fit(data.X[:, cols], data.log_speedup, data.relevance, data.groups(), seed)


def _scores(method: str, train: TrainingSet, test: TrainingSet, seed: int) -> np.ndarray:
    if method == "simulator":
        return test.X[:, test.features.index("sim_speedup")]
    features = [f for f in FEATURES if f not in SIM_FEATURES] if method == "ranker_no_sim" else list(FEATURES)
    kind = "regressor" if method == "regressor" else "ranker"
    model = _fit(kind, train, features, seed)
    cols = [test.features.index(f) for f in features]
    return model.predict(test.X[:, cols])


@dataclass
class TransferReport:
    per_context: pd.DataFrame      # split, held_out, context_id, method, metrics...
    summary: pd.DataFrame          # split, method: medians over held-out groups

    def to_markdown(self) -> str:
        lines = ["| split | method | pairwise acc. (median) | Kendall tau | top-1 regret (median) | best in top 5 |",
                 "|---|---|---:|---:|---:|---:|"]
        for _, r in self.summary.iterrows():
            lines.append(f"| {r.split} | {r.method} | {r.pairwise:.3f} | {r.kendall_tau:.3f} | {r.regret:.1%} | "
                         f"{r.top5_hit:.0%} |")
        return "\n".join(lines)


def evaluate(data: TrainingSet, splits=("workload", "cluster"), methods=METHODS, seed: int = 0) -> TransferReport:
    rows = []
    for split in splits:
        groups = data.frame[split].to_numpy()
        if len(set(groups)) < 2:
            continue
        for train_idx, test_idx in LeaveOneGroupOut().split(data.X, groups=groups):
            held = groups[test_idx[0]]
            train, test = data.subset(train_idx), data.subset(test_idx)
            for method in methods:
                scores = _scores(method, train, test, seed)
                for ctx, idx in test.frame.groupby("context_id").indices.items():
                    if len(idx) < 3:
                        continue
                    m = context_metrics(scores[idx], test.frame.speedup.to_numpy()[idx])
                    rows.append({"split": split, "held_out": held, "context_id": ctx, "method": method, **m})
    per_context = pd.DataFrame(rows)
    by_group = per_context.groupby(["split", "held_out", "method"])[["pairwise", "kendall_tau", "regret", "top5_hit"]]\
        .median().reset_index()
    summary = by_group.groupby(["split", "method"])[["pairwise", "kendall_tau", "regret", "top5_hit"]].median()\
        .reset_index()
    summary["method"] = pd.Categorical(summary.method, METHODS)
    return TransferReport(per_context, summary.sort_values(["split", "method"]).reset_index(drop=True))


def plot(report: TransferReport, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_group = report.per_context.groupby(["split", "held_out", "method"])[["pairwise", "regret"]].median().reset_index()
    splits = list(per_group.split.unique())
    fig, axes = plt.subplots(len(splits), 2, figsize=(13, 4 * len(splits)), squeeze=False)
    for row, split in enumerate(splits):
        part = per_group[per_group.split == split]
        groups = sorted(part.held_out.unique())
        width = 0.8 / len(METHODS)
        for col, metric in enumerate(("pairwise", "regret")):
            ax = axes[row][col]
            for k, method in enumerate(METHODS):
                vals = [part[(part.held_out == g) & (part.method == method)][metric].mean() for g in groups]
                ax.bar(np.arange(len(groups)) + k * width, vals, width, label=method)
            ax.set_xticks(np.arange(len(groups)) + 0.4 - width / 2)
            ax.set_xticklabels(groups, rotation=20, fontsize=8)
            ax.set_title(f"leave-one-{split}-out: {'pairwise accuracy' if metric == 'pairwise' else 'top-1 regret'}")
            if metric == "pairwise":
                ax.axhline(0.85, color="grey", ls="--", lw=0.8)
                ax.set_ylim(0.4, 1.0)
            else:
                ax.axhline(0.10, color="grey", ls="--", lw=0.8)
        axes[row][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
