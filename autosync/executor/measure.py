"""Measure a strategy: warm-up steps, then timed steps, on every rank.

A step is forward + backward (with the strategy's communication) + optimizer step, timed
on each rank; the step time of the job is the slowest rank's. Throughput is
``world_size * batch_size / step_s`` with ``step_s`` the median step time; the coefficient of variation is
``std / mean`` of the timed steps. Local SGD is periodic (one step in ``period`` averages
the model), so its timed steps are whole periods and its step time is their *mean*: a
median would drop the averaging step and overstate it by up to the period. An asynchronous
mode (asp) has no job step: each rank runs at its own pace, so step ``i`` counts as
``W / sum_r (1 / t_r,i)`` and throughput is the sum of the ranks' rates. Peak memory is
the largest resident-set peak of any rank during the trial (Linux VmHWM, reset before it).

Bytes sent per step and rank are measured on emulated hosts: the first rank of each host reads the transmit
counter of the host's interface to the other hosts (``/proc/net/dev`` in its namespace) before and after the
timed steps; ``sum over hosts of the bytes / timed steps / W``. They count what crossed the wire between hosts
(TCP/IP headers and acknowledgements included; traffic inside a host, over its loopback, is not counted).
Elsewhere (unshaped loopback, a real job) they are not measured (None).

A trial trains with SGD (momentum 0.9) at lr 0.01 from fresh weights, unless its spec names an optimizer or a
learning rate; a mode whose communication follows the training trajectory (adaptive) trains as the efficiency
protocol does instead (:meth:`TrialSpec.recipe`).
"""
from __future__ import annotations

import dataclasses
import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autosync.executor.launch import RankContext, RankPool, TrialFailure
from autosync.executor.memory import peak_rss_mb, reset_peak_rss
from autosync.executor.recipe import data_generator, lr_of, make_optimizer
from autosync.strategy import Strategy


@dataclass(frozen=True)
class TrialSpec:
    """What one trial runs. ``strategy`` is the canonical dict (picklable, hashable by content)."""

    workload: Any                   # a workload name, or a workloads.InMemory
    strategy: dict
    batch_size: int
    warmup_steps: int = 3
    steps: int = 10
    seed: int = 0
    lr: float | None = None         # None (with optimizer None): the recipe's, see recipe()
    optimizer: str | None = None    # sgd (momentum 0.9) | adam; None: the recipe's
    record_params: bool = False     # return the final parameters of rank 0 (for equivalence tests)
    builtin_ddp: bool = False       # plain DDP with its built-in all-reduce (no autosync hook): the reference
    force_worker: bool = False      # run plain all-reduce through the segment worker too (hook benchmark)
    time_budget_s: float | None = None  # cap timed steps at ~budget / (slowest warm-up step), at least min_steps
    min_steps: int = 3

    def recipe(self) -> tuple[str, float]:
        """The optimizer and learning rate the trial trains with: the spec's own when it names either (SGD and
        0.01 for the other), else SGD (momentum 0.9) at 0.01; but a mode whose communication follows the
        trajectory (``follows_trajectory``: adaptive) trains as the efficiency protocol does, with Adam at the
        workload's learning rate (:func:`autosync.executor.recipe.lr_of`), so that its throughput and its efficiency
        come from the same kind of run. (On mlp, 2x1@1gbit, adaptive(max_period 16, threshold 0.01) averaged
        once in 16 steps under SGD at 0.01, 2,180 samples/s, and almost every step under Adam at 1e-3, 609
        samples/s, against the default's 639-708.)"""
        if self.optimizer is not None or self.lr is not None:
            return self.optimizer or "sgd", self.lr if self.lr is not None else 0.01
        if Strategy.from_dict(self.strategy).sync.kind.follows_trajectory:
            return "adam", lr_of(self.workload)
        return "sgd", 0.01


