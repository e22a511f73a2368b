"""What the throughput cost model does not know: calibrated intervals, and how far a context is from the data.

**Interval** (normalized conformal prediction over leave-one-workload-out folds). With ``mu(x)`` the
regressor's log speedup over the DDP default, trained on every row, and K fold regressors, fold k
trained without workload k::

    s(x)     = sqrt(std_k mu_k(x) ** 2 + floor ** 2)     how much the prediction depends on which
                                                          workloads it learned from (floor: run-to-run noise)
    interval = exp(mu(x) -+ q s(x))                       as speedups over the DDP default

``q`` is calibrated so that a workload the models never saw is covered at ``level`` (0.8): every
successful row i of a dataset workload g is scored as a new workload would be,
``r_i = |y_i - mu_{-g}(x_i)| / s_{-g}(x_i)``, where ``mu_{-g}`` is trained without g and ``s_{-g}`` is the
spread of the models trained without g and each other workload; ``q`` is the ``ceil(level (n + 1))``-th
smallest ``r`` (split conformal's finite-sample rule; its guarantee assumes exchangeable workloads, which
six of them only approximate: hence the measured coverage in the card). Rows of the context being
tuned join every fold, so the fold models agree where it was measured and its intervals narrow with
each refit.

Evaluated the same way, nested (the held-out workload is never in the calibration), against three
alternatives: LightGBM quantile regressors (alpha 0.1 and 0.9), a constant-width conformal interval
(``mu -+ q``) and the fold ensemble read as a Gaussian (``mu -+ 1.2816 s``, uncalibrated). See
:func:`evaluate`; ``bench/transfer.py`` writes the figures to the card and ``bench/results/transfer.md``.

**Distance** of a context from the dataset: its context features (:data:`CONTEXT_KEYS`) standardized by
the dataset's contexts, Euclidean distance to each dataset context. :func:`ood_reasons` flags a context
timed on a device, or on a cluster shape (hosts x ranks per host), the dataset never saw, or one farther
from every dataset context than ``ood_distance`` (the largest distance at which a dataset workload,
held out, still finds a context of another workload; new workloads are usually that far).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from autosync.models.features import CONTEXT_FEATURES
from autosync.models.ranker import PARAMS, CostModel

LEVEL = 0.8
FLOOR = 0.02          # log units: repeated runs of one strategy differ by ~2% (autosync.models.transfer.NOISE)
Z80 = 1.2815515655446004
CONTEXT_KEYS = CONTEXT_FEATURES + ["min_speed", "straggler_load", "device_gpu"]
CARD = Path(__file__).parent / "pretrained" / "interval" / "card.json"
METHODS = ("normalized", "constant", "quantile", "gaussian")


def conformal_quantile(scores: np.ndarray, level: float) -> float:
    """The ``ceil(level (n + 1))``-th smallest score (infinite when there are too few)."""
    scores = np.sort(np.asarray(scores, dtype=float))
    k = math.ceil(level * (len(scores) + 1))
    return float(scores[k - 1]) if 0 < k <= len(scores) else float("inf")


class _Fits:
    """Regressors on one training set without some of its workloads, fitted once per set of exclusions (and
    cached on disk by their training rows, :mod:`autosync.cache`, unless some rows are ``keep``: a tune's)."""

    def __init__(self, data, seed: int = 0, keep: np.ndarray | None = None):
        self.data, self.seed = data, seed
        self.workload = data.frame.workload.to_numpy()
        self.keep = np.zeros(len(self.workload), bool) if keep is None else keep
        self._models: dict[frozenset, CostModel] = {}

    def without(self, excluded) -> CostModel:
        key = frozenset(excluded)
        if key not in self._models:
            rows = self.keep | ~np.isin(self.workload, list(key))
            d = self.data.subset(rows)
            self._models[key] = _fit_cached(d, self.seed) if not self.keep.any() else \
                CostModel("regressor", list(d.features)).fit(d.X, d.log_speedup, d.relevance, d.groups(), self.seed)
        return self._models[key]

    def quantiles(self, excluded, alphas=(0.1, 0.9)) -> list:
        import lightgbm as lgb

        rows = self.keep | ~np.isin(self.workload, list(excluded))
        params = {k: v for k, v in PARAMS["regressor"].items() if k != "objective"}
        return [lgb.LGBMRegressor(objective="quantile", alpha=a, random_state=self.seed, **params)
                .fit(self.data.X[rows], self.data.log_speedup[rows]).booster_ for a in alphas]


def _fit_cached(d, seed: int) -> CostModel:
    import hashlib

    import lightgbm as lgb

    from autosync import cache

    digest = hashlib.sha256(d.X.tobytes() + d.log_speedup.tobytes() + "|".join(d.features).encode()).hexdigest()
    k = cache.key("fold", digest, seed, json.dumps(PARAMS["regressor"], sort_keys=True))
    text = cache.read_text("folds", k)
    if text is not None:
        try:
            booster = lgb.Booster(model_str=text)
            if booster.feature_name() == list(d.features):
                return CostModel("regressor", list(d.features), booster)
        except lgb.basic.LightGBMError:
            pass
    model = CostModel("regressor", list(d.features)).fit(d.X, d.log_speedup, d.relevance, d.groups(), seed)
    cache.write_text("folds", k, model.booster.model_to_string())
    return model


def spread(preds: list[np.ndarray], floor: float = FLOOR) -> np.ndarray:
    return np.sqrt(np.std(np.vstack(preds), axis=0) ** 2 + floor ** 2)


@dataclass
class IntervalModel:
    """The point regressor, its fold regressors and the calibrated ``q``: :meth:`bounds` gives log-speedup
    intervals. Fitted afresh from a training set (the shipped dataset at the start of a tune; plus the tuned
    context's measurements at each refit); ``q`` comes from the card."""

    point: CostModel
    folds: list[CostModel]
    q: float
    level: float = LEVEL
    floor: float = FLOOR

    @classmethod
    def fit(cls, data, q: float, level: float = LEVEL, seed: int = 0, keep: np.ndarray | None = None,
            floor: float = FLOOR) -> "IntervalModel":
        """``keep``: rows in every fold (the tuned context's own measurements)."""
        fits = _Fits(data, seed, keep)
        groups = sorted(set(fits.workload[~fits.keep]))
        return cls(fits.without(()), [fits.without({g}) for g in groups], q, level, floor)

    def bounds(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(mu, lo, hi) in log speedup over the DDP default, per row of X (the point model's features)."""
        mu = self.point.predict(X)
        if not self.folds:
            return mu, mu - self.q * self.floor, mu + self.q * self.floor
        s = spread([f.predict(X) for f in self.folds], self.floor)
        return mu, mu - self.q * s, mu + self.q * s


def calibrate(data, level: float = LEVEL, seed: int = 0, fits: _Fits | None = None,
              held_out: str | None = None) -> dict:
    """``q`` of each conformal method from the rows of ``data`` (leaving ``held_out`` out of everything)."""
    fits = fits or _Fits(data, seed)
    outer = {held_out} if held_out else set()
    groups = sorted(set(fits.workload) - outer)
    ok = data.frame.ok.to_numpy()
    norm, const = [], []
    for g in groups:
        rows = (fits.workload == g) & ok
        if not rows.any():
            continue
        X, y = data.X[rows], data.log_speedup[rows]
        mu = fits.without(outer | {g}).predict(X)
        others = [fits.without(outer | {g, h}).predict(X) for h in groups if h != g]
        s = spread(others) if others else np.full(len(y), FLOOR)
        norm.append(np.abs(y - mu) / s)
        const.append(np.abs(y - mu))
    return {"normalized": conformal_quantile(np.concatenate(norm), level),
            "constant": conformal_quantile(np.concatenate(const), level)}


def evaluate(data, level: float = LEVEL, seed: int = 0) -> dict:
    """Leave one workload out, nested: per method, the held-out rows' coverage of the ``level`` interval and
    its median width (hi / lo as speedups), per workload and over all successful rows; and, per held-out
    context, the measured speedup of the best-scored strategy by point and by lower bound relative to the
    context's best (what ``--measure 0`` would have picked among the strategies the dataset measured)."""
    from autosync.models.transfer import context_metrics

    fits = _Fits(data, seed)
    ok = data.frame.ok.to_numpy()
    workloads = sorted(set(fits.workload))
    per_row, picks = [], []
    for w in workloads:
        test = (fits.workload == w)
        q = calibrate(data, level, seed, fits, held_out=w)
        X, y = data.X[test], data.log_speedup[test]
        mu = fits.without({w}).predict(X)
        s = spread([fits.without({w, g}).predict(X) for g in workloads if g != w])
        lo_q, hi_q = (b.predict(X, num_threads=1) for b in fits.quantiles({w}))
        lo_q, hi_q = np.minimum(lo_q, hi_q), np.maximum(lo_q, hi_q)
        intervals = {"normalized": (mu - q["normalized"] * s, mu + q["normalized"] * s),
                     "constant": (mu - q["constant"], mu + q["constant"]),
                     "quantile": (lo_q, hi_q), "gaussian": (mu - Z80 * s, mu + Z80 * s)}
        frame = data.frame[test]
        for method, (lo, hi) in intervals.items():
            for i in np.flatnonzero(ok[test]):
                per_row.append({"method": method, "workload": w, "context_id": frame.context_id.iloc[i],
                                "covered": bool(lo[i] <= y[i] <= hi[i]), "width": float(math.exp(hi[i] - lo[i])),
                                "above": bool(y[i] > hi[i])})
        lo = intervals["normalized"][0]
        for ctx, idx in frame.reset_index(drop=True).groupby("context_id").indices.items():
            if len(idx) < 3:
                continue
            sp = np.exp(y[idx])
            best = sp.max()
            picks.append({"workload": w, "context_id": ctx, "cluster": frame.cluster.iloc[idx[0]],
                          "point": float(sp[np.argmax(mu[idx])] / best), "lower": float(sp[np.argmax(lo[idx])] / best),
                          "pairwise_point": context_metrics(mu[idx], sp)["pairwise"]})
    rows, picks = pd.DataFrame(per_row), pd.DataFrame(picks)
    out = {"level": level, "rows": int(ok.sum()), "workloads": workloads, "methods": {}}
    for method in METHODS:
        r = rows[rows.method == method]
        out["methods"][method] = {
            "coverage": float(r.covered.mean()), "median_width": float(r.width.median()),
            "share_above": float(r.above.mean()),
            "per_workload": {w: {"coverage": float(g.covered.mean()), "median_width": float(g.width.median()),
                                 "rows": int(len(g))} for w, g in r.groupby("workload")}}
    out["zero_shot_offline"] = {
        "contexts": int(len(picks)),
        "point": {"median": float(picks.point.median()), "worst": float(picks.point.min()),
                  "mean": float(picks.point.mean())},
        "lower": {"median": float(picks.lower.median()), "worst": float(picks.lower.min()),
                  "mean": float(picks.lower.mean())},
        "per_context": picks.to_dict("records")}
    return out


# --- distance from the dataset ------------------------------------------------------------------------------

def context_vector(features: dict) -> np.ndarray:
    return np.array([float(features.get(k, 0.0)) for k in CONTEXT_KEYS])


def reference(data) -> dict:
    """The dataset's contexts as standardized points, and the out-of-distribution distance."""
    frame = data.frame
    first = frame.groupby("context_id", sort=True).head(1).index.to_numpy()
    raw = np.zeros((len(first), len(CONTEXT_KEYS)))
    for j, k in enumerate(CONTEXT_KEYS):
        if k in data.features:
            raw[:, j] = data.X[first, data.features.index(k)]
    center, scale = raw.mean(axis=0), raw.std(axis=0)
    scale[scale < 1e-9] = 1.0
    z = (raw - center) / scale
    workloads = frame.workload.to_numpy()[first]
    held = []
    for w in sorted(set(workloads)):
        mine, other = z[workloads == w], z[workloads != w]
        held.append(float(np.linalg.norm(mine[:, None, :] - other[None, :, :], axis=2).min(axis=1).max()))
    devices = sorted({"cuda" if v else "cpu" for v in raw[:, CONTEXT_KEYS.index("device_gpu")]})
    shapes = sorted({f"{int(n)}x{int(r)}" for n, r in zip(raw[:, CONTEXT_KEYS.index("nodes")],
                                                          raw[:, CONTEXT_KEYS.index("ranks_per_node")])})
    return {"keys": CONTEXT_KEYS, "center": center.tolist(), "scale": scale.tolist(),
            "points": [{"workload": w, "cluster": c, "z": p.round(4).tolist()}
                       for w, c, p in zip(workloads, frame.cluster.to_numpy()[first], z)],
            "held_out_distance": dict(zip(sorted(set(workloads)), held)),
            "ood_distance": float(max(held)), "devices": devices, "shapes": shapes}


def nearest(ref: dict, features: dict, k: int = 3) -> list[tuple[float, str, str]]:
    """The ``k`` nearest dataset contexts: (distance, workload, cluster)."""
    z = (context_vector(features) - np.array(ref["center"])) / np.array(ref["scale"])
    d = [(float(np.linalg.norm(z - np.array(p["z"]))), p["workload"], p["cluster"]) for p in ref["points"]]
    return sorted(d)[:k]


def ood_reasons(ref: dict, features: dict) -> list[str]:
    """Why a context (its ``featurize`` dict) lies outside what the dataset covers; empty when it does not."""
    out = []
    device = "cuda" if features.get("device_gpu") else "cpu"
    if device not in ref["devices"]:
        out.append(f"timed on {device}; every dataset context was timed on {', '.join(ref['devices'])}")
    shape = f"{int(features['nodes'])}x{int(features['ranks_per_node'])}"
    if shape not in ref["shapes"]:
        out.append(f"cluster shape {shape} (hosts x ranks per host) is not in the dataset "
                   f"({', '.join(ref['shapes'])})")
    near = nearest(ref, features, 1)
    if near and near[0][0] > ref["ood_distance"]:
        d, w, c = near[0]
        out.append(f"distance {d:.1f} to the nearest dataset context ({w} on {c}) is beyond {ref['ood_distance']:.1f}, "
                   "the farthest any dataset workload lies from the others")
    return out


# --- the card --------------------------------------------------------------------------------------------------

def _card(data, level: float, seed: int) -> dict:
    """What a tune reads from a card: ``q`` calibrated on ``data`` and its distance reference."""
    q = calibrate(data, level, seed)
    return {"kind": "interval", "method": "normalized", "level": level, "floor": FLOOR, "q": q["normalized"],
            "q_constant": q["constant"], "data_hash": data.data_hash, "rows": int(len(data.frame)),
            "reference": reference(data)}


def card_without(data, workload: str, level: float = LEVEL, seed: int = 0) -> dict:
    """The card :func:`write_card` would have written had ``data`` held no row of ``workload``.

    A benchmark that holds a workload out of the cost models must hold it out of the card too: the shipped card's
    ``q`` was calibrated with that workload's rows, and its distance reference holds that workload's contexts, so
    a tune of it could never be out of distribution. Not written anywhere; the fold regressors it fits are cached
    on disk (:mod:`autosync.cache`), so building it again for the same data is quick.
    """
    held = data.subset(data.frame.workload.to_numpy() != workload)
    return {**_card(held, level, seed), "held_out": workload}


def write_card(data, path=CARD, level: float = LEVEL, seed: int = 0, evaluation: dict | None = None) -> dict:
    """Calibrate ``q`` on ``data`` (the shipped training set), evaluate leave one workload out, and write the card
    that tunes read (``q``, the distance reference) with the figures."""
    card = {**_card(data, level, seed),
            "fitted": "point and fold regressors afresh at the start of each tune from the shipped dataset "
                      "(autosync.models.uncertainty.IntervalModel.fit); q from this card",
            "held_out_workload": evaluation if evaluation is not None else evaluate(data, level, seed)}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(card, indent=1))
    os.replace(tmp, path)
    return card


def load_card(path=CARD) -> dict | None:
    try:
        card = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return card if card.get("kind") == "interval" and "q" in card and "reference" in card else None

