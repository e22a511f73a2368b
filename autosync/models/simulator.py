"""Analytical step time of a Strategy on a Profile.

Timeline of one step: forward ``F``; backward ``B`` during which DDP's buckets become
ready (a bucket is ready when its last gradient is, from the profile's ready times);
buckets are synchronized one after another in order, each starting at
``max(ready, previous bucket done)`` (the hook's single worker); then the optimizer ``O``::

    step = F + max(B, done_last_bucket) + O          exposed communication = step - (F + B + O)

A bucket's time is the sum over its segments (runs of one group) of its compressor's cost,
which prices the group's plan from the NetworkProfile's fits ``t_c(n) = alpha_c + beta_c n``
for collective ``c``. Each plan's, compressor's and sync mode's formula is in the docstring
of its module in :mod:`autosync.plans`; this module iterates over them. A sync mode may
replace a bucket's plans (local SGD after its warm-up averages inside a host only) and add
a step cost not overlapped with backward (its periodic global averaging).

Delayed modes (ssp, delay ``s >= 1``): a step's buckets are averaged while the next ``s`` steps
compute, so the step is bound by whichever is longer::

    step = max(F + B + O, sum of bucket times)

Uneven compute: compute (``F``, ``B``, the ready times, ``O``) is divided by the slowest host's
speed (every mode waits for it; the profile's measured ``host_speeds`` when it has them, else the
spec's; an asynchronous mode, asp, by the hosts' mean speed instead: nobody waits), then multiplied by the intermittent-straggler factor (one random rank ``x`` times slower
a fraction ``y`` of the time, in slices of ``L`` seconds)::

    factor = 1 + y (x - 1) k,   k = max(1/W, 1 - a (1 - 1/W)),   a = min(1, (w - 1) step / L)

where ``w`` is the mode's window (:meth:`~autosync.plans.base.SyncModeDef.window`: steps a fast
rank may run ahead; 1 for bsp, so ``k = 1`` and every rank pays every straggle; a long window
spreads the straggles over the ranks, ``k -> 1/W``). An approximation, stated as such; the
learned model corrects it from measurements.

ZeRO: the optimizer step shrinks to ``O / W`` and the updated shards are all-gathered
after it: ``+ t_ag(M)``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from autosync import plans as registry
from autosync.profiler import Profile
from autosync.strategy import Group, Strategy


@dataclass
class SimResult:
    step_s: float
    compute_s: float
    comm_s: float                      # total communication time (overlapped or not)
    exposed_comm_s: float              # step_s - compute_s
    bytes_per_plan: dict[str, float] = field(default_factory=dict)
    n_buckets: int = 0
    n_segments: int = 0


def _resolve(profile: Profile, strategy: Strategy) -> list[int]:
    params = profile.model.params
    emb = {p.name for p in params if p.is_embedding}
    return strategy.resolve([(p.name, None) for p in params], emb)


class SimContext:
    """What a registry entry's ``cost`` sees: the network fits and the shape of the cluster."""

    def __init__(self, profile: Profile):
        self.net = profile.network
        self.world = profile.cluster.world_size
        self.ranks_per_node = profile.cluster.ranks_per_node
        self.nodes = profile.cluster.nodes
        self.paths = profile.path_bps()[0]
        m = profile.model
        self.flop_rate = m.flops_per_step / max(m.forward_s + m.backward_s, 1e-9)
        self.compute_s = m.forward_s + m.backward_s + m.optimizer_s     # one step's compute, seconds

    def t(self, op: str, nbytes: float, scope: str = "world") -> float:
        """Seconds of collective ``op`` on ``nbytes`` within ``scope`` (world | intra | inter)."""
        return self.net.time(op, nbytes, scope) if nbytes > 0 else 0.0

    def alpha(self, op: str) -> float:
        return self.net.fits["world"][op].alpha_s

    def segment(self, g: Group, owners, shapes: list, touched: list[float], rows=()) -> tuple[float, float]:
        """(seconds, bytes sent) of one segment: its compressor's cost around its plan's."""
        plan = registry.plan(g.plan)

        def plan_cost(nbytes: float, elem_size: int) -> float:
            return 0.0 if self.world == 1 else plan.cost(self, nbytes, shapes, touched, owners, elem_size, rows)

        n = sum(math.prod(s) for s in shapes) * 4
        seconds, sent = registry.compressor(g.compressor.name).cost(self, g.compressor, n, shapes, plan_cost)
        traffic = plan.traffic(n, shapes, rows, 4, self.world)
        return seconds, sent if traffic is None else traffic


