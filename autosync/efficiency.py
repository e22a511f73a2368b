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

**Noise.** The reference is trained from ``reference_seeds`` (>= 2) seeds; its seed-to-seed
relative spread of ``n(L*)`` is the band ``h``. The candidate is paired with seed 0; a raw
efficiency within ``1 +- h`` counts as 1.0 (``within_noise``), and every result carries
``raw * (1 -+ h)`` as its band. The final evaluation-loss ratio (candidate / reference, last
evaluation) has its own band from the reference's seeds.

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
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from autosync.context import workload_batch
from autosync.errors import UserError
from autosync.strategy import Strategy

REFERENCE_SEEDS = 2
TARGET_AT = 0.75                 # L* = the reference's evaluation loss at this share of the horizon
EVAL_SAMPLES = 512               # held-out samples, split over the ranks
EVAL_SEED = 2_147_483_000        # the held-out set's generator seed: no training generator uses it
DEFAULT_HORIZON = 240
DEFAULT_EVAL_EVERY = 20
DEFAULT_LR = 1e-3                # Adam's, for workloads that name none (autosync.workloads.BuiltinInfo.lr)
FLAT_DROP = 0.02                 # a reference whose loss falls less than this share by L* cannot rank anything
EXTEND = 2                       # a candidate short of L* at the horizon trains on, up to this many horizons
PROTOCOL = 3                     # bump when the measurement changes: stored results of another protocol are not reused
#                                  (2: asynchronous modes train on the cluster in timed windows; 3: a candidate short of
#                                  L* at the horizon trains on, up to EXTEND horizons; see reusable())


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


#: where a timing-dependent efficiency was measured when not on a cluster
LOOPBACK = "loopback"


def key(workload: str, batch_size: int, world: int, ranks_per_host: int, strategy: Strategy,
        cluster: str | None = None) -> str:
    """Where one efficiency measurement applies: workload, batch, world (and hosts, for a mode that uses
    them) and the strategy's lossy choices. The network does not enter for a synchronous mode: its math
    does not depend on it. An asynchronous mode's (asp) does: its staleness follows the ranks' relative
    speeds and the links, so its key also names where it was measured (``|on:<cluster spec>``, or
    ``|on:loopback`` when it was trained on unshaped loopback ranks)."""
    hosts = f"x{ranks_per_host}" if strategy.sync.kind.needs_hosts else ""
    where = f"|on:{cluster or LOOPBACK}" if strategy.sync.kind.asynchronous else ""
    return f"{workload_batch(workload, batch_size)}|w{world}{hosts}|{strategy.lossy_key()}{where}"


def reference_key(workload: str, batch_size: int, world: int, seed: int) -> str:
    return f"{workload_batch(workload, batch_size)}|w{world}|reference|seed{seed}"


# --- rank side ---------------------------------------------------------------------------------

def _flat_grads(params) -> "Any":
    import torch

    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).double()
                      for p in params])


