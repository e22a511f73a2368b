"""The guided tune loop: Optuna proposes, the cost model scores, real runs decide.

Round after round, until ``measure`` trials have run:

1. Optuna (TPE) asks for ``candidates`` strategies; the regressor scores them all in one
   batch (predicted log speedup over the DDP default) and the scores are told back, so TPE
   moves toward what the model believes is fast.
2. The best-scored candidates not yet measured are taken greedily, skipping any within
   ``min_distance`` of one already taken (distance = share of differing choices), so one
   round measures different ideas, not five variants of one.
3. They run on the (emulated) cluster's kept-alive ranks; every result is appended to the
   dataset, and the models are refit on the shipped data plus this context's measurements.

The DDP default and the best-predicted hand-crafted baseline are measured first, as
references; they count toward ``measure``. The recommendation is the fastest successful
measured strategy, and never one slower than the measured DDP default: when nothing beats
it, the default is recommended and the result says so. ``measure=0`` only predicts.

The measured trials *are* the shared Optuna study, in ``storage`` (a SQLite file by
default; any RDB URL, e.g. PostgreSQL, lets several workers share one search), under a
name derived from the context. Every worker on one study:

- **claims** a strategy before measuring it: a RUNNING trial carrying its hash, created
  in one insert; when two workers claim the same hash, the lower trial id keeps it and the
  other moves on, so a strategy measured or being measured by one worker is not measured
  by another (a claim left by a dead process on this host is released);
- **learns from all**: before each round the completed trials of every worker (strategy,
  samples/s, status) join the refit of the cost model, so each worker's proposals are
  conditioned on everything measured so far; the DDP default measured by one worker is
  the reference of all;
- **recommends from all**: the fastest measured strategy of the study.

Trial value = measured samples/s (FAIL for a failed trial); user attributes hold the
strategy, its hash, whether it is lossless, the speedup over the default when known and
the worker. An interrupted tune resumes: what its study or its dataset holds is not run
again.
"""
from __future__ import annotations

import logging
import math
import os
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import optuna

from autosync.datasets.store import DatasetStore
from autosync.efficiency import EXTEND
from autosync.errors import UserError
from autosync.executor.launch import pid_alive
from autosync.executor.launch import RankPool
from autosync.models import training, uncertainty
from autosync.models.features import feature_matrix, featurize
from autosync.models.ranker import CostModel
from autosync.profiler import Profile
from autosync.search.baselines import baselines
from autosync.search.space import suggest
from autosync.search.trials import Journal, TrialSettings, measure_strategy, trial_row
from autosync.strategy import Strategy, loads_strategy

log = logging.getLogger(__name__)


@dataclass
class Measured:
    source: str
    strategy: Strategy
    predicted_speedup: float
    status: str
    samples_per_s: float
    reason: str = ""
    worker: str = ""          # "" = measured by this run; else the worker of the shared study that did
    efficiency: float = 1.0   # statistical efficiency (1 for lossless strategies)
    efficiency_lo: float = 1.0
    efficiency_hi: float = 1.0
    efficiency_source: str = "lossless"   # lossless | measured | predicted | flat (reference too flat) | failed
    repeats: list[float] = field(default_factory=list)   # samples/s of the interleaved confirmation rounds
    predicted_interval: tuple[float, float] | None = None  # the cost model's 80% interval (speedups), when it has one

    @property
    def lossy(self) -> bool:
        return not self.strategy.is_lossless

    @property
    def confirmed_samples_per_s(self) -> float:
        """The median of the confirmation rounds (with the first measurement), else the first measurement."""
        import statistics

        return statistics.median([self.samples_per_s, *self.repeats]) if self.repeats else self.samples_per_s

    @property
    def spread(self) -> float:
        """(max - min) / median of this strategy's measurements (0 with one)."""
        vals = [self.samples_per_s, *self.repeats]
        return (max(vals) - min(vals)) / self.confirmed_samples_per_s if len(vals) > 1 else 0.0

    def value(self, objective: str, measured_only: bool = False) -> float:
        """What the objective ranks by: samples/s, or goodput (samples/s x efficiency) for time-to-loss.
        With ``measured_only``, a lossy strategy whose efficiency was not measured is worth 0 for time-to-loss
        (it cannot be recommended: its convergence cost is unknown)."""
        if self.status != "ok":
            return 0.0
        if objective != "time-to-loss":
            return self.confirmed_samples_per_s
        if self.efficiency_source in ("flat", "failed") or (measured_only and self.efficiency_source == "predicted"):
            return 0.0
        return self.confirmed_samples_per_s * self.efficiency