@dataclass
class TrialResult:
    workload: str
    strategy_hash: str
    world_size: int
    batch_size: int
    status: str                       # ok | failed | timeout
    reason: str = ""
    samples_per_s: float = 0.0
    step_s: float = 0.0               # representative step time: the median, or for periodic modes the mean
    step_stat: str = "median"         # median | mean (whole rounds of a periodic mode) | async-median (asp: the
                                      # median of W / sum over ranks of 1/step time: the ranks' summed rates)
    cv: float = 0.0
    peak_mem_mb: float = 0.0
    step_times: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    sent_bytes_per_step: float | None = None   # per rank, between emulated hosts (module docstring); None: not measured

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _whole_periods(steps: int, period: int) -> int:
    """``steps`` rounded down to whole periods, at least one period."""
    return max(period, steps // period * period) if period > 1 else steps


def sent_bytes(ifname: str) -> int:
    """Bytes sent through interface ``ifname`` of this process's network namespace so far (``/proc/net/dev``)."""
    with open("/proc/net/dev") as f:
        for line in f.read().splitlines()[2:]:
            name, data = line.split(":", 1)
            if name.strip() == ifname:
                return int(data.split()[8])
    raise LookupError(f"no interface {ifname} in this network namespace")


def run_trial(ctx: RankContext, spec: TrialSpec) -> dict[str, Any]:
    """Rank-side body of a trial; every rank returns the same summary (plus params on rank 0)."""
    import torch.distributed as dist

    from autosync import workloads
    from autosync.executor import device as dev
    from autosync.executor.apply import apply, release

    reset_peak_rss()
    device = ctx.device
    strategy = Strategy.from_dict(spec.strategy)
    model, make_batch = workloads.build(spec.workload, seed=spec.seed)
    model.to(device)
    optimizer = make_optimizer(*spec.recipe(), model.parameters())
    if spec.builtin_ddp:
        from torch.nn.parallel import DistributedDataParallel as DDP

        f = strategy.fusion
        ddp = DDP(model, bucket_cap_mb=f.bucket_cap_mb, gradient_as_bucket_view=f.gradient_as_bucket_view,
                  static_graph=f.static_graph, init_sync=False)
    else:  # every rank built the model from the same seed: DDP's initial broadcast is not needed
        ddp, optimizer = apply(model, optimizer, strategy, init_sync=False, force_worker=spec.force_worker)
    gen = data_generator(spec.seed, ctx.rank)
    period = strategy.sync.kind.steps_per_round(strategy.sync)
    total = spec.warmup_steps + _whole_periods(spec.steps, period)
    times, losses = [], []
    counts = ctx.host_if is not None and ctx.rank % ctx.ranks_per_host == 0   # one reader per emulated host
    sent = [0.0, 0.0]                                                         # bytes, timed steps (this host)
    try:
        dist.barrier()
        step = 0
        while step < total:
            if counts and step == spec.warmup_steps:
                sent[0] = -sent_bytes(ctx.host_if)
            batch = dev.to_device(make_batch(spec.batch_size, gen), device)
            t0 = dev.now(device)
            loss = workloads.loss_of(ddp(**batch))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
            times.append(dev.now(device) - t0)   # synchronized: the step's kernels are done
            losses.append(loss.item())
            step += 1
            if step == spec.warmup_steps and spec.time_budget_s:
                slowest = dev.reduce_values([max(times[-1:] or [0.0])], "max", device)[0]  # same decision everywhere
                fits = int(spec.time_budget_s / max(slowest, 1e-6))
                total = spec.warmup_steps + _whole_periods(max(spec.min_steps, min(spec.steps, fits)), period)
        if counts:
            sent = [sent[0] + sent_bytes(ctx.host_if), float(step - spec.warmup_steps)]
    finally:
        release(ddp)
    if strategy.sync.kind.asynchronous:
        # ranks run at their own pace: step i's equivalent time is W / sum_r (1 / t_r,i), so that
        # W x batch / step is the sum of the ranks' rates (not the slowest rank's)
        rates = dev.reduce_values([1.0 / max(t, 1e-9) for t in times], "sum", device)
        slowest = [ctx.world_size / r for r in rates]
    else:
        slowest = dev.reduce_values(times, "max", device)
    loss_sum = dev.reduce_values(losses, "sum", device)
    peak = dev.reduce_values([peak_rss_mb()], "max", device)[0]
    host_bytes, host_steps = dev.reduce_values(sent, "sum", device)
    out: dict[str, Any] = {"step_times": slowest, "losses": [x / ctx.world_size for x in loss_sum],
                           "peak_mem_mb": float(peak),
                           "sent_bytes_per_step": (host_bytes / host_steps / ctx.ranks_per_host) if host_steps else None}
    if spec.record_params and ctx.rank == 0:   # the only copy to the host, and only when asked
        out["params"] = {n: p.detach().cpu().numpy().copy() for n, p in model.named_parameters()}
    return out


def summarize(spec: TrialSpec, world_size: int, raw: dict[str, Any], wall_s: float) -> TrialResult:
    timed = raw["step_times"][spec.warmup_steps:]
    mean = statistics.fmean(timed)
    sync = Strategy.from_dict(spec.strategy).sync
    periodic = sync.kind.steps_per_round(sync) > 1
    step = mean if periodic else statistics.median(timed)
    stat = "mean" if periodic else "async-median" if sync.kind.asynchronous else "median"
    cv = statistics.pstdev(timed) / mean if len(timed) > 1 and mean > 0 else 0.0
    return TrialResult(str(spec.workload), Strategy.from_dict(spec.strategy).hash, world_size, spec.batch_size, "ok",
                       samples_per_s=world_size * spec.batch_size / step, step_s=step,
                       step_stat=stat, cv=cv,
                       peak_mem_mb=raw["peak_mem_mb"], step_times=timed, losses=raw["losses"], wall_s=wall_s,
                       sent_bytes_per_step=raw.get("sent_bytes_per_step"))


def measure(pool: RankPool, spec: TrialSpec, timeout: float = 300.0) -> tuple[TrialResult, dict | None]:
    """Run one trial on the pool's ranks; never raises for a failing strategy.

    Returns the TrialResult and, when ``spec.record_params``, rank 0's final parameters.
    """
    t0 = time.monotonic()
    try:
        per_rank = pool.run(run_trial, spec, timeout=timeout)
    except TrialFailure as f:
        result = TrialResult(str(spec.workload), Strategy.from_dict(spec.strategy).hash, pool.world_size,
                             spec.batch_size, f.status, f.reason, wall_s=time.monotonic() - t0)
        return result, None
    result = summarize(spec, pool.world_size, per_rank[0], time.monotonic() - t0)
    params = per_rank[0].get("params")
    return result, params


def params_close(a: dict[str, np.ndarray], b: dict[str, np.ndarray], rtol: float = 1e-5, atol: float = 1e-6) -> list[str]:
    """Names of parameters that differ between two snapshots beyond the tolerance."""
    return [n for n in a if not np.allclose(a[n], b[n], rtol=rtol, atol=atol)]
