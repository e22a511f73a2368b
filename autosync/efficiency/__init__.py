"""Statistical efficiency: what a lossy strategy costs in convergence, measured.

Throughput says how many samples a strategy processes per second; statistical efficiency
says how much each sample is worth. Time to a target loss is their product::

    efficiency      = n_ref(L*) / n_cand(L*)          samples to reach the target loss L*
    time-to-target speedup = throughput speedup x efficiency     (goodput, as in Pollux)

**Paired training.** The reference (the DDP default, lossless) and the candidate train on
the same ranks (loopback, :class:`~autosync.executor.launch.RankPool` with the candidate's
world size and hosts) from the same initial weights (``seed``), the same data order (each
rank draws batches from its own generator seeded by ``seed`` and its rank) and the same
learning rate, for ``horizon`` steps. Every ``eval_every`` steps the *consensus* model (the
ranks' parameters averaged; identical to every rank's under BSP, the model local SGD would
deploy) is evaluated on a fixed held-out set (its own seed, never trained on); the loss is
the mean over it.

**The target.** L* = the reference's evaluation loss at 3/4 of the horizon (the mean of its
seeds' curves, each smoothed by a 3-point moving average). ``n(L*)`` is the first crossing of
a curve, interpolated linearly between evaluations. A candidate that has not reached L* by the
horizon trains on, step for step as before, until its curve has crossed L* (confirmed by the
next evaluation) or ``EXTEND`` horizons have passed; only a candidate that never reaches L*
within them has efficiency 0 (measured), with the loss it reached stored. The resolution is
therefore 0 or >= 3 / (4 EXTEND) = 0.375. (Protocol 2 stopped every candidate at the horizon,
so a candidate 0.6 as efficient read 0; such censored rows are measured again.) Signals and
the final-loss ratio are taken over the horizon only, whatever the extension.

**Noise, and an efficiency that resolves.** Candidate seed s is paired with reference seed s (same
initial weights, data order and held-out set); each pair gives a ratio ``r_s = n_ref,s(L*) / n_cand,s(L*)``
and the raw efficiency is their mean. The reference seeds' relative spread of ``n(L*)`` (``h``, from
``REFERENCE_SEEDS`` >= 2 seeds, against seed 0) is what one pair's ratio may be off by; with m pairs the
band is ``max(h, spread of the r_s) / sqrt(m)``, and every result carries ``raw * (1 -+ band)``. While the
band is wider than ``BAND_LIMIT`` (0.15), another pair is trained (reference seed and candidate seed m),
up to ``MAX_PAIRS`` (4). The efficiency that decides is the raw ratio where the band resolved it, and the
band's lower bound where it stayed wide (:func:`decide`): never a 1.0 that noise made up. ``within_noise``
(``|raw - 1| <= band``) is kept as information. A candidate that never reaches L* (seed 0) has efficiency 0
and gets no further pairs; a later seed that never reaches it counts 0 in the mean (and widens the band).
**Modes that drift** (a sync mode's ``min_pairs``: local SGD, DiLoCo, adaptive, selective) pair at least 2 seeds
whatever the band: their ranks' models drift apart between averages, and whether they stall depends on the seed
(vit-tiny's local SGD reached L* in one seed and never in the other, bench/results/lossy_window_applied.md),
which the reference seeds' spread cannot show. A stored row of such a mode with fewer pairs (protocols 1-4) keeps its
seed-0 curve and is extended by the missing seeds (:func:`short_of_pairs`, :meth:`EfficiencyMeter.measure`).
(Protocol 3 paired one seed and reported 1.0 for any raw ratio within
``1 +- h``; its rows whose band was within ``BAND_LIMIT`` measured what protocol 4 measures and are
reused; the others are measured again, with more pairs.) The final evaluation-loss ratio (candidate /
reference, seed 0's last evaluation) has its own band from the reference's seeds.

**Signals** (cheap, recorded at every evaluation step, averaged over the horizon): the
relative error of the applied gradient against the exact mean of the ranks' gradients
(``||g_applied - g_mean|| / ||g_mean||``: the compression error of a compressor; under local
SGD, the deviation of the host-local gradient), the error-feedback residual norm, the
local-SGD drift ``sqrt(mean_i ||theta_i - theta_bar||^2) / ||theta_bar||`` just after the step
(eval steps fall at every phase of a period), and the gradient noise scale
``B_simple = tr(Sigma) / |G|^2`` (McCandlish et al. 2018, Appendix A, the unbiased two-batch
estimator AdaptDL uses, from per-rank gradients of batch B and their mean of batch W B).

**Asynchronous modes** (asp): their efficiency depends on timing (how far behind each push is),
so it is meaningful only on the cluster itself. There (``CurveSpec.timed``, which the meter sets
for them once it has the cluster's ranks, and which ``stop_at`` implies) they train in windows of
wall-clock time (the first ``eval_every`` steps long), each rank at its own pace, and a curve's
step count is the ranks' total steps / W: a fast host's extra, staler steps count, as they would
in a real run. Untimed (the loopback meter, key ``|on:loopback``), they train step for step like
the others, the ranks kept in lockstep by the per-step loss reduction: an approximation, and the
key says so. (Protocol 1 trained them step for step on the cluster too; such rows are not reused.)

A reference whose evaluation loss falls less than ``FLAT_DROP`` (2%) of its start by L*
cannot rank anything: its candidates are stored with status ``flat`` and no efficiency.
The protocol trains with Adam, the optimizer most users train these models with, at the workload's
learning rate (``lr_of``: 1e-3, bert-mini 1e-4); a stored row of another learning rate is not reused.

Limits: a short horizon favours long sync periods and early gaps may overstate or understate
final ones; efficiency is measured at one learning rate and optimizer.
"""
from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# the keys of efficiency rows and the protocol's learning rate have their homes there; named here as the protocol's
from autosync.context import LOOPBACK, reference_key  # noqa: F401
from autosync.context import efficiency_key as key  # noqa: F401
from autosync.context import efficiency_place as place
from autosync.workloads import DEFAULT_LR, lr_of  # noqa: F401