@dataclass
class TuneResult:
    strategy: Strategy
    source: str
    predicted_speedup: float
    measured: list[Measured] = field(default_factory=list)
    default_samples_per_s: float | None = None
    best_baseline: tuple[str, float] | None = None      # (name, samples/s) of the fastest measured baseline
    note: str = ""
    candidates_scored: int = 0
    search_seconds: float = 0.0
    peer_measurements_seen: int = 0   # measurements of other workers the last refit learned from
    objective: str = "throughput"
    why: str = ""                      # one line when the fastest-per-step strategy is not the pick
    confirm_rounds: int = 0
    interval: tuple[float, float] | None = None   # the pick's predicted interval (speedups; goodput for time-to-loss)
    level: float = uncertainty.LEVEL
    rule: str = ""                     # --measure 0: "lower bound" or "point estimate"
    alternative: tuple | None = None   # --measure 0: (rule, strategy, predicted, (lo, hi)) of the other rule's pick
    nearest: list = field(default_factory=list)   # (distance, workload, cluster) of the nearest dataset contexts
    ood: list[str] = field(default_factory=list)  # why the context lies outside the dataset (empty: it does not)

    @property
    def pick(self) -> "Measured | None":
        return next((m for m in self.measured if m.strategy.hash == self.strategy.hash and m.status == "ok"), None)

    @property
    def measured_samples_per_s(self) -> float | None:
        m = self.pick
        return m.confirmed_samples_per_s if m else None

    @property
    def default(self) -> "Measured | None":
        return next((m for m in self.measured if m.source == "ddp_default" and m.status == "ok"), None)

    def speedup(self, m: "Measured") -> float | None:
        """Throughput speedup of ``m`` over the DDP default (medians of the confirmation rounds when run)."""
        d = self.default
        if m.status != "ok" or d is None:
            return None
        return m.confirmed_samples_per_s / d.confirmed_samples_per_s

    def time_speedup(self, m: "Measured") -> float | None:
        """Time-to-target speedup over the DDP default: throughput speedup x efficiency."""
        sp = self.speedup(m)
        return sp * m.efficiency if sp is not None else None

    @property
    def speedup_over_default(self) -> float | None:
        m = self.pick
        return self.speedup(m) if m else None

    @property
    def speedup_over_best_baseline(self) -> float | None:
        mine = self.measured_samples_per_s
        return mine / self.best_baseline[1] if mine and self.best_baseline else None


def signature(strategy: Strategy) -> tuple:
    """The choices of a strategy, for the distance between two."""
    groups = [(g.plan, g.compressor.name, g.compressor.rank, g.compressor.ratio, g.partitions) for g in strategy.groups]
    return (strategy.fusion.bucket_cap_mb, strategy.sync.mode, strategy.sync.period, strategy.optimizer_sharding,
            len(groups), *groups)


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


class Tuner:
    """One tuning run for one context. See the module docstring.

    Two Optuna studies: an in-memory one where TPE proposes candidates scored by the cost
    model (thousands of ask/tell a run: a database round trip each would dominate), and
    the shared one in ``storage``, which holds the measured trials of every worker (and,
    with nothing measured, the top predictions).
    """

    def __init__(self, profile: Profile, model: CostModel, base: "training.TrainingSet | None", store: DatasetStore,
                 storage: str, lossless: bool = False, seed: int = 0, candidates: int = 500, per_round: int = 3,
                 min_distance: float = 0.25, settings: TrialSettings = TrialSettings(), objective: str = "throughput",
                 efficiency_model=None, noise_scale: float = float("nan"), intervals_card: dict | None = None):
        self.profile = profile
        self.model = model
        # Intervals (autosync.models.uncertainty): with the shipped regressor and its interval card, the point and
        # fold regressors are fitted afresh on ``base``; the point one replaces ``model`` (the same training rows).
        self.intervals: uncertainty.IntervalModel | None = None
        if intervals_card and base is not None and model.kind == "regressor":
            self.intervals = uncertainty.IntervalModel.fit(base, intervals_card["q"], intervals_card["level"], seed)
            self.model = self.intervals.point
        self.bounds: dict[str, tuple[float, float]] = {}
        self.nearest, self.ood = [], []
        if intervals_card:
            ref, context = intervals_card["reference"], featurize(profile, Strategy.default())
            self.nearest, self.ood = uncertainty.nearest(ref, context), uncertainty.ood_reasons(ref, context)
        self.objective = objective
        self.efficiency_model, self.noise_scale = efficiency_model, noise_scale
        self.base, self.store = base, store
        self.lossless = lossless
        self.candidates, self.per_round, self.min_distance = candidates, per_round, min_distance
        self.settings = settings
        self.seed = seed
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=min(200, candidates // 2)))
        self.study_name = f"autosync|{profile.context_id}|{'lossless' if lossless else 'any'}"
        self.shared = _open_shared(self.study_name, storage)
        _describe_study(self.shared, profile, objective, lossless)
        self.scored: dict[str, tuple[float, Strategy]] = {}
        self.peer_measurements_seen = 0

    # --- the shared study -------------------------------------------------------------------
    def record(self, strategy: Strategy, value: float | None, kind: str, **attrs) -> None:
        """Store one finished trial in the shared study (value None = failed)."""
        trial = optuna.trial.create_trial(
            state=optuna.trial.TrialState.COMPLETE if value is not None else optuna.trial.TrialState.FAIL,
            value=value, user_attrs=self._attrs(strategy, kind, **attrs))
        self.shared.add_trial(trial)

    def _attrs(self, strategy: Strategy, kind: str, **extra) -> dict:
        return {"strategy": strategy.to_json(), "hash": strategy.hash, "kind": kind, "summary": strategy.summary(),
                "yaml": strategy.to_yaml(), "lossless": strategy.is_lossless, "worker": self.worker, **extra}

    def _measured_trials(self) -> list[optuna.trial.FrozenTrial]:
        return [t for t in self.shared.get_trials(deepcopy=False) if t.user_attrs.get("kind") == "measured"]

    def claim(self, strategy: Strategy, source: str) -> optuna.trial.FrozenTrial | None:
        """Claim ``strategy`` for measurement; the claim's trial, or None when another worker has it."""
        token = secrets.token_hex(8)
        self.shared.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState.RUNNING, user_attrs=self._attrs(
                strategy, "measured", source=source, claim=token, peer_measurements_seen=self.peer_measurements_seen)))
        same = [t for t in self._measured_trials() if t.user_attrs.get("hash") == strategy.hash]
        mine = next(t for t in same if t.user_attrs.get("claim") == token)
        rivals = [t for t in same if t is not mine and not _stale(t)
                  and (t.state != optuna.trial.TrialState.RUNNING or t._trial_id < mine._trial_id)]
        if rivals:
            optuna.trial.Trial(self.shared, mine._trial_id).set_user_attr("kind", "yielded")
            self.shared.tell(mine.number, state=optuna.trial.TrialState.PRUNED)
            return None
        return mine

    def finish(self, claim: optuna.trial.FrozenTrial, result, reference: float | None) -> None:
        """Store the outcome of a claimed measurement."""
        number = claim.number
        handle = optuna.trial.Trial(self.shared, claim._trial_id)
        for key, value in (("samples_per_s", result.samples_per_s), ("status", result.status),
                           ("reason", result.reason[:500]),
                           ("speedup", result.samples_per_s / reference if result.ok and reference else None)):
            handle.set_user_attr(key, value)
        if result.ok:
            self.shared.tell(number, result.samples_per_s)
        else:
            self.shared.tell(number, state=optuna.trial.TrialState.FAIL)

    def annotate(self, measured: list, result) -> None:
        """What the end of a tune knows, as study attributes for Optuna's dashboard (a finished trial takes no new
        attributes): per measured strategy of this run its statistical efficiency and where it comes from, and the
        pick with its figures."""
        eff = dict(self.shared.user_attrs.get("efficiency", {}))
        for m in measured:
            if m.status == "ok":
                eff[m.strategy.hash] = f"{m.efficiency:.3f} ({m.efficiency_source})"
        pick = {"hash": result.strategy.hash, "source": result.source, "summary": result.strategy.summary(),
                "speedup_over_default": result.speedup_over_default, "worker": self.worker}
        try:
            self.shared.set_user_attr("efficiency", eff)
            self.shared.set_user_attr("pick", pick)
        except Exception:  # noqa: BLE001 - labels only
            pass

    def shared_measurements(self) -> list[dict]:
        """Every finished measurement in the shared study (all workers): source, strategy, status, samples/s."""
        out = []
        for t in self._measured_trials():
            if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL) and "status" in t.user_attrs:
                out.append({"source": t.user_attrs.get("source", "tune"), "strategy": t.user_attrs["strategy"],
                            "strategy_hash": t.user_attrs["hash"], "status": t.user_attrs["status"],
                            "samples_per_s": float(t.user_attrs.get("samples_per_s") or 0.0),
                            "reason": t.user_attrs.get("reason", ""), "worker": t.user_attrs.get("worker", "")})
        return out

    def busy_hashes(self) -> set[str]:
        """Hashes measured or being measured by any worker."""
        return {t.user_attrs.get("hash") for t in self._measured_trials()
                if t.state != optuna.trial.TrialState.PRUNED and not _stale(t)}

    # --- proposing ---------------------------------------------------------------------------
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

    # --- refitting -----------------------------------------------------------------------------
    def refit(self) -> None:
        """Refit on the base training set plus every measurement of this context: this worker's dataset and
        the shared study's trials of all workers (active learning)."""
        import pandas as pd

        frames = [self.base] if self.base is not None else []
        rows = self.store.read(efficiency=False)
        rows = rows[rows.context_id == self.profile.context_id][["source", "strategy", "strategy_hash", "status",
                                                                  "samples_per_s"]]
        shared = pd.DataFrame(self.shared_measurements())
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


