"""What a tune found: every measured strategy (:class:`Measured`) and the recommendation (:class:`TuneResult`)."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from autosync.models.uncertainty import LEVEL
from autosync.strategy import Strategy


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
    efficiency_raw: float | None = None   # measured: the mean of the seed pairs' n_ref / n_cand
    efficiency_band: float | None = None  # measured: its relative band (efficiency protocol 4)
    efficiency_pairs: int = 1             # measured: seed pairs trained
    within_noise: bool = False            # measured: |raw - 1| <= band (information; the efficiency is not set to 1)
    efficiency_source: str = "lossless"   # lossless | measured | predicted | flat (reference too flat) | failed
    repeats: list[float] = field(default_factory=list)   # samples/s of the interleaved confirmation rounds
    predicted_interval: tuple[float, float] | None = None  # the cost model's 80% interval (speedups), when it has one
    sent_bytes_per_step: float | None = None   # per rank, to other hosts, measured on emulated hosts (else None)

    @property
    def lossy(self) -> bool:
        return not self.strategy.is_lossless

    @property
    def confirmed_samples_per_s(self) -> float:
        """The median of the confirmation rounds (with the first measurement), else the first measurement."""
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
    objective: str = ""                # the tune's (TuneConfig.objective), set by the tune
    why: str = ""                      # one line when the fastest-per-step strategy is not the pick
    confirm_rounds: int = 0
    interval: tuple[float, float] | None = None   # the pick's predicted interval (speedups; goodput for time-to-loss)
    level: float = LEVEL
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