REFERENCE_SEEDS = 2
TARGET_AT = 0.75                 # L* = the reference's evaluation loss at this share of the horizon
EVAL_SAMPLES = 512               # held-out samples, split over the ranks
EVAL_SEED = 2_147_483_000        # the held-out set's generator seed: no training generator uses it
DEFAULT_HORIZON = 240
DEFAULT_EVAL_EVERY = 20
FLAT_DROP = 0.02                 # a reference whose loss falls less than this share by L* cannot rank anything
EXTEND = 2                       # a candidate short of L* at the horizon trains on, up to this many horizons
BAND_LIMIT = 0.15                # a band wider than this is narrowed by more seed pairs, up to MAX_PAIRS
MAX_PAIRS = 4
PROTOCOL = 5                     # bump when the measurement changes: stored results of another protocol are not reused
#                                  (2: asynchronous modes train on the cluster in timed windows; 3: a candidate short of
#                                  L* at the horizon trains on, up to EXTEND horizons; 4: more pairs while the band is
#                                  wide; 5: modes that drift pair at least min_pairs seeds; see reusable())



@dataclass(frozen=True)
class CurveSpec:
    """One training run of the efficiency protocol."""

    workload: Any                 # a name or a workloads.InMemory
    strategy: dict                # canonical dict
    batch_size: int
    horizon: int = DEFAULT_HORIZON
    eval_every: int = DEFAULT_EVAL_EVERY
    seed: int = 0
    lr: float = DEFAULT_LR
    optimizer: str = "adam"
    signals: bool = True
    stop_at: float | None = None      # timed mode: stop once the smoothed evaluation loss has reached this
    timed: bool = False               # timed mode without a stop (implied by stop_at): asp in wall-clock windows
    max_train_s: float | None = None  # timed mode: give up after this much training time
    goal: float | None = None         # not reached by the horizon: train on until the smoothed evaluation loss has
    extend_to: int | None = None      # crossed ``goal`` (confirmed by the next evaluation), at most ``extend_to`` steps


@dataclass
class Curve:
    steps: list[int]
    eval_loss: list[float]
    train_loss: list[float]                         # mean over ranks, every step (rank 0's own in timed mode)
    signals: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    train_s: list[float] = field(default_factory=list)   # training time (evaluations excluded) at each evaluation

    def time_to(self, target: float) -> float | None:
        """Training seconds until the smoothed evaluation loss first reaches ``target`` (interpolated between
        evaluations); None if it never did. Needs ``train_s`` (timed mode)."""
        n = steps_to(self.steps, self.eval_loss, target)
        return None if n is None else float(np.interp(n, self.steps, self.train_s))


# --- the arithmetic ----------------------------------------------------------------------------

def smooth(values: list[float]) -> list[float]:
    """Centred 3-point moving average (2 points at the ends)."""
    v = list(values)
    return [statistics.fmean(v[max(0, i - 1):i + 2]) for i in range(len(v))]


def loss_at(steps: list[int], losses: list[float], step: float) -> float:
    return float(np.interp(step, steps, losses))


def steps_to(steps: list[int], losses: list[float], target: float) -> float | None:
    """The first step at which the (smoothed) curve reaches ``target``, interpolated; None if never."""
    s = smooth(losses)
    for i in range(1, len(s)):
        if s[i] <= target:
            a, b = s[i - 1], s[i]
            frac = 1.0 if a == b else (a - target) / (a - b)
            return steps[i - 1] + min(max(frac, 0.0), 1.0) * (steps[i] - steps[i - 1])
    return None


