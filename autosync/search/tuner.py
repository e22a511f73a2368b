"""The tune pipeline: a few named stages, read top to bottom.

1. **start**: Optuna proposes a first round of candidates, the cost model scores them, and the
   hand-crafted baselines are scored beside them (:mod:`autosync.search.proposer`).
2. **references**: the DDP default and the best-predicted baseline (a lossless one out of
   distribution) are measured first; they count toward ``measure``.
3. **proposal rounds**: until ``measure`` trials have run, the models are refit on everything
   measured (by every worker of the shared study, :mod:`autosync.search.study`), the candidates
   are ordered by expected improvement, and the top-k diverse ones are measured.
4. **efficiency** (time-to-loss): the lossy finalists' statistical efficiency is measured.
5. **confirmation**: the best two and the default are re-measured, interleaved.
6. **recommendation** (:mod:`autosync.search.decide`): the best measured by the objective, never worse
   than the measured DDP default; with ``measure=0``, the cost model's pick.

Every choice comes from one :class:`~autosync.search.config.TuneConfig`. An interrupted tune resumes:
what its study or its dataset holds is not run again.
"""
from __future__ import annotations

import logging
import math
import time

import numpy as np

from autosync.datasets.store import DatasetStore
from autosync.models.ranker import CostModel
from autosync.profiler import Profile
from autosync.search.baselines import baselines
from autosync.search.config import TuneConfig
from autosync.search.decide import confirm, predict_efficiency, recommend, settle_efficiency
from autosync.search.proposer import Proposer, pick_diverse
from autosync.search.result import Measured, TuneResult
from autosync.search.study import SharedStudy
from autosync.search.trials import Journal, measure_strategy, trial_row
from autosync.strategy import Strategy, loads_strategy

log = logging.getLogger(__name__)


def tune(profile: Profile, model: CostModel, config: TuneConfig, store: DatasetStore, pool=None,
         base=None, efficiency_model=None, noise_scale: float = float("nan"), meter=None,
         intervals_card: dict | None = None, workload=None, recovered: list[tuple[str, Strategy]] = (),
         on_measured=None, on_progress=None) -> TuneResult:
    """Run the stages for ``profile``'s context; ``pool`` (its ranks) is needed when ``config.measure > 0``.

    ``base``: the training set the models start from (the shipped dataset); ``efficiency_model`` and
    ``noise_scale``: predicted efficiencies; ``meter``: an :class:`~autosync.efficiency.meter.EfficiencyMeter`
    that measures the lossy finalists' (time-to-loss); ``intervals_card``
    (:func:`autosync.models.uncertainty.load_card`, with the shipped regressor): calibrated intervals, the
    acquisition by expected improvement, the context's distance from the dataset and its out-of-distribution
    flags; ``workload``: the workload object when it is not a built-in name; ``recovered``: (source, strategy)
    of trials a job died in (:class:`~autosync.search.trials.Journal`), reported with the rest.
    """
    if config.measure > 0 and pool is None:
        raise ValueError("measuring needs a rank pool")
    run = TuneRun(profile, model, config, store, pool, base, efficiency_model, noise_scale, meter, intervals_card,
                  workload, on_measured, on_progress)
    return run.run(recovered)


