"""From stored trials to a training set: features, targets, context groups.

Target: speedup over the DDP default measured in the same context,
``speedup = samples_per_s / samples_per_s(ddp_default)``; the regressor learns
``log(speedup)``, the ranker graded relevance within each context. Failed and timed-out
trials stay in the set with the lowest relevance and a speedup of half the context's
slowest success: a strategy that breaks is worse than any that runs. Contexts whose
default was not measured successfully are left out (no reference).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from autosync.datasets.store import DatasetStore
from autosync.models.features import FEATURES, feature_matrix, featurize
from autosync.models.simulator import simulate
from autosync.profiler import Profile
from autosync.strategy import loads_strategy

MAX_RELEVANCE = 30


@dataclass
class TrainingSet:
    X: np.ndarray
    log_speedup: np.ndarray
    relevance: np.ndarray
    frame: pd.DataFrame            # one row per sample: context_id, workload, cluster, strategy_hash, ok, speedup, sim_step_s
    features: list[str]

    @property
    def data_hash(self) -> str:
        key = self.frame[["context_id", "strategy_hash", "speedup"]].to_csv(index=False)
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def subset(self, mask: np.ndarray) -> "TrainingSet":
        """Rows where ``mask`` is true, or rows at integer positions ``mask``, in that order."""
        idx = np.flatnonzero(mask) if mask.dtype == bool else mask
        return TrainingSet(self.X[idx], self.log_speedup[idx], self.relevance[idx],
                           self.frame.iloc[idx].reset_index(drop=True), self.features)

    @staticmethod
    def concat(sets: list["TrainingSet"]) -> "TrainingSet":
        """Union of training sets; a (context, strategy) in several keeps its last; rows grouped by context."""
        frame = pd.concat([s.frame for s in sets], ignore_index=True)
        joined = TrainingSet(np.vstack([s.X for s in sets]), np.concatenate([s.log_speedup for s in sets]),
                             np.concatenate([s.relevance for s in sets]), frame, sets[0].features)
        keep = np.flatnonzero(~frame.duplicated(["context_id", "strategy_hash"], keep="last").to_numpy())
        order = keep[np.argsort(frame.context_id.to_numpy()[keep], kind="stable")]
        return joined.subset(order)

    def groups(self) -> list[int]:
        """Sizes of consecutive context groups (rows are sorted by context)."""
        return self.frame.groupby("context_id", sort=False).size().tolist()


def relevance_labels(speedups: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """Graded relevance in one context: failures 0, successes 1..30 by rank of speedup."""
    labels = np.zeros(len(speedups), dtype=np.int32)
    idx = np.where(ok)[0]
    if len(idx):
        order = speedups[idx].argsort().argsort()
        labels[idx] = 1 + np.floor(order / max(len(idx) - 1, 1) * (MAX_RELEVANCE - 1)).astype(np.int32)
    return labels


def build_context(profile: Profile, ctx: pd.DataFrame) -> TrainingSet | None:
    """The training rows of one context (columns source, strategy, strategy_hash, status, samples_per_s), or
    None when its DDP default was not measured successfully (no reference)."""
    ref = ctx[(ctx.source == "ddp_default") & (ctx.status == "ok")]
    if ref.empty:
        return None
    base = float(ref.samples_per_s.iloc[0])
    ok = (ctx.status == "ok").to_numpy()
    speed = ctx.samples_per_s.to_numpy(dtype=float) / base
    floor = np.nanmin(speed[ok]) / 2
    speed = np.where(ok, speed, floor)
    rows = []
    for s_json in ctx.strategy:
        strategy = loads_strategy(s_json)
        rows.append(featurize(profile, strategy, simulate(profile, strategy)))
    c = profile.cluster.spec()
    frame = pd.DataFrame({
        "context_id": profile.context_id, "workload": profile.model.workload, "cluster": c,
        "strategy_hash": ctx.strategy_hash.to_numpy(), "source": ctx.source.to_numpy(), "ok": ok,
        "speedup": speed, "relevance": relevance_labels(speed, ok),
        "sim_step_s": [math.exp(r["sim_log_step_ratio"]) for r in rows],
    })
    return TrainingSet(feature_matrix(rows, FEATURES), np.log(speed), frame.relevance.to_numpy(), frame,
                       list(FEATURES))


def build(store: DatasetStore, df: pd.DataFrame | None = None) -> TrainingSet:
    """Every context of the store with a measured default, a stored profile and shaped links.

    Contexts measured on unshaped loopback (or not measured: nominal) are left out: their
    features describe links their numbers did not see. Built from a whole store (``df`` None), the
    set is cached (:mod:`autosync.cache`, keyed by the store's files and this code): every tune
    starts from the shipped one.
    """
    if df is None:
        import json

        from autosync import cache

        k = cache.key("training", cache.tree_hash(store.root))
        text = cache.read_text("training", k)
        if text is not None:
            try:
                return _from_json(json.loads(text))
            except (ValueError, KeyError, TypeError):
                pass
        data = _build(store, store.read(efficiency=False))
        cache.write_text("training", k, json.dumps(_to_json(data)))
        return data
    return _build(store, df)


def _to_json(data: TrainingSet) -> dict:
    return {"X": data.X.tolist(), "log_speedup": data.log_speedup.tolist(), "relevance": data.relevance.tolist(),
            "features": data.features, "frame": data.frame.to_dict("list"), "columns": list(data.frame.columns)}


def _from_json(d: dict) -> TrainingSet:
    frame = pd.DataFrame(d["frame"], columns=d["columns"]).astype({"relevance": np.int32})
    X = np.array(d["X"], dtype=np.float64).reshape(len(frame), len(d["features"]))
    return TrainingSet(X, np.array(d["log_speedup"], dtype=np.float64), np.array(d["relevance"], dtype=np.int32),
                       frame, list(d["features"]))


def _build(store: DatasetStore, df: pd.DataFrame) -> TrainingSet:
    sets = []
    for context_id, ctx in df.groupby("context_id", sort=True):
        raw = store.load_profile_dict(context_id)
        if raw is None:
            continue
        profile = Profile.from_dict(raw, str(store.profile_path(context_id)))
        if not profile.context.shaped:
            continue
        part = build_context(profile, ctx)
        if part is not None:
            sets.append(part)
    if not sets:
        raise ValueError("no context with a successful DDP-default measurement, shaped links and a stored profile")
    frame = pd.concat([t.frame for t in sets], ignore_index=True)
    return TrainingSet(np.vstack([t.X for t in sets]), np.concatenate([t.log_speedup for t in sets]),
                       frame.relevance.to_numpy(), frame, list(FEATURES))
