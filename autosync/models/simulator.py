"""Analytical step time of a Strategy on a Profile.

Timeline of one step: forward ``F``; backward ``B`` during which DDP's buckets become
ready (a bucket is ready when its last gradient is, from the profile's ready times);
buckets are synchronized one after another in order, each starting at
``max(ready, previous bucket done)`` (the hook's single worker); then the optimizer ``O``::

    step = F + max(B, done_last_bucket) + O          exposed communication = step - (F + B + O)

A bucket's time is the sum over its segments (runs of one group) of the plan's cost from
the NetworkProfile's fits ``t_c(n) = alpha_c + beta_c n`` for collective ``c``:

    allreduce            t_ar(n)
    hierarchical         t_reduce^intra(n) + t_ar^inter(n) + t_bcast^intra(n)
    ps                   t_reduce(n) + t_bcast(n)
    sharded_ps           one shard per rank in order: t_rs(n) + t_ag(n); otherwise shards run
                         concurrently on their owners: t_reduce(s n) + t_bcast(s n), s = the
                         largest share of one owner, plus alpha per extra shard
    row_sparse           t_ag(W * k (row_bytes + 8)) with k touched rows per rank
    fp16 / bf16          the plan on n / 2 bytes
    powersgd (rank r)    per matrix n x m: t_ar(4 r (n + m)) in two rounds, 1-D tensors
                         uncompressed; plus the matmuls at the profiled FLOP rate
    topk (ratio q)       t_ag(W q n 12 / 4) (values + int64 indices), plus the selection

Local SGD after its warm-up: buckets only all-reduced inside a host, and every ``period``
steps one all-reduce of the whole model, not overlapped: amortized ``t_ar(M) / period``.
ZeRO: the optimizer step shrinks to ``O / W`` and the updated shards are all-gathered
after it: ``+ t_ag(M)``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from autosync.executor.hooks import balanced_owners
from autosync.profiler import Profile
from autosync.strategy import Group, Strategy

TOPK_SELECT_S_PER_ELEMENT = 4e-9      # torch.topk + bookkeeping on one core, measured order of magnitude


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


class _Costs:
    def __init__(self, profile: Profile):
        self.net = profile.network
        self.world = profile.cluster.world_size
        self.rph = profile.cluster.ranks_per_node
        self.nodes = profile.cluster.nodes
        m = profile.model
        self.flop_rate = m.flops_per_step / max(m.forward_s + m.backward_s, 1e-9)

    def t(self, op: str, nbytes: float, scope: str = "world") -> float:
        return self.net.time(op, nbytes, scope) if nbytes > 0 else 0.0

    def plan(self, g: Group, owners: tuple[int, ...], nbytes: float, shapes: list, touched: list[float],
             elem_size: int) -> float:
        if self.world == 1:
            return 0.0
        if g.plan == "allreduce":
            return self.t("all_reduce", nbytes)
        if g.plan == "hierarchical_allreduce":
            if self.nodes == 1 or self.rph == 1:
                return self.t("all_reduce", nbytes)
            return (self.t("reduce", nbytes, "intra") + self.t("all_reduce", nbytes, "inter")
                    + self.t("broadcast", nbytes, "intra"))
        if g.plan == "ps":
            return self.t("reduce", nbytes) + self.t("broadcast", nbytes)
        if g.plan == "sharded_ps":
            if owners == tuple(range(self.world)):
                return self.t("reduce_scatter", nbytes) + self.t("all_gather", nbytes)
            share = max(owners.count(r) for r in set(owners)) / len(owners)
            extra = (len(owners) - 1) * self.net.fits["world"]["reduce"].alpha_s
            return self.t("reduce", nbytes * share) + self.t("broadcast", nbytes * share) + 2 * extra
        if g.plan == "row_sparse":
            total = 0.0
            for shape, frac in zip(shapes, touched):
                if len(shape) != 2:
                    total += self.t("all_reduce", math.prod(shape) * elem_size)
                    continue
                rows = frac * shape[0]
                total += self.t("all_gather", 8 * self.world) + self.t("all_gather", self.world * rows * 8) \
                    + self.t("all_gather", self.world * rows * shape[1] * elem_size)
            return total
        raise ValueError(g.plan)

    def segment(self, g: Group, owners, shapes: list, touched: list[float]) -> tuple[float, float]:
        """(seconds, bytes sent) of one segment."""
        elem = 4
        n = sum(math.prod(s) for s in shapes) * elem
        comp = g.compressor.name
        if comp in ("fp16", "bf16"):
            return self.plan(g, owners, n / 2, shapes, touched, 2), n / 2
        if comp == "powersgd":
            r = g.compressor.rank
            low, dense, flops = 0.0, 0.0, 0.0
            for s in shapes:
                rows, cols = s[0], math.prod(s[1:]) if len(s) > 1 else 1
                k = min(r, rows, cols)
                if len(s) > 1 and (rows + cols) * k < rows * cols / 2:
                    low += 4 * k * (rows + cols)
                    flops += 6 * rows * cols * k
                else:
                    dense += 4 * math.prod(s)
            t = self.t("all_reduce", dense) + self.t("all_reduce", low / 2) * 2 + flops / max(self.flop_rate, 1.0)
            return t, dense + low
        if comp == "topk":
            k = max(1, int(g.compressor.ratio * n / elem))
            sent = 12 * k
            return self.t("all_gather", self.world * sent) + n / elem * TOPK_SELECT_S_PER_ELEMENT, sent
        return self.plan(g, owners, n, shapes, touched, elem), n


def simulate(profile: Profile, strategy: Strategy) -> SimResult:
    """Predicted step time and its parts (see the module docstring for the model)."""
    m = profile.model
    params = m.params
    group_of = _resolve(profile, strategy)
    group_bytes = [0] * len(strategy.groups)
    for p, gi in zip(params, group_of):
        group_bytes[gi] += p.nbytes
    world = profile.cluster.world_size
    owners = balanced_owners(strategy, group_bytes, world)
    costs = _Costs(profile)
    local = strategy.sync.mode == "local_sgd"
    zero = strategy.optimizer_sharding == "zero"

    done = 0.0
    comm_total = 0.0
    bytes_per_plan: dict[str, float] = {}
    buckets = m.buckets(strategy.fusion.bucket_cap_mb)
    n_segments = 0
    for bucket in buckets:
        ready = max(params[i].ready_s for i in bucket)
        bucket_bytes = sum(params[i].nbytes for i in bucket)
        if local:
            t = costs.t("all_reduce", bucket_bytes, "intra") if costs.rph > 1 and costs.nodes > 1 else (
                costs.t("all_reduce", bucket_bytes) if costs.nodes == 1 else 0.0)
            bytes_per_plan["local"] = bytes_per_plan.get("local", 0.0) + bucket_bytes
            n_segments += 1
        else:
            t = 0.0
            run: list[int] = []
            for pos, i in enumerate(bucket + [-1]):
                if run and (i < 0 or group_of[i] != group_of[run[-1]]):
                    g = strategy.groups[group_of[run[-1]]]
                    seconds, sent = costs.segment(g, owners[group_of[run[-1]]], [params[j].shape for j in run],
                                                  [params[j].touched_rows for j in run])
                    t += seconds
                    key = g.plan if g.compressor.name == "none" else f"{g.plan}+{g.compressor.name}"
                    bytes_per_plan[key] = bytes_per_plan.get(key, 0.0) + sent
                    n_segments += 1
                    run = []
                if i >= 0:
                    run.append(i)
        start = max(ready, done)
        done = start + t
        comm_total += t

    optimizer_s = m.optimizer_s / world if zero else m.optimizer_s
    step = m.forward_s + max(m.backward_s, done) + optimizer_s
    if local:
        avg = costs.t("all_reduce", m.total_bytes) / strategy.sync.period
        step += avg
        comm_total += avg
    if zero and world > 1:
        gather = costs.t("all_gather", m.total_bytes)
        step += gather
        comm_total += gather
    compute = m.forward_s + m.backward_s + optimizer_s
    return SimResult(step, compute, comm_total, max(0.0, step - compute), bytes_per_plan, len(buckets), n_segments)