def _stale(trial: optuna.trial.FrozenTrial) -> bool:
    """A RUNNING claim of a process on this host that is gone."""
    if trial.state != optuna.trial.TrialState.RUNNING:
        return False
    host, _, pid = str(trial.user_attrs.get("worker", "")).rpartition(":")
    return host == socket.gethostname() and pid.isdigit() and not pid_alive(int(pid))


def _with_storage(storage: str, open_: Callable, attempts: int = 5):
    """``open_()`` retried a few times, because workers starting together on an empty database race to create
    Optuna's tables (PostgreSQL then reports a unique violation); any other failure is one line (UserError)."""
    import random
    import time

    for attempt in range(attempts):
        try:
            return open_()
        except ImportError as e:
            raise UserError(f"cannot open Optuna storage {storage!r}: {e}") from None
        except Exception as e:  # noqa: BLE001 - SQLAlchemy/driver errors of many kinds
            if attempt + 1 < attempts and ("duplicate key" in str(e) or "already exists" in str(e)):
                time.sleep(0.2 + random.random())
                continue
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(f"cannot open Optuna storage {storage!r}: {first}") from None
    raise AssertionError("unreachable")


def check_storage(storage: str) -> None:
    """Open ``storage`` once before any long work (profiling, trials): a bad or unreachable URL is one line."""
    _with_storage(storage, lambda: optuna.storages.get_storage(storage))


def _open_shared(name: str, storage: str) -> optuna.Study:
    """The shared study (see :func:`_with_storage` for the retries)."""
    return _with_storage(storage, lambda: optuna.create_study(study_name=name, storage=storage, direction="maximize",
                                                              load_if_exists=True))