def train_curve(ctx, spec: CurveSpec) -> dict[str, Any]:
    """Rank-side body: train ``spec.horizon`` steps by the strategy, evaluating the consensus model; with
    ``spec.goal`` and ``spec.extend_to`` set, a curve that has not reached ``goal`` by the horizon trains on until it
    has (confirmed by the next evaluation), at most ``extend_to`` steps (signals are taken over the horizon only).

    Timed mode (``spec.timed`` or ``spec.stop_at`` set): no signals and no per-step loss reduction (nothing but
    the strategy's own communication runs between evaluations, so an asynchronous mode's ranks keep their own
    pace), the training time is read at every evaluation with the clock paused while evaluating, and training
    stops as soon as the smoothed curve has crossed ``stop_at`` (when set) with the crossing confirmed by the
    next evaluation (the centred smoothing needs it), or after ``max_train_s``."""
    import torch
    import torch.distributed as dist

    from autosync import workloads
    from autosync.executor.apply import apply, release
    from autosync.executor.device import now, reduce_values, to_device
    from autosync.executor.measure import _make_optimizer

    t0 = time.monotonic()
    device = ctx.device
    strategy = Strategy.from_dict(spec.strategy)
    model, make_batch = workloads.build(spec.workload, seed=spec.seed)
    model.to(device)
    optimizer = _make_optimizer(spec.optimizer, spec.lr, model.parameters())
    ddp, optimizer = apply(model, optimizer, strategy, init_sync=False)
    params = [p for p in model.parameters() if p.requires_grad]
    world = ctx.world_size
    gen = torch.Generator().manual_seed(spec.seed * 100_003 + ctx.rank)
    eval_gen = torch.Generator().manual_seed(EVAL_SEED)
    n_eval = max(world, math.ceil(EVAL_SAMPLES / spec.batch_size))
    n_eval -= n_eval % world
    eval_batches = [to_device(make_batch(spec.batch_size, eval_gen), device) for _ in range(n_eval)]
    mine = eval_batches[ctx.rank::world]
    consensus = None
    sig: dict[str, list[float]] = {"grad_error": [], "ef_norm": [], "local_drift": [], "grad_noise_scale": []}

    def evaluate() -> float:
        nonlocal consensus
        import copy

        if consensus is None:
            consensus = copy.deepcopy(model)
        with torch.no_grad():
            for c, p in zip(consensus.parameters(), model.parameters()):
                c.copy_(p)
                dist.all_reduce(c.data)
                c.div_(world)
            total = torch.tensor([sum(float(workloads.loss_of(consensus(**b))) for b in mine)], dtype=torch.float64,
                                 device=device)
        dist.all_reduce(total)
        return total.item() / n_eval

    timed = spec.timed or spec.stop_at is not None
    steps, evals, train, train_s = [0], [], [], [0.0]

    def crossed(goal: float | None) -> bool:
        """Whether the smoothed curve crossed ``goal``, confirmed by the evaluation after the crossing."""
        n = steps_to(steps, evals, goal) if goal is not None else None
        return n is not None and n <= steps[-2]

    limit = max(spec.horizon, spec.extend_to or 0) if spec.goal is not None else spec.horizon

    def extending() -> bool:
        """Past the horizon: whether to train on. Not when the curve up to the horizon reached ``goal`` (even
        unconfirmed: the comparison reads that curve first), else until the crossing is confirmed or ``limit``."""
        return (spec.goal is not None and steps[-1] < limit and not crossed(spec.goal)
                and steps_by(steps, evals, spec.goal, spec.horizon) is None)

    try:
        dist.barrier()
        evals.append(evaluate())
        clock = now(device)
        # An asynchronous mode (asp) in timed mode trains in windows of wall-clock time, not of steps, so that fast
        # ranks take more steps than slow ones between evaluations, as they would in a real run; the first window
        # is eval_every steps and sets the length of the rest. Steps = the ranks' total / W (bsp-equivalent).
        async_timed = timed and strategy.sync.kind.asynchronous
        window = None
        while async_timed and (steps[-1] < spec.horizon or extending()):
            n, start = 0, now(device)
            while n < spec.eval_every if window is None else now(device) - start < window:
                batch = to_device(make_batch(spec.batch_size, gen), device)
                loss = workloads.loss_of(ddp(**batch))
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=False)
                train.append(loss.item())
                n += 1
            elapsed = now(device) - start
            taken = reduce_values([float(n)], "sum", device)[0]
            longest = reduce_values([elapsed], "max", device)[0]
            window = window or longest
            train_s.append(train_s[-1] + longest)
            steps.append(steps[-1] + taken / world)
            evals.append(evaluate())
            if crossed(spec.stop_at) or (spec.max_train_s and train_s[-1] > spec.max_train_s):
                break
        for step in range(1, 0 if async_timed else limit + 1):
            if step > spec.horizon and not extending():
                break
            batch = to_device(make_batch(spec.batch_size, gen), device)
            signal_step = spec.signals and not timed and step % spec.eval_every == 0 and step <= spec.horizon
            if signal_step:
                with ddp.no_sync():
                    workloads.loss_of(ddp(**batch)).backward()
                local = _flat_grads(params)
                optimizer.zero_grad(set_to_none=False)
                mean = local.clone()
                dist.all_reduce(mean)
                mean /= world
                sq = torch.tensor([float(local.pow(2).sum())], dtype=torch.float64, device=device)
                dist.all_reduce(sq)
                small, big = sq.item() / world, float(mean.pow(2).sum())
                b, bb = spec.batch_size, spec.batch_size * world
                g2 = (bb * big - b * small) / (bb - b)
                s_tr = (small - big) / (1 / b - 1 / bb)
                if world > 1 and g2 > 0:
                    sig["grad_noise_scale"].append(s_tr / g2)
            loss = workloads.loss_of(ddp(**batch))
            loss.backward()
            if signal_step:
                applied = _flat_grads(params)
                err = torch.tensor([float((applied - mean).norm()) / max(float(mean.norm()), 1e-30),
                                    ddp.autosync_state.error_norm()], dtype=torch.float64, device=device)
                dist.all_reduce(err)
                sig["grad_error"].append(err[0].item() / world)
                sig["ef_norm"].append(err[1].item() / world)
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
            lt = loss.detach().double().reshape(1)
            if not timed:
                dist.all_reduce(lt)
            train.append(lt.item() / (1 if timed else world))
            if signal_step and strategy.sync.kind.lossy:
                flat = torch.cat([p.detach().reshape(-1).double() for p in params])
                avg = flat.clone()
                dist.all_reduce(avg)
                avg /= world
                dev = torch.tensor([float((flat - avg).pow(2).sum())], dtype=torch.float64, device=device)
                dist.all_reduce(dev)
                sig["local_drift"].append(math.sqrt(dev.item() / world) / max(float(avg.norm()), 1e-30))
            if step % spec.eval_every == 0 or step in (spec.horizon, limit):
                train_s.append(train_s[-1] + now(device) - clock)
                steps.append(step)
                evals.append(evaluate())
                clock = now(device)
                if timed:
                    # every rank holds the same reduced losses: the decision is the same everywhere
                    if crossed(spec.stop_at) or (spec.max_train_s and train_s[-1] > spec.max_train_s):
                        break
    finally:
        release(ddp)
    signals = {k: float(statistics.fmean(v)) for k, v in sig.items() if v}
    return {"steps": steps, "eval_loss": evals, "train_loss": train, "signals": signals,
            "wall_s": time.monotonic() - t0, "train_s": train_s}