def min_speed(profile: Profile) -> float:
    """The slowest host's compute speed: measured (the profile's ``host_speeds``) or the spec's."""
    measured = profile.env.get("host_speeds") if isinstance(profile.env, dict) else None
    return min(measured) if measured else profile.cluster.min_speed


def mean_speed(profile: Profile) -> float:
    """The ranks' mean compute speed (what an asynchronous mode runs at: nobody waits for the slowest)."""
    c = profile.cluster
    measured = profile.env.get("host_speeds") if isinstance(profile.env, dict) else None
    speeds = measured or [c.speed_of(h) for h in range(c.nodes)]
    return sum(speeds) / len(speeds)


def straggler_factor(profile: Profile, window: float, step_s: float) -> float:
    """Mean slowdown of a step from intermittent stragglers for a mode of ``window`` (module docstring)."""
    st = profile.cluster.stragglers
    if st is None:
        return 1.0
    world = profile.cluster.world_size
    absorbed = min(1.0, max(0.0, window - 1) * step_s / st.slice_s)
    k = max(1 / world, 1 - absorbed * (1 - 1 / world))
    return 1 + st.fraction * (st.slowdown - 1) * k


def simulate(profile: Profile, strategy: Strategy) -> SimResult:
    """Predicted step time and its parts (see the module docstring for the model)."""
    m = profile.model
    params = m.params
    group_of = _resolve(profile, strategy)
    group_bytes = [0] * len(strategy.groups)
    for p, gi in zip(params, group_of):
        group_bytes[gi] += p.nbytes
    world = profile.cluster.world_size
    owners = strategy.owners(group_bytes, world)
    costs = SimContext(profile)
    mode = strategy.sync.kind
    zero = strategy.optimizer_sharding == "zero"
    slow = 1.0 / (mean_speed(profile) if mode.asynchronous else min_speed(profile))
    if profile.cluster.stragglers is not None:
        plain = (m.forward_s + m.backward_s + m.optimizer_s) * slow
        slow *= straggler_factor(profile, mode.window(strategy.sync), plain)
    forward_s, backward_s = m.forward_s * slow, m.backward_s * slow

    done = 0.0
    comm_total = 0.0
    bytes_per_plan: dict[str, float] = {}
    buckets = m.buckets(strategy.fusion.bucket_cap_mb)
    n_segments = 0
    for bucket in buckets:
        ready = max(params[i].ready_s for i in bucket) * slow
        bucket_bytes = sum(params[i].nbytes for i in bucket)
        local = mode.bucket_cost(costs, bucket_bytes, strategy.sync)
        if local is not None:
            t = local
            bytes_per_plan[mode.name] = bytes_per_plan.get(mode.name, 0.0) + bucket_bytes
            n_segments += 1
        else:
            t = 0.0
            run: list[int] = []
            for pos, i in enumerate(bucket + [-1]):
                if run and (i < 0 or group_of[i] != group_of[run[-1]]):
                    g = strategy.groups[group_of[run[-1]]]
                    seconds, sent = costs.segment(g, owners[group_of[run[-1]]], [params[j].shape for j in run],
                                                  [params[j].touched_rows for j in run],
                                                  [params[j].factor_rows for j in run])
                    t += seconds
                    key = g.plan if registry.compressor(g.compressor.name).identity else f"{g.plan}+{g.compressor.name}"
                    bytes_per_plan[key] = bytes_per_plan.get(key, 0.0) + sent
                    n_segments += 1
                    run = []
                if i >= 0:
                    run.append(i)
        start = max(ready, done)
        done = start + t
        comm_total += t

    optimizer_s = (m.optimizer_s / world if zero else m.optimizer_s) * slow
    if mode.delay(strategy.sync):
        step = max(forward_s + backward_s + optimizer_s, comm_total)
    else:
        step = forward_s + max(backward_s, done) + optimizer_s
    extra = mode.step_cost(costs, strategy.sync, m.total_bytes)
    step += extra
    comm_total += extra
    if zero and world > 1:
        gather = costs.t("all_gather", m.total_bytes)
        step += gather
        comm_total += gather
    compute = forward_s + backward_s + optimizer_s
    return SimResult(step, compute, comm_total, max(0.0, step - compute), bytes_per_plan, len(buckets), n_segments)
