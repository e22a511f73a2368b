"""Proposing: Optuna asks, the cost model scores, and the best candidates are picked for measuring.

Each round, Optuna's TPE asks for candidates; the cost model scores them all in one batch (predicted
log speedup over the DDP default, plus the log of the predicted statistical efficiency for time-to-loss)
and the scores are told back, so TPE moves toward what the model believes is fast. Candidates are ordered
for measuring by expected improvement over the measured best (with calibrated intervals) or by score,
then taken greedily, skipping any within ``min_distance`` of one already taken (:func:`distance`: the
share of differing choices), so one round measures different ideas, not five variants of one. After
each round the models are refit on the shipped data plus every measurement of this context, by every
worker of the shared study (active learning).
"""
from __future__ import annotations

import math

import numpy as np
import optuna
import pandas as pd

from autosync.errors import UserError
from autosync.models import training, uncertainty
from autosync.models.features import feature_matrix, featurize
from autosync.models.ranker import CostModel
from autosync.profiler import Profile
from autosync.search.config import TuneConfig
from autosync.search.space import suggest
from autosync.search.study import SharedStudy
from autosync import plans as registry
from autosync.strategy import Strategy, table_fields


def signature(strategy: Strategy) -> tuple:
    """The choices of a strategy, for the distance between two: bucket size, sharding, the sync mode and every
    field any mode takes, and per group its plan and compressor with every field any plan or compressor takes (a
    field the choice does not take reads as its ``unused`` value), so a new entry's fields count without a line
    here."""
    sync_fields, plan_fields = table_fields(registry.SYNC_MODES), table_fields(registry.PLANS)
    comp_fields = table_fields(registry.COMPRESSORS)
    groups = [(g.plan, *(getattr(g, f) for f in plan_fields), g.compressor.name,
               *(getattr(g.compressor, f) for f in comp_fields)) for g in strategy.groups]
    return (strategy.fusion.bucket_cap_mb, strategy.optimizer_sharding, strategy.sync.mode,
            *(getattr(strategy.sync, f) for f in sync_fields), len(groups), *groups)


def distance(a: Strategy, b: Strategy) -> float:
    sa, sb = signature(a), signature(b)
    n = max(len(sa), len(sb))
    return sum(1 for i in range(n) if i >= len(sa) or i >= len(sb) or sa[i] != sb[i]) / n


def pick_diverse(ranked: list[tuple[float, Strategy]], k: int, exclude: set[str], min_distance: float,
                 taken: list[Strategy] | None = None) -> list[tuple[float, Strategy]]:
    out: list[tuple[float, Strategy]] = []
    chosen = list(taken or [])
    for score, s in ranked:
        if len(out) >= k:
            break
        if s.hash in exclude or any(distance(s, c) < min_distance for c in chosen):
            continue
        out.append((score, s))
        chosen.append(s)
    return out


def predicted_speedup(model: CostModel, score: float) -> float:
    """A score as a speedup over the DDP default (the regressor's scores are log speedups; a ranker's are not)."""
    return math.exp(score) if model.kind == "regressor" else float("nan")