def measure_curve(pool, spec: CurveSpec, timeout: float = 1800.0) -> Curve:
    """Run one curve on the pool's ranks; raises TrialFailure when a rank fails or the limit runs out."""
    raw = pool.run(train_curve, spec, timeout=timeout)[0]
    return Curve(raw["steps"], raw["eval_loss"], raw["train_loss"], raw["signals"], raw["wall_s"], raw["train_s"])


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


@dataclass
class Efficiency:
    """The outcome of one paired comparison (see the module docstring)."""

    efficiency: float           # reported: 1.0 inside the noise band, 0 when L* was never reached
    raw: float                  # n_ref / n_cand before the noise rule (0 when never reached)
    band: float                 # h: the reference's seed-to-seed relative spread of n(L*)
    within_noise: bool
    target_loss: float
    reached_loss: float         # the candidate's lowest smoothed evaluation loss
    steps_ref: float
    steps_cand: float | None
    final_loss_ratio: float     # candidate's last evaluation loss / the reference's (seed 0)
    final_loss_band: float      # the reference seeds' relative spread of the last evaluation loss

    @property
    def lo(self) -> float:
        return self.raw * (1 - self.band)

    @property
    def hi(self) -> float:
        return self.raw * (1 + self.band)


def target(references: list[Curve], horizon: int) -> float:
    mean = np.mean([smooth(c.eval_loss) for c in references], axis=0)
    return loss_at(references[0].steps, list(mean), TARGET_AT * horizon)


def compare(references: list[Curve], candidate: Curve, horizon: int) -> Efficiency:
    """Efficiency of ``candidate`` (paired with ``references[0]``) against the reference seeds. The candidate's
    curve up to ``horizon`` is read first (as every protocol has); only when it did not reach L* there, the part
    trained on past the horizon (``EXTEND``) counts. The final-loss ratio is the loss at the horizon's."""
    if len(references) < 2:
        raise ValueError("the noise band needs at least 2 reference seeds")
    goal = target(references, horizon)
    ref_steps = [steps_to(c.steps, c.eval_loss, goal) or float(horizon) for c in references]
    n0 = ref_steps[0]
    band = max(abs(1 - n / n0) for n in ref_steps[1:])
    finals = [c.eval_loss[-1] for c in references]
    final_band = max(abs(1 - f / finals[0]) for f in finals[1:])
    n_cand = steps_by(candidate.steps, candidate.eval_loss, goal, horizon)
    if n_cand is None:
        n_cand = steps_to(candidate.steps, candidate.eval_loss, goal)
    within_h = sum(1 for s in candidate.steps if s <= horizon)
    raw = n0 / max(n_cand, 1e-9) if n_cand is not None else 0.0
    within = n_cand is not None and abs(raw - 1) <= band
    return Efficiency(1.0 if within else raw, raw, band, within, goal, min(smooth(candidate.eval_loss)), n0, n_cand,
                      candidate.eval_loss[within_h - 1] / finals[0], final_band)