def steps_by(steps: list[int], losses: list[float], target: float, horizon: float) -> float | None:
    """:func:`steps_to` of the curve up to ``horizon`` (what a run stopped there would read)."""
    n = sum(1 for s in steps if s <= horizon)
    return steps_to(steps[:n], losses[:n], target)


def decide(raw: float, band: float) -> float:
    """The efficiency that ranks a candidate: its raw ratio where the band resolved it (``band <= BAND_LIMIT``),
    else the band's lower bound ``raw * (1 - band)``."""
    return raw if band <= BAND_LIMIT else max(0.0, raw * (1 - band))


@dataclass
class Efficiency:
    """The outcome of a paired comparison (see the module docstring)."""

    efficiency: float           # what decides: :func:`decide` of raw and band, 0 when L* was never reached
    raw: float                  # the mean of the pairs' n_ref / n_cand (0 when never reached)
    band: float                 # max(h, spread of the pairs' ratios) / sqrt(pairs)
    within_noise: bool          # |raw - 1| <= band (information only)
    target_loss: float
    reached_loss: float         # the candidate's lowest smoothed evaluation loss
    steps_ref: float
    steps_cand: float | None
    final_loss_ratio: float     # candidate's last evaluation loss / the reference's (seed 0)
    final_loss_band: float      # the reference seeds' relative spread of the last evaluation loss
    ratios: list[float] = field(default_factory=list)   # each pair's n_ref,s / n_cand,s

    @property
    def pairs(self) -> int:
        return max(1, len(self.ratios))


    @property
    def lo(self) -> float:
        return self.raw * (1 - self.band)

    @property
    def hi(self) -> float:
        return self.raw * (1 + self.band)


def target(references: list[Curve], horizon: int) -> float:
    """L*: from the first ``REFERENCE_SEEDS`` reference seeds (more seeds, measured to narrow a band, leave it)."""
    mean = np.mean([smooth(c.eval_loss) for c in references[:REFERENCE_SEEDS]], axis=0)
    return loss_at(references[0].steps, list(mean), TARGET_AT * horizon)


def _steps_of(candidate: Curve, goal: float, horizon: int) -> float | None:
    n = steps_by(candidate.steps, candidate.eval_loss, goal, horizon)
    return n if n is not None else steps_to(candidate.steps, candidate.eval_loss, goal)


def compare(references: list[Curve], candidates, horizon: int) -> Efficiency:
    """Efficiency of the candidate's seeds ``candidates`` (a Curve or a list; seed s paired with ``references[s]``)
    against the reference seeds. Each candidate curve is read up to ``horizon`` first (as every protocol has);
    only when it did not reach L* there, the part trained on past the horizon (``EXTEND``) counts. The final-loss
    ratio is seed 0's at the horizon."""
    candidates = [candidates] if isinstance(candidates, Curve) else list(candidates)
    if len(references) < max(REFERENCE_SEEDS, len(candidates)):
        raise ValueError("the noise band needs at least 2 reference seeds, and one per candidate seed")
    goal = target(references, horizon)
    ref_steps = [steps_to(c.steps, c.eval_loss, goal) or float(horizon) for c in references]
    n0 = ref_steps[0]
    h = max(abs(1 - n / n0) for n in ref_steps[1:])
    finals = [c.eval_loss[-1] for c in references]
    final_band = max(abs(1 - f / finals[0]) for f in finals[1:])
    steps = [_steps_of(c, goal, horizon) for c in candidates]
    ratios = [ref_steps[i] / max(n, 1e-9) if n is not None else 0.0 for i, n in enumerate(steps)]
    raw = float(np.mean(ratios))
    spread = max(abs(r / raw - 1) for r in ratios) if raw > 0 and len(ratios) > 1 else 0.0
    band = max(h, spread) / math.sqrt(len(ratios))
    reached = steps[0] is not None and raw > 0
    within = reached and abs(raw - 1) <= band
    within_h = sum(1 for s in candidates[0].steps if s <= horizon)
    return Efficiency(decide(raw, band) if reached else 0.0, raw if reached else 0.0, band, within, goal,
                      min(smooth(candidates[0].eval_loss)), n0, steps[0],
                      candidates[0].eval_loss[within_h - 1] / finals[0], final_band, ratios)


