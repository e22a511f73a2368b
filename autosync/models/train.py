"""Train a cost model on a dataset and save it with its card."""
from __future__ import annotations

from pathlib import Path

from autosync.datasets.store import DatasetStore
from autosync.models import training, transfer
from autosync.models.ranker import CostModel

PRETRAINED = Path(__file__).parent / "pretrained"


def train_and_save(store: DatasetStore, out: str | Path, kind: str = "ranker", evaluate: bool = False,
                   seed: int = 0) -> dict:
    data = training.build(store)
    model = CostModel(kind).fit(data.X, data.log_speedup, data.relevance, data.groups(), seed)
    extra = {"data_hash": data.data_hash, "rows": int(len(data.frame)),
             "contexts": int(data.frame.context_id.nunique()),
             "workloads": sorted(data.frame.workload.unique().tolist()),
             "clusters": sorted(data.frame.cluster.unique().tolist())}
    if evaluate:
        report = transfer.evaluate(data, seed=seed, methods=("ranker", "regressor", "simulator", "ranker_no_sim"))
        extra["held_out"] = {split: {k: float(v) for k, v in
                                     report.summary[(report.summary.split == split) & (report.summary.method == kind)]
                                     [["pairwise", "kendall_tau", "regret", "top5_hit"]].iloc[0].items()}
                             for split in report.summary.split.unique()}
        extra["held_out_all_methods"] = [{k: (str(v) if k in ("split", "method") else float(v)) for k, v in r.items()}
                                         for r in report.summary.to_dict("records")]
    model.save(out, **extra)
    return model.card