def place(ekey: str) -> str | None:
    """Where the row of efficiency key ``ekey`` was measured, as :func:`key` wrote it: a cluster's spec or
    ``loopback`` for an asynchronous mode, None for any other (measured anywhere alike)."""
    _, sep, where = ekey.rpartition("|on:")
    return where if sep else None


def reusable(row: dict) -> bool:
    """Whether a stored row was measured by this protocol. Protocol 3 changed only candidates that had not
    reached L* by the horizon (they train on now): an older row that did reach it measured the same. Protocol 2
    changed only asynchronous modes on a cluster (timed windows instead of lockstep steps): a protocol-1 row of
    anything else measured the same."""
    if row.get("protocol") == PROTOCOL:
        return True
    if row.get("status") == "ok" and row.get("efficiency_raw") == 0:
        return False                                    # censored at the horizon: protocol 3 measures it further
    return row.get("protocol") == 2 or (row.get("protocol") == 1 and place(row["efficiency_key"]) in (None, LOOPBACK))


def horizon_of(workload) -> int:
    from autosync import workloads

    info = workloads.BUILTINS.get(workload) if isinstance(workload, str) else None
    return getattr(info, "horizon", None) or DEFAULT_HORIZON


def is_flat(start: float, goal: float) -> bool:
    """Whether references that start at ``start`` and reach L* = ``goal`` fall too little to rank anything."""
    return start - goal < FLAT_DROP * abs(start)


def lr_of(workload) -> float:
    """The protocol's Adam learning rate for ``workload``: a built-in's own (``BuiltinInfo.lr``), else 1e-3."""
    from autosync import workloads

    info = workloads.BUILTINS.get(workload) if isinstance(workload, str) else None
    return getattr(info, "lr", None) or DEFAULT_LR


# --- measuring and storing ---------------------------------------------------------------------

def efficiency_row(ekey: str, workload: str, batch: int, world: int, ranks_per_host: int, strategy: Strategy,
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
                   band=eff.band, within_noise=eff.within_noise, target_loss=eff.target_loss,
                   reached_loss=eff.reached_loss, steps_ref=eff.steps_ref,
                   steps_cand=eff.steps_cand if eff.steps_cand is not None else float("nan"),
                   final_loss_ratio=eff.final_loss_ratio, final_loss_band=eff.final_loss_band)
    return row


def _curve_of(row: dict) -> Curve:
    c = json.loads(row["curve"])
    return Curve(c["steps"], c["eval_loss"], [], {k: row[k] for k in ("grad_error", "ef_norm", "local_drift",
                                                                     "grad_noise_scale")}, row["wall_s"])