def _describe_study(study: optuna.Study, profile: Profile, objective: str, lossless: bool) -> None:
    """What Optuna's dashboard shows of the study: its context and objective, and the value's name (a trial's
    value is measured samples/s for ``kind: measured`` trials, the cost model's score for ``predicted`` ones)."""
    attrs = {"context": profile.context.label, "workload": profile.model.workload,
             "batch_per_rank": profile.model.batch_size, "cluster": profile.cluster.spec(),
             "network": profile.env.get("network", "emulated"), "objective": objective,
             "space": "lossless only" if lossless else "lossless and lossy",
             "values": "measured samples/s (kind=measured); cost-model score (kind=predicted)"}
    try:
        for k, v in attrs.items():
            if study.user_attrs.get(k) != v:
                study.set_user_attr(k, v)
        if study.metric_names != ["samples/s"]:
            import warnings

            with warnings.catch_warnings():      # experimental in Optuna 3.x and 4.x; what the dashboard reads
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names(["samples/s"])
    except Exception:  # noqa: BLE001 - labels only: a worker racing another on the same attribute is harmless
        pass


def _predicted_speedup(model: CostModel, score: float) -> float:
    return math.exp(score) if model.kind == "regressor" else float("nan")


OBJECTIVES = ("time-to-loss", "throughput", "lossless")