class TuneRun:
    """One tune of one context by this worker: the stages as methods."""

    def __init__(self, profile, model, config: TuneConfig, store, pool, base, efficiency_model, noise_scale, meter,
                 intervals_card, workload, on_measured, on_progress):
        self.profile, self.config, self.store, self.pool = profile, config, store, pool
        self.meter, self.workload, self.on_measured, self.on_progress = meter, workload, on_measured, on_progress
        self.study = SharedStudy(f"autosync|{profile.context_id}|{'lossless' if config.lossless else 'any'}",
                                 config.storage)
        self.study.describe(profile, config.objective)
        self.proposer = Proposer(profile, model, base, store, self.study, config, efficiency_model, noise_scale,
                                 intervals_card)
        self.hand = {n: s for n, s in baselines(profile).items() if s.is_lossless or not config.lossless}
        self.base_scores: dict[str, float] = {}
        self.measured: list[Measured] = []        # this worker's
        self.stored = _stored(store, profile)
        self.measure_time = 0.0

    def run(self, recovered=()) -> TuneResult:
        t0 = time.monotonic()
        self.start()
        if self.config.measure > 0:
            self.references(recovered)
            self.proposal_rounds()
            self.study.wait_for_default(self.config.settings.timeout_s + 30)
        else:
            self.record_predictions()
        measured = self.measured + self.peers()
        predict_efficiency(self.proposer, measured)
        if self.config.measure > 0 and self.config.objective == "time-to-loss":
            self.timed(settle_efficiency, measured, self.meter, self.config.finalists, self.on_progress)
        if self.config.measure > 0 and self.config.confirm_rounds > 0:
            self.timed(confirm, measured, self.config.objective, self.config.confirm_rounds, self.measure_again,
                       self.on_progress)
        return self.recommendation(measured, time.monotonic() - t0)

    # --- the stages --------------------------------------------------------------------------------
    def start(self) -> None:
        """The first round of candidates, and the baselines scored beside them."""
        proposer = self.proposer
        proposer.propose(self.config.candidates)
        for strategy in self.hand.values():
            proposer.scored.setdefault(strategy.hash, (float("nan"), strategy))
        if self.config.measure > 0 and self.study.measurements():
            proposer.refit()   # a study other workers already measured in: start from what they found
        self.base_scores = dict(zip(self.hand, proposer.score(list(self.hand.values()))))
        for name, strategy in self.hand.items():
            proposer.scored[strategy.hash] = (float(self.base_scores[name]), strategy)

    def references(self, recovered=()) -> None:
        """The DDP default, any trial a job died in, and the best-predicted baseline (lossless when the context
        is out of distribution)."""
        self.measure("ddp_default", Strategy.default())
        for source, strategy in recovered:   # a trial the job died in, stored as failed on restart
            self.measure(source, strategy)
        best = max(((n, s) for n, s in self.hand.items() if n != "ddp_default"
                    and (s.is_lossless or not self.proposer.ood)),
                   key=lambda t: self.base_scores[t[0]], default=None)
        if best and self.config.measure > 1:
            self.measure(*best)

    def proposal_rounds(self) -> None:
        """Refit, order by expected improvement, measure the top-k diverse; until ``measure`` trials have run."""
        proposer, config = self.proposer, self.config
        rounds = 0
        while len(self.measured) < config.measure and rounds < 4 * config.measure:
            rounds += 1
            proposer.refit()   # on everything measured so far, by every worker of the study
            done = {m.strategy.hash for m in self.measured} | self.study.busy_hashes()
            k = min(config.per_round, config.measure - len(self.measured))
            order = proposer.acquisition(self.measured_best())
            picks = pick_diverse(order, k, done, config.min_distance,
                                 [m.strategy for m in self.measured if m.source == "tune"])
            if not picks:
                picks = pick_diverse(order, k, done, 0.0)
            if not picks and not proposer.propose(max(50, config.candidates // 5)):
                break
            for _, strategy in picks:
                self.measure("tune", strategy)
            proposer.propose(max(50, config.candidates // 5))

    def record_predictions(self) -> None:
        """``measure=0``: the top predictions, diverse, go to the study (for Optuna's dashboard)."""
        for score, strategy in pick_diverse(self.proposer.ranked(), self.config.per_round, set(),
                                            self.config.min_distance):
            self.study.record(strategy, float(score), "predicted")

    def recommendation(self, measured: list[Measured], seconds: float) -> TuneResult:
        result = recommend(self.proposer, measured, self.hand, self.config.zero_shot)
        result.nearest, result.ood = self.proposer.nearest, self.proposer.ood
        self.study.annotate(self.measured, result)
        result.objective = self.config.objective
        result.confirm_rounds = self.config.confirm_rounds if self.config.measure > 0 else 0
        result.candidates_scored = len(self.proposer.scored)
        result.search_seconds = seconds - self.measure_time
        result.peer_measurements_seen = self.proposer.peer_measurements_seen
        return result

    # --- measuring ---------------------------------------------------------------------------------
    def measure(self, source: str, strategy: Strategy) -> bool:
        """Measure ``strategy`` unless another worker has it; True when this run measured (or had stored) it."""
        if any(m.strategy.hash == strategy.hash for m in self.measured):
            return True   # e.g. a recovered trial that is also the best baseline
        predicted, interval = self.proposer.predicted(strategy), self.proposer.interval(strategy)
        if strategy.hash in self.stored:
            row = self.stored[strategy.hash]
            m = Measured(source, strategy, predicted, row["status"], row["samples_per_s"], row["reason"],
                         predicted_interval=interval, sent_bytes_per_step=_number(row.get("sent_bytes_per_step")))
            if strategy.hash not in self.study.busy_hashes():  # the study learns what this dataset already knew
                self.study.record(strategy, row["samples_per_s"] if row["status"] == "ok" else None, "measured",
                                  source=source, samples_per_s=row["samples_per_s"], status=row["status"],
                                  reason=row["reason"])
        else:
            claim = self.study.claim(strategy, source, self.proposer.peer_measurements_seen)
            if claim is None:
                log.info("%s %s is measured by another worker", source, strategy.hash)
                return False
            r = self.timed(measure_strategy, self.pool, self.profile, strategy, self.config.settings, self.workload,
                           store=self.store, source=source)
            self.store.append([trial_row(self.profile, strategy, source, r)])
            Journal(self.store).end()
            m = Measured(source, strategy, predicted, r.status, r.samples_per_s, r.reason, predicted_interval=interval,
                         sent_bytes_per_step=r.sent_bytes_per_step)
            self.study.finish(claim, r, self.reference() if source != "ddp_default" else r.samples_per_s)
        self.measured.append(m)
        if self.on_measured:
            self.on_measured(m)
        return True

    def measure_again(self, strategy: Strategy):
        """One more trial of ``strategy`` (confirmation rounds); not stored."""
        return measure_strategy(self.pool, self.profile, strategy, self.config.settings, self.workload)

    def timed(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)``, its time counted as measuring (not as the search's overhead)."""
        t = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            self.measure_time += time.monotonic() - t

    def reference(self) -> float | None:
        """The DDP default's samples/s: this run's, else any worker's (one study query, only then)."""
        own = next((m.samples_per_s for m in self.measured if m.source == "ddp_default" and m.status == "ok"), None)
        return own if own is not None else next((r["samples_per_s"] for r in self.study.measurements()
                                                 if r["source"] == "ddp_default" and r["status"] == "ok"), None)

    def measured_best(self) -> float | None:
        """log of the best measured speedup over the DDP default (goodput with the predicted efficiency for
        time-to-loss), the level expected improvement is counted from."""
        ref = self.reference()
        ok = [m for m in self.measured if m.status == "ok" and m.samples_per_s]
        if not ref or not ok:
            return None
        eff = (self.proposer.predicted_efficiency([m.strategy for m in ok])
               if self.config.objective == "time-to-loss" else np.ones(len(ok)))
        return max(math.log(m.samples_per_s * max(e, 0.05) / ref) for m, e in zip(ok, eff))

    def peers(self) -> list[Measured]:
        """What other workers of the shared study measured (that this run did not)."""
        if self.config.measure == 0:
            return []
        mine = {m.strategy.hash for m in self.measured}
        out = []
        for r in self.study.measurements():
            if r["strategy_hash"] not in mine:
                s = loads_strategy(r["strategy"])
                out.append(Measured(r["source"], s, self.proposer.predicted(s), r["status"], r["samples_per_s"],
                                    r["reason"], worker=r["worker"]))
        return out


def _number(x) -> float | None:
    """A stored number, None where it is null or NaN (not measured)."""
    return None if x is None or x != x else float(x)


def _stored(store: DatasetStore, profile: Profile) -> dict[str, dict]:
    df = store.read(efficiency=False)
    df = df[df.context_id == profile.context_id]
    return {r["strategy_hash"]: r for r in df.to_dict("records")}
