"""The efficiency model: predict a lossy strategy's statistical efficiency (LightGBM).

Trained on the dataset's efficiency table (:mod:`autosync.efficiency`): one row per measured
(workload, batch, world, lossy choices). Its features are what changes the math and what
describes the workload, never the network (efficiency does not depend on it):

- the strategy's registry features that concern compression and sync modes (shares of the
  model's bytes per compressor, PowerSGD rank and top-k ratio weighted by share, local-SGD
  period) and the bytes it sends relative to the model (``compression``);
- the workload: log parameter count, embedding share, log per-rank batch, world size, and
  the log gradient noise scale measured on the reference runs (McCandlish et al. 2018), the
  one online signal known before a candidate is trained.

The target is the measured efficiency (0 = never reached the target loss), clipped to
[0, 1.25]. Lossless strategies are 1 by definition and never predicted. Predicted goodput =
predicted speedup x predicted efficiency.

The loss is L1: the model predicts the conditional median. Measured efficiencies pile up at 1
with a tail down to 0 (never reached the target, censored), so the median is the constant to
beat in MAE, and the mean is pulled by the few zeros; the held-out comparison of L1, L2, the
training median and the training mean is ``python bench/transfer.py`` (bench/results/transfer.md). The risk of a
zero is carried by the conformal interval (``interval_q``), not the point.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from autosync import plans as registry
from autosync.efficiency import as_protocol
from autosync.models.features import featurize
from autosync.strategy import Strategy

_LOSSY_FEATURES = list(dict.fromkeys(f for e in (*registry.COMPRESSORS.values(), *registry.SYNC_MODES.values())
                                     for f in e.features))     # a feature several entries share counts once
EFF_FEATURES = ["log_params", "embedding_frac", "log_batch", "world_size", "log_noise_scale", "compression",
                *_LOSSY_FEATURES]
PARAMS = dict(objective="regression_l1", n_estimators=200, learning_rate=0.05, num_leaves=7, min_child_samples=3,
              subsample=0.8, subsample_freq=1, verbose=-1, n_jobs=1)
CLIP = (0.0, 1.25)


def features(profile, strategy: Strategy, noise_scale: float) -> dict[str, float]:
    """The efficiency model's features of one candidate (``profile``: any profile of the workload and batch)."""
    f = featurize(profile, strategy)
    out = {k: f[k] for k in EFF_FEATURES if k in f}
    out["log_batch"] = math.log2(max(profile.model.batch_size, 1))
    out["world_size"] = profile.cluster.world_size
    out["log_noise_scale"] = math.log10(noise_scale) if noise_scale and noise_scale > 0 else float("nan")
    return out


def noise_scales(eff: pd.DataFrame) -> dict[tuple[str, int, int], float]:
    """The reference runs' gradient noise scale per (workload, batch, world)."""
    ref = eff[(eff.lossy_key == "lossless") & (eff.status == "ok")]
    return {k: float(g.grad_noise_scale.mean()) for k, g in ref.groupby(["workload", "batch_size", "world_size"])}


def training_rows(store) -> tuple[pd.DataFrame, np.ndarray]:
    """(frame of measured lossy rows: workload, efficiency; feature matrix) from a store's efficiency table,
    each row featurized with a stored profile of the same workload, batch and world."""
    from autosync.profiler import Profile

    eff = store.read_efficiency()
    scales = noise_scales(eff)
    lossy = eff[(eff.lossy_key != "lossless") & (eff.status == "ok")]
    trials = store.read(efficiency=False)[["context_id", "workload", "batch_size", "world_size"]].drop_duplicates()
    profiles: dict[tuple, object] = {}
    rows, feats = [], []
    for r in lossy.to_dict("records"):
        k = (r["workload"], int(r["batch_size"]), int(r["world_size"]))
        if k not in profiles:
            ctx = trials[(trials.workload == k[0]) & (trials.batch_size == k[1]) & (trials.world_size == k[2])]
            raw = next((d for d in (store.load_profile_dict(c) for c in ctx.context_id) if d), None)
            profiles[k] = Profile.from_dict(raw) if raw else None
        if profiles[k] is None:
            continue
        feats.append(features(profiles[k], Strategy.from_dict(json.loads(r["strategy"])), scales.get(k, float("nan"))))
        rows.append({"workload": r["workload"], "efficiency": float(np.clip(as_protocol(r)["efficiency"], *CLIP)),
                     "efficiency_key": r["efficiency_key"]})
    X = np.array([[f[n] for n in EFF_FEATURES] for f in feats], dtype=np.float64).reshape(len(feats), len(EFF_FEATURES))
    return pd.DataFrame(rows, columns=["workload", "efficiency", "efficiency_key"]), X