class Proposer:
    """Candidates of one context, scored by the cost model.

    An in-memory Optuna study is where TPE proposes (thousands of ask/tell a run: a database round trip
    each would dominate); ``scored`` maps every candidate's hash to (score, strategy); ``bounds`` holds the
    interval bounds of the scored ones, when the model has intervals.
    """

    def __init__(self, profile: Profile, model: CostModel, base: "training.TrainingSet | None", store,
                 study: SharedStudy, config: TuneConfig, efficiency_model=None, noise_scale: float = float("nan"),
                 intervals_card: dict | None = None):
        self.profile, self.model, self.base, self.store, self.shared = profile, model, base, store, study
        self.config, self.objective, self.lossless, self.seed = config, config.objective, config.lossless, config.seed
        # Intervals (autosync.models.uncertainty): with the shipped regressor and its interval card, the point and
        # fold regressors are fitted afresh on ``base``; the point one replaces ``model`` (the same training rows).
        self.intervals: uncertainty.IntervalModel | None = None
        if intervals_card and base is not None and model.kind == "regressor":
            self.intervals = uncertainty.IntervalModel.fit(base, intervals_card["q"], intervals_card["level"],
                                                           config.seed)
            self.model = self.intervals.point
        self.bounds: dict[str, tuple[float, float]] = {}
        self.nearest, self.ood = [], []
        if intervals_card:
            ref, context = intervals_card["reference"], featurize(profile, Strategy.default())
            self.nearest, self.ood = uncertainty.nearest(ref, context), uncertainty.ood_reasons(ref, context)
        self.efficiency_model, self.noise_scale = efficiency_model, noise_scale
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(
            seed=config.seed, n_startup_trials=min(200, config.candidates // 2)))
        self.scored: dict[str, tuple[float, Strategy]] = {}
        self.peer_measurements_seen = 0

    def predict(self, strategies: list[Strategy]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(score, lo, hi): the cost model's scores and interval bounds (nan without intervals), remembered in
        ``bounds``; for time-to-loss plus log(predicted efficiency) (log goodput, with the regressor; with the
        ranker the sum is a heuristic)."""
        if not strategies:
            return np.array([]), np.array([]), np.array([])
        X = feature_matrix([featurize(self.profile, s) for s in strategies], self.model.features)
        if self.intervals is not None:
            mu, lo, hi = self.intervals.bounds(X)
        else:
            mu = self.model.predict(X)
            lo = hi = np.full(len(mu), np.nan)
        if self.objective == "time-to-loss" and self.efficiency_model is not None:
            eff, e_lo, e_hi = self.efficiency_model.bounds(self.profile, strategies, self.noise_scale)
            mu, lo, hi = (mu + np.log(np.maximum(eff, 0.05)), lo + np.log(np.maximum(e_lo, 0.05)),
                          hi + np.log(np.maximum(e_hi, 0.05)))
        for s, a, b in zip(strategies, lo, hi):
            self.bounds[s.hash] = (float(a), float(b))
        return mu, lo, hi

    def score(self, strategies: list[Strategy]) -> np.ndarray:
        return self.predict(strategies)[0]

    def interval(self, strategy: Strategy) -> tuple[float, float] | None:
        """The predicted interval of a scored strategy as speedups (goodput for time-to-loss), or None."""
        lo, hi = self.bounds.get(strategy.hash, (float("nan"), float("nan")))
        return None if math.isnan(lo) else (math.exp(lo), math.exp(hi))

    def acquisition(self, best: float | None) -> list[tuple[float, Strategy]]:
        """Candidates ordered for measuring. With intervals and a measured best (log speedup over the DDP
        default, goodput for time-to-loss): by expected improvement over it, reading the interval as a normal
        distribution of the log speedup, ``sigma = (hi - lo) / (2 z_0.9)``::

            EI = sigma (z Phi(z) + phi(z)),   z = (score - best) / sigma

        so a candidate whose interval reaches above the best can go before one with a higher point estimate
        and a narrow interval below it. Otherwise by score."""
        if self.intervals is None or best is None:
            return self.ranked()
        out = []
        for h, (mu, s) in self.scored.items():
            lo, hi = self.bounds.get(h, (float("nan"), float("nan")))
            if math.isnan(mu) or math.isnan(lo):
                continue
            sigma = max((hi - lo) / (2 * uncertainty.Z80), 1e-6)
            z = (mu - best) / sigma
            ei = sigma * (z * 0.5 * (1 + math.erf(z / math.sqrt(2))) + math.exp(-z * z / 2) / math.sqrt(2 * math.pi))
            out.append((ei, s))
        return sorted(out, key=lambda t: -t[0])

    def predicted_efficiency(self, strategies: list[Strategy]) -> np.ndarray:
        if self.efficiency_model is None:
            return np.ones(len(strategies))
        return self.efficiency_model.score(self.profile, strategies, self.noise_scale)

    def propose(self, n: int) -> int:
        """Ask Optuna for n candidates, score them in one batch, tell the scores back."""
        trials, strategies = [], []
        for _ in range(n):
            trial = self.study.ask()
            try:
                strategy = suggest(trial, self.profile, self.lossless)
            except UserError:
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                continue
            trials.append(trial)
            strategies.append(strategy)
        scores = self.score(strategies) if strategies else np.array([])
        for trial, strategy, score in zip(trials, strategies, scores):
            self.study.tell(trial, float(score))
            self.scored.setdefault(strategy.hash, (float(score), strategy))
        return len(strategies)

    def ranked(self) -> list[tuple[float, Strategy]]:
        return sorted(self.scored.values(), key=lambda t: -t[0])

    def refit(self) -> None:
        """Refit on the base training set plus every measurement of this context: this worker's dataset and
        the shared study's trials of all workers (active learning)."""
        frames = [self.base] if self.base is not None else []
        rows = self.store.read(efficiency=False)
        rows = rows[rows.context_id == self.profile.context_id][["source", "strategy", "strategy_hash", "status",
                                                                  "samples_per_s"]]
        shared = pd.DataFrame(self.shared.measurements())
        if not shared.empty:
            mine = {r for r in rows.strategy_hash}
            self.peer_measurements_seen = int((~shared.strategy_hash.isin(mine)).sum())
            rows = pd.concat([rows, shared[rows.columns]], ignore_index=True)
        rows = rows.drop_duplicates("strategy_hash", keep="first")
        context = training.build_context(self.profile, rows)
        if context is not None:
            frames.append(context)
        if not frames:
            return
        data = training.TrainingSet.concat(frames)
        if self.intervals is not None:
            keep = (data.frame.context_id == self.profile.context_id).to_numpy()   # in every fold: see uncertainty
            self.intervals = uncertainty.IntervalModel.fit(data, self.intervals.q, self.intervals.level, self.seed,
                                                           keep)
            self.model = self.intervals.point
        else:
            self.model = CostModel(self.model.kind).fit(data.X, data.log_speedup, data.relevance, data.groups(),
                                                        self.seed)
        strategies = [s for _, s in self.scored.values()]
        for s, score in zip(strategies, self.score(strategies)):
            self.scored[s.hash] = (float(score), s)

    def predicted(self, strategy: Strategy) -> float:
        """The predicted speedup of a scored strategy (NaN when unscored or with a ranker)."""
        return predicted_speedup(self.model, self.scored.get(strategy.hash, (float("nan"),))[0])