class EfficiencyMeter:
    """Measures efficiencies on loopback ranks, storing every curve; stored ones are reused (resume). A new
    measurement takes the place of a stored row of its key that could not be reused (see :func:`reusable`).

    One meter per (workload, batch, world, hosts). ``measure(strategy)`` returns the stored or
    newly measured row (a dict, see :func:`efficiency_row`) of the strategy's efficiency key.

    An asynchronous mode (asp) is timing-dependent: once :meth:`on_cluster` has given the meter the
    cluster's own ranks, it is trained there (its key and row name the cluster); without them it is
    trained on loopback and its key and row say ``loopback``.
    """

    def __init__(self, store, workload, batch_size: int, world: int, ranks_per_host: int = 1,
                 horizon: int | None = None, eval_every: int = DEFAULT_EVAL_EVERY, lr: float | None = None,
                 optimizer: str = "adam", timeout_s: float = 1800.0, pool=None, progress=None, also=()):
        self.store = store
        self.also = list(also)          # more stores whose measurements are reused (e.g. the shipped dataset)
        self.workload, self.name = workload, str(workload)
        self.batch, self.world, self.rph = batch_size, world, ranks_per_host
        self.horizon = horizon or horizon_of(workload)
        self.eval_every, self.lr, self.optimizer = eval_every, lr or lr_of(workload), optimizer
        self.timeout_s = timeout_s
        self._pool, self._own_pool = pool, pool is None
        self.progress = progress
        self._references: list[Curve] | None = None
        self._also_rows: list[dict] | None = None
        self._cluster_pool, self.cluster = None, None

    def on_cluster(self, pool, cluster: str) -> None:
        """Train timing-dependent (asynchronous) modes on ``pool``, the ranks of the cluster ``cluster`` (a spec),
        from now on; the caller keeps owning the pool."""
        self._cluster_pool, self.cluster = pool, cluster

    def where(self, strategy: Strategy) -> str | None:
        """Where ``strategy``'s efficiency is measured: the cluster's spec, ``loopback``, or None (anywhere:
        a synchronous mode's efficiency does not depend on timing)."""
        if not strategy.sync.kind.asynchronous:
            return None
        return self.cluster if self._cluster_pool is not None else LOOPBACK

    def key(self, strategy: Strategy) -> str:
        return key(self.name, self.batch, self.world, self.rph, strategy, self.where(strategy))

    def _spec(self, strategy: Strategy, seed: int, goal: float | None = None) -> CurveSpec:
        """The run of ``strategy``; a candidate (``goal`` = L*) short of L* at the horizon trains on (``EXTEND``)."""
        on_cluster = self.where(strategy) not in (None, LOOPBACK)     # asp on the cluster: its own pace per rank
        return CurveSpec(self.workload, strategy.canonical(), self.batch, self.horizon, self.eval_every, seed,
                         self.lr, self.optimizer, timed=on_cluster, goal=goal,
                         extend_to=EXTEND * self.horizon if goal is not None else None)

    def pool(self):
        if self._pool is None:
            from autosync.executor.launch import RankPool

            self._pool = RankPool(self.world, self.rph, network="unshaped")
        return self._pool

    def close(self, failed: bool = False) -> None:
        """Let the own pool's ranks leave; ``failed`` (unwinding from an exception): kill them at once."""
        if self._own_pool and self._pool is not None:
            self._pool.kill() if failed else self._pool.close()
            self._pool = None

    def __enter__(self) -> "EfficiencyMeter":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(failed=exc_type is not None)

    def _stored(self, ekey: str) -> dict | None:
        if self._also_rows is None:     # the other stores are only read: once is enough
            self._also_rows = [store.efficiency_rows() for store in self.also]
        for rows in (self.store.efficiency_rows(), *self._also_rows):
            row = rows.get(ekey)
            if (row is not None and reusable(row) and row.get("horizon") == self.horizon
                    and row.get("lr") == self.lr):
                return row
        return None

    def noise_scale(self) -> float:
        """The reference runs' gradient noise scale, when they are stored (NaN otherwise; nothing is run)."""
        vals = [r["grad_noise_scale"] for r in (self._stored(reference_key(self.name, self.batch, self.world, s))
                                                for s in range(REFERENCE_SEEDS)) if r is not None]
        return float(np.mean(vals)) if vals else float("nan")

    def _run(self, strategy: Strategy, seed: int, ekey: str, what: str,
             goal: float | None = None) -> tuple[Curve | None, str, str]:
        from autosync.executor.launch import TrialFailure

        where = self.where(strategy)
        on_cluster = where not in (None, LOOPBACK)
        if self.progress:
            longer = f", on to {EXTEND * self.horizon} if short of L*" if goal is not None else ""
            self.progress(f"training {what} for {self.horizon} steps{longer} (efficiency, "
                          f"{'on the cluster ' + where if on_cluster else 'loopback'})")
        try:
            pool = self._cluster_pool if on_cluster else self.pool()
            return measure_curve(pool, self._spec(strategy, seed, goal), self.timeout_s), "ok", ""
        except TrialFailure as f:
            return None, f.status, f.reason

    def references(self) -> list[Curve]:
        """The DDP default's curves from ``REFERENCE_SEEDS`` seeds (measured once, then stored)."""
        if self._references is None:
            curves = []
            default = Strategy.default()
            for seed in range(REFERENCE_SEEDS):
                ekey = reference_key(self.name, self.batch, self.world, seed)
                row = self._stored(ekey)
                if row is None or row["status"] != "ok":
                    curve, status, reason = self._run(default, seed, ekey, f"the reference (seed {seed})")
                    if curve is None:
                        raise UserError(f"efficiency: the reference run of {self.name} {status}: {reason}")
                    row = efficiency_row(ekey, self.name, self.batch, self.world, self.rph, default,
                                         self._spec(default, seed), curve, None)
                    row.update(efficiency=1.0, efficiency_raw=1.0, efficiency_lo=1.0, efficiency_hi=1.0)
                    self.store.replace_efficiency([row])
                curves.append(_curve_of(row))
            self._references = curves
        return self._references

    def stored(self, strategy: Strategy) -> dict | None:
        """The stored efficiency row of ``strategy``'s lossy choices, or None; nothing is run."""
        return self._stored(self.key(strategy))

    def measure(self, strategy: Strategy) -> dict:
        """The efficiency row of ``strategy`` (lossless: efficiency 1 by definition, nothing run)."""
        ekey = self.key(strategy)
        if strategy.is_lossless:
            return {"efficiency_key": ekey, "status": "ok", "efficiency": 1.0, "efficiency_lo": 1.0,
                    "efficiency_hi": 1.0, "band": 0.0, "within_noise": True, "final_loss_ratio": 1.0,
                    "lossless": True}
        row = self._stored(ekey)
        if row is not None:
            return row
        refs = self.references()
        start, goal = float(np.mean([c.eval_loss[0] for c in refs])), target(refs, self.horizon)
        if is_flat(start, goal):
            row = efficiency_row(ekey, self.name, self.batch, self.world, self.rph, strategy,
                                 self._spec(strategy, 0), None, None, "flat",
                                 f"the reference's evaluation loss fell only {start:.4g} -> {goal:.4g} by 3/4 of "
                                 f"{self.horizon} steps: too flat to measure an efficiency")
            self.store.replace_efficiency([row])
            return row
        curve, status, reason = self._run(strategy, 0, ekey, f"lossy strategy {strategy.hash}", goal)
        eff = compare(refs, curve, self.horizon) if curve is not None else None
        row = efficiency_row(ekey, self.name, self.batch, self.world, self.rph, strategy, self._spec(strategy, 0),
                             curve, eff, status, reason)
        self.store.replace_efficiency([row])
        return row