def tune(profile: Profile, model: CostModel, measure: int, store: DatasetStore, storage: str,
         pool: RankPool | None = None, base: "training.TrainingSet | None" = None, lossless: bool = False,
         seed: int = 0, candidates: int = 500, per_round: int = 3, settings: TrialSettings = TrialSettings(),
         on_measured=None, workload=None, objective: str | None = None, efficiency_model=None,
         noise_scale: float = float("nan"), meter=None, confirm_rounds: int = 0, finalists: int = 3,
         on_progress=None, recovered: list[tuple[str, Strategy]] = (), intervals_card: dict | None = None,
         zero_shot: str = "point") -> TuneResult:
    """Run the loop; ``pool`` is needed when ``measure > 0`` (``measure`` counts this worker's trials).

    ``objective``: ``time-to-loss`` (rank by goodput = samples/s x statistical efficiency; the lossy ones of
    the ``finalists`` best get their efficiency measured by ``meter``, an :class:`~autosync.efficiency.
    EfficiencyMeter`, before they can be recommended), ``throughput`` (samples/s) or ``lossless`` (samples/s,
    lossless strategies only). ``confirm_rounds`` > 0 re-measures the two best and the DDP default, interleaved,
    that many rounds, and recommends by medians (see :func:`_recommend` for the noise rule). ``recovered``:
    (source, strategy) of trials a job died in (:class:`~autosync.search.trials.Journal`), reported with the rest.

    ``intervals_card`` (:func:`autosync.models.uncertainty.load_card`, with the shipped regressor): calibrated
    intervals, the acquisition rule of the measured rounds (:meth:`Tuner.acquisition`), the distance of the
    context from the dataset and its out-of-distribution flags; an out-of-distribution context measures the
    best-predicted *lossless* baseline after the DDP default. ``zero_shot`` (``measure=0``): pick by the
    ``point`` estimate or by the interval's ``lower`` bound (see :func:`_zero_shot`).
    """
    import time

    objective = objective or ("lossless" if lossless else "throughput")
    if objective not in OBJECTIVES:
        raise UserError(f"objective {objective!r} is not one of {', '.join(OBJECTIVES)}")
    lossless = objective == "lossless"
    t0 = time.monotonic()
    measure_time = 0.0
    tuner = Tuner(profile, model, base, store, storage, lossless, seed, candidates, per_round,
                  settings=settings, objective=objective, efficiency_model=efficiency_model, noise_scale=noise_scale,
                  intervals_card=intervals_card)
    tuner.propose(candidates)
    hand = baselines(profile)
    if lossless:
        hand = {k: v for k, v in hand.items() if v.is_lossless}
    for name, strategy in hand.items():
        tuner.scored.setdefault(strategy.hash, (float("nan"), strategy))
    if measure > 0 and tuner.shared_measurements():
        tuner.refit()   # a study other workers already measured in: start from what they found
    base_scores = dict(zip(hand, tuner.score(list(hand.values()))))
    for name, strategy in hand.items():
        tuner.scored[strategy.hash] = (float(base_scores[name]), strategy)
    result_measured: list[Measured] = []
    stored = _stored(store, profile)

    def reference() -> float | None:
        """The DDP default's samples/s: this run's, else any worker's (one study query, only then)."""
        own = next((m.samples_per_s for m in result_measured if m.source == "ddp_default" and m.status == "ok"), None)
        return own if own is not None else next((r["samples_per_s"] for r in tuner.shared_measurements()
                                                 if r["source"] == "ddp_default" and r["status"] == "ok"), None)

    def run(source: str, strategy: Strategy) -> bool:
        """Measure ``strategy`` unless another worker has it; True when this run measured (or had stored) it."""
        nonlocal measure_time
        if any(m.strategy.hash == strategy.hash for m in result_measured):
            return True   # e.g. a recovered trial that is also the best baseline
        predicted = _predicted_speedup(tuner.model, tuner.scored.get(strategy.hash, (float("nan"),))[0])
        interval = tuner.interval(strategy)
        if strategy.hash in stored:
            row = stored[strategy.hash]
            m = Measured(source, strategy, predicted, row["status"], row["samples_per_s"], row["reason"],
                         predicted_interval=interval)
            if strategy.hash not in tuner.busy_hashes():  # the study learns what this dataset already knew
                tuner.record(strategy, row["samples_per_s"] if row["status"] == "ok" else None, "measured",
                             source=source, samples_per_s=row["samples_per_s"], status=row["status"],
                             reason=row["reason"])
        else:
            claim = tuner.claim(strategy, source)
            if claim is None:
                log.info("%s %s is measured by another worker", source, strategy.hash)
                return False
            t = time.monotonic()
            r = measure_strategy(pool, profile, strategy, settings, workload, store=store, source=source)
            measure_time += time.monotonic() - t
            store.append([trial_row(profile, strategy, source, r)])
            Journal(store).end()
            m = Measured(source, strategy, predicted, r.status, r.samples_per_s, r.reason, predicted_interval=interval)
            tuner.finish(claim, r, reference() if source != "ddp_default" else r.samples_per_s)
        result_measured.append(m)
        if on_measured:
            on_measured(m)
        return True

    def measured_best() -> float | None:
        """log of the best measured speedup over the DDP default (goodput with the predicted efficiency for
        time-to-loss), the level expected improvement is counted from."""
        ref = reference()
        ok = [m for m in result_measured if m.status == "ok" and m.samples_per_s]
        if not ref or not ok:
            return None
        eff = tuner.predicted_efficiency([m.strategy for m in ok]) if objective == "time-to-loss" else np.ones(len(ok))
        return max(math.log(m.samples_per_s * max(e, 0.05) / ref) for m, e in zip(ok, eff))

    if measure > 0:
        if pool is None:
            raise ValueError("measuring needs a rank pool")
        run("ddp_default", Strategy.default())
        for source, strategy in recovered:   # a trial the job died in, stored as failed on restart
            run(source, strategy)
        best_base = max(((n, s) for n, s in hand.items() if n != "ddp_default"
                         and (s.is_lossless or not tuner.ood)),        # out of distribution: a lossless one
                        key=lambda t: base_scores[t[0]], default=None)
        if best_base and measure > 1:
            run(best_base[0], best_base[1])
        rounds = 0
        while len(result_measured) < measure and rounds < 4 * measure:
            rounds += 1
            tuner.refit()   # on everything measured so far, by every worker of the study
            done = {m.strategy.hash for m in result_measured} | tuner.busy_hashes()
            k = min(per_round, measure - len(result_measured))
            order = tuner.acquisition(measured_best())
            picks = pick_diverse(order, k, done, tuner.min_distance,
                                 [m.strategy for m in result_measured if m.source == "tune"])
            if not picks:
                picks = pick_diverse(order, k, done, 0.0)
            if not picks and not tuner.propose(max(50, candidates // 5)):
                break
            for _, strategy in picks:
                run("tune", strategy)
            tuner.propose(max(50, candidates // 5))
        _wait_for_default(tuner, settings.timeout_s + 30)
    if measure == 0:
        for score, strategy in pick_diverse(tuner.ranked(), per_round, set(), tuner.min_distance):
            tuner.record(strategy, float(score), "predicted")
    mine = {m.strategy.hash for m in result_measured}
    peers = [Measured(r["source"], loads_strategy(r["strategy"]),
                      _predicted_speedup(tuner.model, tuner.scored.get(r["strategy_hash"], (float("nan"),))[0]),
                      r["status"], r["samples_per_s"], r["reason"], worker=r["worker"])
             for r in tuner.shared_measurements() if r["strategy_hash"] not in mine] if measure > 0 else []
    measured = result_measured + peers
    _predict_efficiency(tuner, measured)
    if measure > 0 and objective == "time-to-loss":
        t = time.monotonic()
        settle_efficiency(measured, meter, finalists, on_progress)
        measure_time += time.monotonic() - t
    if measure > 0 and confirm_rounds > 0:
        t = time.monotonic()
        confirm(measured, objective, confirm_rounds, lambda s: measure_strategy(pool, profile, s, settings, workload),
                 on_progress)
        measure_time += time.monotonic() - t
    result = _recommend(tuner, measured, hand, zero_shot)
    result.nearest, result.ood = tuner.nearest, tuner.ood
    tuner.annotate(result_measured, result)
    result.objective, result.confirm_rounds = objective, confirm_rounds if measure > 0 else 0
    result.candidates_scored = len(tuner.scored)
    result.search_seconds = time.monotonic() - t0 - measure_time
    result.peer_measurements_seen = tuner.peer_measurements_seen
    return result


def _wait_for_default(tuner: Tuner, timeout: float) -> None:
    """When another worker is measuring the DDP default (the reference of every speedup), wait for it."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = [t for t in tuner._measured_trials() if t.user_attrs.get("source") == "ddp_default"
                   and t.state == optuna.trial.TrialState.RUNNING and not _stale(t)]
        if not running:
            return
        time.sleep(1.0)


def _stored(store: DatasetStore, profile: Profile) -> dict[str, dict]:
    df = store.read(efficiency=False)
    df = df[df.context_id == profile.context_id]
    return {r["strategy_hash"]: r for r in df.to_dict("records")}


def _predict_efficiency(tuner: Tuner, measured: list[Measured]) -> None:
    lossy = [m for m in measured if m.lossy]
    for m, eff in zip(lossy, tuner.predicted_efficiency([m.strategy for m in lossy])):
        m.efficiency = m.efficiency_lo = m.efficiency_hi = float(eff)
        m.efficiency_source = "predicted"


def apply_efficiency(m: Measured, row: dict) -> None:
    """Copy a measured efficiency row (:class:`~autosync.efficiency.EfficiencyMeter`) onto ``m``."""
    if row["status"] == "ok":
        m.efficiency, m.efficiency_lo, m.efficiency_hi = row["efficiency"], row["efficiency_lo"], row["efficiency_hi"]
        m.efficiency_source = "measured"
    else:
        m.efficiency_source = "flat" if row["status"] == "flat" else "failed"
        m.reason = m.reason or f"efficiency {row['status']}: {row.get('reason', '')}"[:300]


def settle_efficiency(measured: list[Measured], meter, k: int, on_progress=None) -> None:
    """Measure the efficiency of the lossy strategies among the ``k`` best by goodput (predicted efficiency for
    the rest), again until the ``k`` best have measured (or unmeasurable) efficiencies."""
    if meter is None:
        return
    for m in measured:          # what is stored already (this or an earlier tune, the shipped table) costs nothing
        if m.lossy and m.efficiency_source == "predicted":
            row = meter.stored(m.strategy)
            if row is not None:
                apply_efficiency(m, row)
    for _ in range(2 * k):
        ranked = sorted((m for m in measured if m.status == "ok"), key=lambda m: -m.value("time-to-loss"))
        todo = [m for m in ranked[:k] if m.lossy and m.efficiency_source == "predicted"]
        if not todo:
            return
        m = todo[0]
        if on_progress:
            on_progress(f"measuring the efficiency of lossy finalist {m.strategy.hash}")
        row = meter.measure(m.strategy)
        for other in measured:   # every measurement of the same lossy choices shares it
            if other.lossy and other.strategy.lossy_key() == m.strategy.lossy_key():
                apply_efficiency(other, row)


def confirm(measured: list[Measured], objective: str, rounds: int, run_one, on_progress=None, k: int = 2) -> None:
    """Re-measure the ``k`` best and the DDP default, interleaved (A B C A B C ...), ``rounds`` rounds."""
    ranked = sorted((m for m in measured if m.status == "ok" and m.value(objective, True) > 0),
                    key=lambda m: -m.value(objective, True))
    default = next((m for m in measured if m.source == "ddp_default" and m.status == "ok"), None)
    todo = [m for m in ranked if m is not default][:k] + ([default] if default else [])
    for r in range(rounds):
        for m in todo:
            if on_progress:
                on_progress(f"confirming: round {r + 1}/{rounds}, {m.source} {m.strategy.hash}")
            res = run_one(m.strategy)
            if res.ok:
                m.repeats.append(res.samples_per_s)


def _simpler(a: Measured, b: Measured) -> bool:
    """True when ``a`` is simpler than ``b``: lossless before lossy, then fewer groups."""
    return (a.lossy, len(a.strategy.groups)) < (b.lossy, len(b.strategy.groups))


def _describe(m: Measured, objective: str) -> str:
    eff = "" if not m.lossy else (f", efficiency {m.efficiency:.2f} ({m.efficiency_source})"
                                   if m.efficiency_source in ("measured", "predicted") else
                                   f", efficiency not measurable ({m.efficiency_source})")
    return f"{m.source} {m.strategy.hash} ({m.confirmed_samples_per_s:,.1f} samples/s{eff})"


def _recommend(tuner: Tuner, measured: list[Measured], base: dict[str, Strategy],
               zero_shot: str = "point") -> TuneResult:
    """The best measured strategy by the objective (goodput for time-to-loss: a lossy strategy needs a measured
    efficiency), never one worse than the measured DDP default. Noise rule: when both the winner and the
    runner-up were re-measured, the winner must beat it beyond the spread (its lowest goodput above the
    runner-up's highest), else the simpler of the two wins (lossless, then fewer groups)."""
    model = tuner.model
    objective = tuner.objective
    if not measured:
        return _zero_shot(tuner, zero_shot)
    ok = [m for m in measured if m.status == "ok"]
    default = next((m for m in measured if m.source == "ddp_default" and m.status == "ok"), None)
    base_hashes = {s.hash for n, s in base.items() if n != "ddp_default"}
    baselines_ok = [m for m in ok if m.strategy.hash in base_hashes]
    best_baseline = max(((m.source, m.confirmed_samples_per_s) for m in baselines_ok), key=lambda t: t[1],
                        default=None)
    default_sps = default.confirmed_samples_per_s if default else None
    eligible = sorted((m for m in ok if m.value(objective, True) > 0), key=lambda m: -m.value(objective, True))
    if not eligible:
        return TuneResult(Strategy.default(), "ddp_default", 1.0, measured, None, best_baseline,
                          note="every measured trial failed; recommending the DDP default", objective=objective)
    best = eligible[0]
    note, why = "", ""
    if len(eligible) > 1:
        runner = eligible[1]
        if best.repeats and runner.repeats:
            eff_b = best.value(objective, True) / best.confirmed_samples_per_s
            eff_r = runner.value(objective, True) / runner.confirmed_samples_per_s
            lo_best = min([best.samples_per_s, *best.repeats]) * eff_b
            hi_runner = max([runner.samples_per_s, *runner.repeats]) * eff_r
            if lo_best <= hi_runner and _simpler(runner, best):
                why = (f"{_describe(best, objective)} did not beat the simpler {_describe(runner, objective)} beyond "
                       f"the measured spread ({best.spread:.0%} / {runner.spread:.0%})")
                best = runner
    if default is not None and best.value(objective, True) <= default.value(objective, True):
        best = default
        note = "nothing measured beat the DDP default: recommending the default"
    fastest = max(ok, key=lambda m: m.confirmed_samples_per_s)
    if not why and fastest is not best:
        if objective == "time-to-loss" and fastest.lossy:
            if fastest.efficiency_source == "measured" and fastest.efficiency == 0:
                why = (f"the fastest per step, {_describe(fastest, objective)}, never reached the target loss within "
                       f"{EXTEND}x the efficiency horizon")
            elif fastest.efficiency_source == "measured":
                why = (f"the fastest per step, {_describe(fastest, objective)}, reaches the target loss "
                       f"{fastest.value(objective) / max(best.value(objective), 1e-9):.2f}x as soon as the pick "
                       f"(throughput x efficiency)")
            elif fastest.efficiency_source == "predicted":
                why = (f"the fastest per step, {_describe(fastest, objective)}, is lossy and its predicted goodput "
                       f"kept it out of the finalists whose efficiency was measured: unmeasured, it is not recommended")
            else:
                why = (f"the fastest per step, {_describe(fastest, objective)}, is lossy and its convergence cost "
                       f"could not be measured, so it is not recommended")
        elif objective == "lossless":
            why = f"the fastest per step is {_describe(fastest, objective)}"
    failed_default = next((m for m in measured if m.source == "ddp_default" and m.status != "ok"), None)
    if failed_default:
        reason = (failed_default.reason or "no reason given").splitlines()[0]
        note = (f"the DDP default {failed_default.status} ({reason}), so no speedup over it was measured; "
                f"check it with `autosync run`")
    return TuneResult(best.strategy, best.source, best.predicted_speedup, measured, default_sps, best_baseline,
                      note=note, objective=objective, why=why)


def _zero_shot(tuner: Tuner, rule: str) -> TuneResult:
    """--measure 0: the candidate with the best point estimate (``rule="point"``, the default) or with the best
    lower bound of its interval (``"lower"``: a confident prediction beats one with a wide interval). Held out
    (bench/results/zero_shot.md, 18 contexts, each pick / a measured tune of 8) the point estimate reached a
    median 0.98 and at worst 0.46, the lower bound 0.73 and 0.31, the lower bound only out of distribution 0.98
    and 0.43: the lower bound prefers candidates close to what the dataset knows, which are rarely the fast ones.
    The other rule's pick, when it differs, is reported as ``alternative``."""
    objective = tuner.objective
    ranked = tuner.ranked()
    picks = {"point": ranked[0]}
    if tuner.intervals is not None:
        lower = [(tuner.bounds[s.hash][0], sc, s) for sc, s in ranked if not math.isnan(sc)
                 and not math.isnan(tuner.bounds.get(s.hash, (float("nan"),))[0])]
        if lower:
            _, sc, st = max(lower, key=lambda t: (t[0], t[1]))
            picks["lower"] = (sc, st)
    rule = rule if rule in picks else "point"
    score, strategy = picks[rule]
    other = next((k for k in picks if k != rule), None)
    alternative = None
    if other and picks[other][1].hash != strategy.hash:
        o_score, o = picks[other]
        alternative = (other, o, _predicted_speedup(tuner.model, o_score), tuner.interval(o))
    pred = _predicted_speedup(tuner.model, score)
    note = "nothing was measured (--measure 0): this is the cost model's prediction only"
    if objective == "time-to-loss" and not strategy.is_lossless:
        note += f" (goodput: predicted speedup x predicted efficiency {tuner.predicted_efficiency([strategy])[0]:.2f})"
    return TuneResult(strategy, "predicted", pred, note=note, objective=objective, interval=tuner.interval(strategy),
                      level=tuner.intervals.level if tuner.intervals else uncertainty.LEVEL, rule=RULES[rule],
                      alternative=alternative)


RULES = {"point": "point estimate", "lower": "lower bound"}   # --zero-shot choices and how the output names them


def interval_text(interval: tuple[float, float] | None, level: float = uncertainty.LEVEL) -> str:
    return f"{level:.0%} interval {interval[0]:.2f}-{interval[1]:.2f}x" if interval else "no interval"


def uncertainty_lines(result: TuneResult) -> list[str]:
    """What the output and the strategy file say about the prediction's uncertainty: the pick's interval and
    rule, the other rule's pick when it differs, the nearest dataset contexts, and the
    out-of-distribution flags."""
    lines = []
    what = "goodput" if result.objective == "time-to-loss" else "speedup"
    if result.source == "predicted":
        if result.interval:
            lines.append(f"predicted {what} {result.predicted_speedup:.2f}x the DDP default, "
                         f"{interval_text(result.interval, result.level)} (calibrated leave one workload out); "
                         f"picked by the {result.rule}")
        if result.alternative:
            rule, other, pred, iv = result.alternative
            lines.append(f"by the {RULES[rule]} (--zero-shot {rule}) the pick would be {other.summary()} "
                         f"({other.hash}), predicted {pred:.2f}x with {interval_text(iv, result.level)}")
    if result.nearest:
        lines.append("nearest dataset contexts: " + ", ".join(f"{w} on {c} (distance {d:.1f})"
                                                           for d, w, c in result.nearest))
    for reason in result.ood:
        lines.append(f"OUT OF DISTRIBUTION: {reason}; predictions here are extrapolations"
                     + ("" if result.source == "predicted" else
                        ", so the best-predicted lossless baseline was measured after the DDP default"))
    return lines


def efficiency_text(m: Measured) -> str:
    """A measured strategy's efficiency as a person reads it: ``1 (lossless)``, ``0.88 [0.87-0.89] measured``."""
    if not m.lossy:
        return "1 (lossless)"
    if m.efficiency_source in ("flat", "failed"):
        return f"unknown ({'reference too flat' if m.efficiency_source == 'flat' else 'run failed'})"
    band = f" [{m.efficiency_lo:.2f}-{m.efficiency_hi:.2f}]" if m.efficiency_source == "measured" else ""
    return f"{m.efficiency:.2f}{band} {m.efficiency_source}"


def _efficiency_short(m: Measured) -> str:
    if not m.lossy:
        return "1 lossless"
    if m.efficiency_source in ("flat", "failed"):
        return "unknown"
    if m.efficiency_source == "predicted":
        return f"{m.efficiency:.2f} pred."
    return f"{m.efficiency:.2f} [{m.efficiency_lo:.2f}-{m.efficiency_hi:.2f}]"


def measured_rows(result: TuneResult) -> list[dict]:
    """One row per measured strategy: what the table and the strategy file show."""
    rows = []
    for m in result.measured:
        sp, tt = result.speedup(m), result.time_speedup(m)
        rows.append({"source": m.source, "hash": m.strategy.hash, "lossy": "lossy" if m.lossy else "lossless",
                     "status": m.status, "samples_per_s": m.confirmed_samples_per_s if m.status == "ok" else None,
                     "spread": m.spread if m.repeats else None, "rounds": 1 + len(m.repeats),
                     "speedup": sp, "efficiency": efficiency_text(m), "efficiency_short": _efficiency_short(m),
                     "time_speedup": tt if (not m.lossy or m.efficiency_source in ("measured", "predicted")) else None,
                     "time_speedup_predicted": m.lossy and m.efficiency_source == "predicted",
                     "worker": m.worker, "predicted_speedup": m.predicted_speedup,
                     "predicted_interval": m.predicted_interval, "reason": m.reason})
    return rows


def strategy_file_text(result: TuneResult, profile: Profile) -> str:
    """The recommended strategy as YAML, with what was predicted and measured as comments."""
    lines = [f"# autosync tune: {profile.model.workload} (batch {profile.model.batch_size}/rank) on {profile.cluster}",
             f"# objective: {result.objective}; source: {result.source}, strategy {result.strategy.hash}",
             f"# where: {profile.context.label}" + "".join(
                 f", {k} {profile.env[k]}" for k in ("device_name", "hosts", "ranks_per_host", "nccl")
                 if profile.env.get(k) is not None and profile.context.network == "real")]
    if not math.isnan(result.predicted_speedup):
        lines.append(f"# predicted speedup over the DDP default: {result.predicted_speedup:.2f}x")
    lines += [f"# {line}" for line in uncertainty_lines(result)]
    if result.measured_samples_per_s:
        lines.append(f"# measured: {result.measured_samples_per_s:,.1f} samples/s"
                     + (f" (median of {1 + len(result.pick.repeats)} interleaved measurements)"
                        if result.pick and result.pick.repeats else ""))
    if result.speedup_over_default:
        lines.append(f"# measured speedup over the DDP default: {result.speedup_over_default:.2f}x")
    if result.speedup_over_best_baseline and result.best_baseline:
        lines.append(f"# measured speedup over the best hand-crafted baseline ({result.best_baseline[0]}): "
                     f"{result.speedup_over_best_baseline:.2f}x")
    if result.pick and result.pick.lossy:
        tt = result.time_speedup(result.pick)
        lines.append(f"# LOSSY: statistical efficiency {efficiency_text(result.pick)}"
                     + (f"; time to the target loss {tt:.2f}x the DDP default's" if tt else ""))
    if result.why:
        lines.append(f"# why not the fastest per step: {result.why}")
    if result.note:
        lines.append(f"# note: {result.note}")
    rows = measured_rows(result)
    if rows:
        lines.append("# measured (speedup = throughput over the DDP default; time = speedup x efficiency, to the "
                     "target loss):")
        for r in rows:
            sp = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
            tt = ("never" if r["time_speedup"] == 0 else f"{r['time_speedup']:.2f}x") if r["time_speedup"] is not None else "-"
            spread = f" +-{r['spread'] / 2:.0%} over {r['rounds']}" if r["spread"] is not None else ""
            lines.append(f"#   {r['source']:<18} {r['hash']}  {r['lossy']:<8} {r['status']:<7} speedup {sp:>7}"
                         f"{spread}  efficiency {r['efficiency']}  time {tt}")
    lines.append(f"# lossless: {str(result.strategy.is_lossless).lower()}")
    return "\n".join(lines) + "\n" + result.strategy.to_yaml()


def plot_predicted_vs_measured(result: TuneResult, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(m.predicted_speedup, m.confirmed_samples_per_s / result.default_samples_per_s, m.source,
            m.predicted_interval) for m in result.measured if m.status == "ok" and result.default_samples_per_s]
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    for pred, meas, source, iv in pts:
        color = "tab:red" if source == "tune" else "tab:blue"
        if iv:   # the calibrated 80% interval of the prediction
            ax.plot(iv, [meas, meas], color=color, lw=1, alpha=0.5)
        ax.scatter(pred, meas, c=color, s=30)
        ax.annotate(source, (pred, meas), fontsize=7, xytext=(3, 3), textcoords="offset points")
    if pts:
        lo = min(min(p[0] for p in pts), min(p[1] for p in pts), *(p[3][0] for p in pts if p[3])) * 0.9
        hi = max(max(p[0] for p in pts), max(p[1] for p in pts), *(p[3][1] for p in pts if p[3])) * 1.1
        ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls="--")
    ax.set_xlabel("predicted speedup over DDP default (line: 80% interval)")
    ax.set_ylabel("measured speedup over DDP default")
    ax.set_title("autosync tune: predicted vs measured")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