def reusable(row: dict) -> bool:
    """Whether a stored row was measured by this protocol, or by an older one that measured the same. Protocol 5
    only trains more pairs for modes that drift (its rows of other modes are protocol 4's; a protocol-4 row of such a
    mode is reused and extended, :func:`short_of_pairs`). Protocol 4
    changed how noise decides (pairs while the band is wide, no 1.0 made up): a protocol-3 row that reached L*
    with a band within BAND_LIMIT is what protocol 4 measures with one pair (its efficiency decided again by
    :func:`decide`, see :func:`as_protocol`). Protocol 3 changed only candidates that had not reached L* by the
    horizon (older rows that never reached it are measured again), protocol 2 only asynchronous modes on a
    cluster (protocol-1 rows measured there are not reused)."""
    proto = row.get("protocol")
    if proto in (PROTOCOL, 4):     # 5 only adds seed pairs to modes that drift: the meter extends such rows
        return True                # (short_of_pairs), keeping the pairs they have
    if row.get("status") == "ok" and row.get("efficiency_raw") == 0:
        return proto == 3          # never reached L*: protocol 3 trained on as 4 does; older ones stopped early
    if row.get("status") == "ok" and row.get("lossy_key") != "lossless" and (row.get("band") or 0.0) > BAND_LIMIT:
        return False               # a band protocol 4 narrows with more pairs
    return proto in (2, 3) or (proto == 1 and place(row["efficiency_key"]) in (None, LOOPBACK))


def pairs_of(row: dict) -> int:
    """The seed pairs a stored row measured (rows older than protocol 4 paired one)."""
    pairs = row.get("pairs")
    return 1 if pairs is None or pairs != pairs else int(pairs)


def short_of_pairs(row: dict) -> bool:
    """Whether a stored row reached L* with fewer seed pairs than its sync mode's ``min_pairs`` (protocol 5): the
    meter extends it by the missing seeds. A row that never reached L* (efficiency 0) is not short: it gets no
    further pairs."""
    if row.get("status") != "ok" or not row.get("efficiency_raw") or not row.get("curve"):
        return False
    from autosync.strategy import Strategy

    return pairs_of(row) < Strategy.from_dict(json.loads(row["strategy"])).sync.kind.min_pairs


def as_protocol(row: dict) -> dict:
    """A reusable stored row with its efficiency decided by this protocol (:func:`decide`)."""
    if row.get("status") == "ok" and row.get("protocol") != PROTOCOL and row.get("lossy_key") != "lossless" \
            and row.get("efficiency_raw"):
        row = {**row, "efficiency": decide(row["efficiency_raw"], row.get("band") or 0.0)}
    return row


def is_flat(start: float, goal: float) -> bool:
    """Whether references that start at ``start`` and reach L* = ``goal`` fall too little to rank anything."""
    return start - goal < FLAT_DROP * abs(start)



# --- measuring and storing ---------------------------------------------------------------------

def efficiency_row(ekey: str, workload: str, batch: int, world: int, ranks_per_host: int, strategy,
                   spec: CurveSpec, curve: Curve | None, eff: Efficiency | None, status: str = "ok",
                   reason: str = "") -> dict:
    import torch

    sig = curve.signals if curve else {}
    row = {"efficiency_key": ekey, "workload": workload, "batch_size": batch, "world_size": world,
           "ranks_per_host": ranks_per_host, "lossy_key": strategy.lossy_key(), "strategy": strategy.to_json(),
           "status": status, "reason": reason[:500], "horizon": spec.horizon, "eval_every": spec.eval_every,
           "seed": spec.seed, "lr": spec.lr, "optimizer": spec.optimizer, "protocol": PROTOCOL,
           "curve": json.dumps({"steps": curve.steps, "eval_loss": curve.eval_loss}) if curve else "",
           "final_eval_loss": curve.eval_loss[-1] if curve else float("nan"),
           "grad_error": sig.get("grad_error", float("nan")), "ef_norm": sig.get("ef_norm", float("nan")),
           "local_drift": sig.get("local_drift", float("nan")),
           "grad_noise_scale": sig.get("grad_noise_scale", float("nan")),
           "wall_s": curve.wall_s if curve else 0.0, "torch_version": torch.__version__, "timestamp": time.time()}
    if eff is not None:
        row.update(efficiency=eff.efficiency, efficiency_raw=eff.raw, efficiency_lo=eff.lo, efficiency_hi=eff.hi,
                   band=eff.band, within_noise=eff.within_noise, pairs=eff.pairs,
                   pair_ratios=json.dumps([round(r, 6) for r in eff.ratios]), target_loss=eff.target_loss,
                   reached_loss=eff.reached_loss, steps_ref=eff.steps_ref,
                   steps_cand=eff.steps_cand if eff.steps_cand is not None else float("nan"),
                   final_loss_ratio=eff.final_loss_ratio, final_loss_band=eff.final_loss_band)
    return row


def _curve_of(row: dict) -> Curve:
    c = json.loads(row["curve"])
    return Curve(c["steps"], c["eval_loss"], [], {k: row[k] for k in ("grad_error", "ef_norm", "local_drift",
                                                                     "grad_noise_scale")}, row["wall_s"])