def collect(store, workloads: list[str] | None = None, worlds: list[int] | None = None, per_group: int = 10,
            seed: int = 0, timeout_s: float = 1800.0, progress=None, again: bool = False) -> dict[str, int]:
    """Measure the efficiency of the lossy strategies the dataset's trials hold, ``per_group`` keys per
    (workload, batch, world, hosts) group, in a seeded order (the same command continues the same list:
    what is stored is skipped). ``again``: instead, measure again every stored loopback row an older protocol
    measured differently (:func:`reusable`: censored at the horizon), each with its stored strategy, whatever
    the seeded lists hold now (``per_group`` and ``seed`` do not apply). Returns counts of ok / failed / already
    stored."""
    import random

    stored = store.efficiency_rows()
    measured = {k for k, row in stored.items() if reusable(row)}    # a censored row is measured again
    counts = {"ok": 0, "failed": 0, "timeout": 0, "flat": 0, "stored": 0}
    groups: dict[tuple, dict[str, str]] = {}
    if again:
        for k, r in stored.items():
            if (k not in measured and place(k) in (None, LOOPBACK) and (not workloads or r["workload"] in workloads)
                    and (not worlds or r["world_size"] in worlds)):
                groups.setdefault((r["workload"], int(r["batch_size"]), int(r["world_size"]),
                                   int(r["ranks_per_host"])), {})[k] = r["strategy"]
    else:
        trials = store.read(efficiency=False)
        trials = trials[~trials.lossless.astype(bool)]
        if workloads:
            trials = trials[trials.workload.isin(workloads)]
        if worlds:
            trials = trials[trials.world_size.isin(worlds)]
        for r in trials.itertuples():
            s = Strategy.from_dict(json.loads(r.strategy))
            rph = int(r.ranks_per_node) if s.sync.kind.needs_hosts else 1
            groups.setdefault((r.workload, int(r.batch_size), int(r.world_size), rph), {}).setdefault(
                r.efficiency_key, r.strategy)
    for (workload, batch, world, rph), keys in sorted(groups.items()):
        order = sorted(keys)
        random.Random(f"{seed}|{workload}|{batch}|{world}|{rph}").shuffle(order)
        chosen = order if again else order[:per_group]
        todo = [k for k in chosen if k not in measured]
        counts["stored"] += len(chosen) - len(todo)
        if not todo:
            continue
        with EfficiencyMeter(store, workload, batch, world, rph, timeout_s=timeout_s, progress=progress) as meter:
            for i, k in enumerate(todo):
                if progress:
                    progress(f"{workload} b{batch} w{world}x{rph}: {i + 1}/{len(todo)}")
                row = meter.measure(Strategy.from_dict(json.loads(keys[k])))
                counts[row["status"]] = counts.get(row["status"], 0) + 1
    return counts