@dataclass
class EfficiencyModel:
    """LightGBM on measured efficiencies; with fewer than ``min_rows`` rows it predicts 1.0 for every lossy
    strategy: optimistic on purpose, so that lossy candidates reach the finalists, whose efficiency the tuner
    then measures before it may recommend one (a mean of a handful of rows would be noise).

    ``interval_q``: the half-width of its 80% interval, the conformal quantile of its leave-one-workload-out
    absolute errors (from the card, :func:`evaluate`); nan = no interval (the bounds are the prediction)."""

    booster: object = None
    prior: float = 1.0
    rows: int = 0
    card: dict = field(default_factory=dict)
    min_rows: int = 8
    interval_q: float = float("nan")

    def fit(self, X: np.ndarray, y: np.ndarray, seed: int = 0) -> "EfficiencyModel":
        import lightgbm as lgb

        self.rows = len(y)
        self.prior = float(np.median(y)) if len(y) >= self.min_rows else 1.0
        self.booster = None
        if len(y) >= self.min_rows:
            model = lgb.LGBMRegressor(**PARAMS, random_state=seed)
            model.fit(X, y, feature_name=EFF_FEATURES)
            self.booster = model.booster_
        self.card = {"features": EFF_FEATURES, "rows": self.rows, "prior": self.prior,
                     "hyper_parameters": PARAMS}
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64).reshape(-1, len(EFF_FEATURES))
        if self.booster is None:
            return np.full(len(X), self.prior)
        return np.clip(self.booster.predict(X, num_threads=1), *CLIP)

    def score(self, profile, strategies: list[Strategy], noise_scale: float) -> np.ndarray:
        """Predicted efficiency per strategy; 1 for lossless ones."""
        out = np.ones(len(strategies))
        lossy = [i for i, s in enumerate(strategies) if not s.is_lossless]
        if lossy:
            rows = [features(profile, strategies[i], noise_scale) for i in lossy]   # featurize once per candidate
            X = np.array([[f[n] for n in EFF_FEATURES] for f in rows])
            out[lossy] = self.predict(X)
        return out


    def bounds(self, profile, strategies: list[Strategy], noise_scale: float) -> tuple[np.ndarray, ...]:
        """(efficiency, lo, hi) per strategy: the prediction -+ ``interval_q``, within [0, 1.25]; 1 for lossless."""
        eff = self.score(profile, strategies, noise_scale)
        if math.isnan(self.interval_q):
            return eff, eff, eff
        lossy = np.array([not s.is_lossless for s in strategies])
        lo = np.where(lossy, np.clip(eff - self.interval_q, *CLIP), eff)
        hi = np.where(lossy, np.clip(eff + self.interval_q, *CLIP), eff)
        return eff, lo, hi


def fit_store(store, seed: int = 0, without_workload: str | None = None) -> EfficiencyModel:
    """The efficiency model fitted to ``store``'s efficiency table (less ``without_workload``'s rows: what a
    workload the dataset has never seen gets)."""
    frame, X = training_rows(store)
    if without_workload is not None:
        keep = (frame.workload != without_workload).to_numpy()
        frame, X = frame[keep], X[keep]
    model = EfficiencyModel().fit(X, frame.efficiency.to_numpy(), seed)
    try:
        model.interval_q = float(json.loads(CARD.read_text())["held_out_workload"]["interval_q"])
    except (OSError, KeyError, TypeError, ValueError):
        pass
    return model


def evaluate(store, seed: int = 0) -> dict:
    """Leave one workload out: MAE and Spearman of the model against predicting a constant, the training
    median (the constant of least MAE) and the training mean."""
    from scipy.stats import spearmanr

    frame, X = training_rows(store)
    y = frame.efficiency.to_numpy()
    per, preds, means, medians = {}, np.zeros(len(y)), np.zeros(len(y)), np.zeros(len(y))
    for w in sorted(frame.workload.unique()):
        test = (frame.workload == w).to_numpy()
        m = EfficiencyModel().fit(X[~test], y[~test], seed)
        preds[test] = m.predict(X[test])
        means[test] = y[~test].mean() if (~test).any() else 1.0
        medians[test] = np.median(y[~test]) if (~test).any() else 1.0
        per[w] = {"rows": int(test.sum()), "mae": float(np.abs(preds[test] - y[test]).mean()),
                  "mae_median_baseline": float(np.abs(medians[test] - y[test]).mean()),
                  "mae_mean_baseline": float(np.abs(means[test] - y[test]).mean())}
    rho = spearmanr(preds, y).statistic if len(y) > 2 and np.std(y) > 0 and np.std(preds) > 0 else float("nan")
    from autosync.models.uncertainty import LEVEL, conformal_quantile

    q = conformal_quantile(np.abs(preds - y), LEVEL) if len(y) else float("inf")
    return {"rows": int(len(y)), "workloads": len(per), "mae": float(np.abs(preds - y).mean()) if len(y) else None,
            "mae_median_baseline": float(np.abs(medians - y).mean()) if len(y) else None,
            "mae_mean_baseline": float(np.abs(means - y).mean()) if len(y) else None,
            "spearman": None if rho != rho else float(rho), "per_workload": per,
            "interval_q": q if math.isfinite(q) else None,
            "measured_efficiency": {"min": float(y.min()) if len(y) else None,
                                    "median": float(np.median(y)) if len(y) else None,
                                    "share_below_0.95": float((y < 0.95).mean()) if len(y) else None}}


CARD = Path(__file__).parent / "pretrained" / "efficiency" / "card.json"


def write_card(store, path=CARD, seed: int = 0) -> dict:
    """Write the card of the efficiency model fitted to ``store`` (the shipped dataset): what it learns from and
    how it transfers to a held-out workload. The model itself is small and is fitted afresh from the shipped
    efficiency table at the start of every time-to-loss tune; the card describes that fit."""
    frame, _ = training_rows(store)
    card = {"kind": "efficiency", "fitted": "at the start of each time-to-loss tune, from the shipped dataset's "
            "efficiency table (autosync.models.efficiency_model.fit_store)",
            "target": "measured statistical efficiency, clipped to [0, 1.25]; lossless strategies are 1 and not "
                      "predicted", "features": EFF_FEATURES, "hyper_parameters": PARAMS,
            "min_rows": EfficiencyModel.min_rows, "rows": int(len(frame)),
            "workloads": sorted(frame.workload.unique().tolist()),
            "held_out_workload": evaluate(store, seed)}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(card, indent=1))
    tmp.replace(path)
    return card
