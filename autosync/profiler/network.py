"""NetworkProfile: collective micro-benchmarks fitted to ``t(n) = alpha + beta * n``.

On the live process group, each collective (all_reduce, reduce, broadcast, all_gather,
reduce_scatter, send_recv) is timed for message sizes 4 KiB, 16 KiB, ... 64 MiB (``n`` is
the bytes of the full tensor; all_gather/reduce_scatter: the full output/input; send_recv:
one way, from half a round trip). A size's time is the median over repetitions of the
slowest rank. A sweep stops after the first size slower than ``max_op_s`` (so a 100 mbit
cluster is not asked for 64 MiB all-reduces); every rank takes that decision from the same
all-reduced number.

The fit minimizes ``sum(((alpha + beta n_i) - t_i)^2 / t_i)`` with ``alpha, beta >= 0``
(non-negative least squares): between absolute error, where the largest message decides
everything, and relative error, where noisy microsecond timings of tiny messages pull the
bandwidth off by 20%. Measured here it predicts >= 1 MiB messages within a few percent.

Scopes: ``world`` (all ranks); where hosts hold several ranks and there are several hosts
also ``intra`` (inside each host, all hosts at once) and ``inter`` (one rank per host).

A profile may also be *nominal*, from a cluster spec alone (:meth:`NetworkProfile.nominal`),
with the textbook costs for ``p`` ranks, latency ``a`` and bandwidth ``B``:
ring all_reduce ``2(p-1)a + 2(p-1)/p n/B``; all_gather, reduce_scatter ``(p-1)a + (p-1)/p n/B``;
reduce, broadcast ``ceil(log2 p) a + n/B``; send_recv ``a + n/B``.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from autosync.cluster import Cluster
from autosync.executor.launch import RankContext, RankPool

COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "send_recv")
SIZES = tuple(4096 * 4 ** i for i in range(8))     # 4 KiB .. 64 MiB
SOFTWARE_LATENCY_S = 50e-6                          # gloo's own per-message cost, for nominal profiles
INTRA_HOST_BPS = 40e9                               # nominal shared-memory-ish bandwidth inside a host


@dataclass
class Fit:
    """``t(n) = alpha_s + beta_s_per_byte * n``, and the points it was fitted to."""

    alpha_s: float
    beta_s_per_byte: float
    points: list[tuple[int, float]] = field(default_factory=list)

    def predict(self, nbytes: float) -> float:
        return self.alpha_s + self.beta_s_per_byte * nbytes

    @property
    def bandwidth_bps(self) -> float:
        return 8 / self.beta_s_per_byte if self.beta_s_per_byte > 0 else float("inf")

    @classmethod
    def from_points(cls, points: list[tuple[int, float]]) -> "Fit":
        from scipy.optimize import nnls

        n = np.array([p[0] for p in points], dtype=float)
        t = np.array([p[1] for p in points], dtype=float)
        w = 1 / np.sqrt(t)
        (alpha, beta), _ = nnls(np.stack([w, n * w], axis=1), t * w)
        return cls(float(alpha), float(beta), [(int(x), float(y)) for x, y in points])


@dataclass
class NetworkProfile:
    world_size: int
    ranks_per_host: int
    fits: dict[str, dict[str, Fit]]       # scope -> collective -> fit
    measured: bool = True

    def time(self, collective: str, nbytes: float, scope: str = "world") -> float:
        fits = self.fits.get(scope) or self.fits["world"]
        return fits[collective].predict(nbytes)

    def to_dict(self) -> dict:
        return {"world_size": self.world_size, "ranks_per_host": self.ranks_per_host, "measured": self.measured,
                "fits": {s: {c: {"alpha_s": f.alpha_s, "beta_s_per_byte": f.beta_s_per_byte,
                                 "points": [list(p) for p in f.points]} for c, f in fs.items()}
                         for s, fs in self.fits.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> "NetworkProfile":
        fits = {s: {c: Fit(f["alpha_s"], f["beta_s_per_byte"], [tuple(p) for p in f["points"]])
                    for c, f in fs.items()} for s, fs in d["fits"].items()}
        return cls(d["world_size"], d["ranks_per_host"], fits, d["measured"])

    @classmethod
    def nominal(cls, cluster: Cluster) -> "NetworkProfile":
        """Costs from the spec's numbers, without measuring (for clusters you do not have)."""
        worst = min(range(cluster.nodes), key=lambda k: cluster.link_of(k).rate_bps)
        if cluster.nodes > 1:
            bw, lat = cluster.path(worst, 0 if worst else 1)
        else:
            bw, lat = INTRA_HOST_BPS, 0.0

        def fits_for(p: int, bps: float, latency: float) -> dict[str, Fit]:
            a = latency + SOFTWARE_LATENCY_S
            inv = 8 / bps
            steps = max(1, math.ceil(math.log2(p))) if p > 1 else 1
            return {
                "all_reduce": Fit(2 * (p - 1) * a, 2 * (p - 1) / p * inv),
                "all_gather": Fit((p - 1) * a, (p - 1) / p * inv),
                "reduce_scatter": Fit((p - 1) * a, (p - 1) / p * inv),
                "reduce": Fit(steps * a, inv),
                "broadcast": Fit(steps * a, inv),
                "send_recv": Fit(a, inv),
            }

        fits = {"world": fits_for(cluster.world_size, bw, lat)}
        if cluster.nodes > 1 and cluster.ranks_per_node > 1:
            fits["intra"] = fits_for(cluster.ranks_per_node, INTRA_HOST_BPS, 0.0)
            fits["inter"] = fits_for(cluster.nodes, bw, lat)
        return cls(cluster.world_size, cluster.ranks_per_node, fits, measured=False)


# --- rank side --------------------------------------------------------------------------------

def _run_op(op: str, nbytes: int, group, group_ranks: list[int], me: int, peer: int | None, device: str = "cpu"):
    import functools

    import torch
    import torch.distributed as dist

    numel = max(1, nbytes // 4)
    p = len(group_ranks)
    ones = functools.partial(torch.ones, device=device)    # every buffer on the rank's device
    empty = functools.partial(torch.empty, device=device)
    if op == "all_reduce":
        t = ones(numel)
        return lambda: dist.all_reduce(t, group=group)
    if op == "reduce":
        t = ones(numel)
        return lambda: dist.reduce(t, dst=group_ranks[0], group=group)
    if op == "broadcast":
        t = ones(numel)
        return lambda: dist.broadcast(t, src=group_ranks[0], group=group)
    if op == "all_gather":
        out = empty(numel // p * p)
        inp = ones(numel // p)
        gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
        return lambda: gather(out, inp, group=group)
    if op == "reduce_scatter":
        inp = ones(numel // p * p)
        out = empty(numel // p)
        scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
        return lambda: scatter(out, inp, group=group)
    if op == "send_recv":
        from autosync.executor.device import p2p_device

        t = torch.ones(numel, device=p2p_device(dist.get_backend(group), device))
        if peer is None:
            return lambda: None
        first = me < peer

        def ping_pong() -> None:  # n bytes each way; half of it is one transfer
            if first:
                dist.send(t, peer)
                dist.recv(t, peer)
            else:
                dist.recv(t, peer)
                dist.send(t, peer)
        return ping_pong
    raise ValueError(op)


def _sweep(group, group_ranks: list[int], me: int, peer: int | None, sizes, max_op_s: float,
           reps: int, device: str = "cpu") -> dict[str, list[tuple[int, float]]]:
    import torch.distributed as dist

    from autosync.executor.device import now, reduce_values

    out: dict[str, list[tuple[int, float]]] = {}
    for op in COLLECTIVES:
        points = []
        for nbytes in sizes:
            fn = _run_op(op, nbytes, group, group_ranks, me, peer, device)
            fn()  # warm-up (connections, allocations, TCP window)
            times = []
            for _ in range(reps):
                dist.barrier(group=group)
                t0 = now(device)
                fn()
                times.append(now(device) - t0)   # synchronized: the collective's kernels are done
            worst = reduce_values([statistics.median(times)], "max", device, group=group)[0]
            seconds = worst / (2 if op == "send_recv" else 1)
            points.append((nbytes, seconds))
            if worst > max_op_s:
                break
        out[op] = points
    return out


def _bench_task(ctx: RankContext, sizes, max_op_s: float, reps: int) -> dict:
    import torch.distributed as dist

    rph, world = ctx.ranks_per_host, ctx.world_size
    nodes = world // rph
    results: dict[str, dict] = {}
    peer_world = rph if nodes > 1 else (1 if world > 1 else None)   # first rank of another host
    results["world"] = _sweep(dist.group.WORLD, list(range(world)), ctx.rank,
                              peer_world if ctx.rank == 0 else (0 if ctx.rank == peer_world else None),
                              sizes, max_op_s, reps, ctx.device)
    if nodes > 1 and rph > 1:
        intra = None
        for h in range(nodes):  # every rank creates every subgroup, in the same order
            g = dist.new_group(list(range(h * rph, (h + 1) * rph)))
            if h == ctx.rank // rph:
                intra = g
        leaders = dist.new_group(list(range(0, world, rph)))
        host0 = ctx.rank - ctx.rank % rph
        local = ctx.rank % rph
        peer = (host0 + 1 if local == 0 else host0) if local in (0, 1) else None
        results["intra"] = _sweep(intra, list(range(host0, host0 + rph)), ctx.rank, peer, sizes, max_op_s, reps,
                                  ctx.device)
        if local == 0:
            lead_peer = rph if ctx.rank == 0 else (0 if ctx.rank == rph else None)
            results["inter"] = _sweep(leaders, list(range(0, world, rph)), ctx.rank, lead_peer, sizes,
                                      max_op_s, reps, ctx.device)
        dist.barrier()
    return results


def profile_network(pool: RankPool, sizes=SIZES, max_op_s: float = 0.3, reps: int = 3,
                    timeout: float = 600.0) -> NetworkProfile:
    """Benchmark the pool's process group and fit alpha/beta per scope and collective.

    Each point is the median of ``reps`` timed runs (the slowest rank's): 3, so that one slow run on a busy host
    does not set the point (a median of 2 is their mean; a CI run once fitted 0.43 s for a 0.32 s all-reduce)."""
    per_rank = pool.run(_bench_task, tuple(sizes), max_op_s, reps, timeout=timeout)
    raw = dict(per_rank[0])
    fits = {scope: {op: Fit.from_points(points) for op, points in ops.items()} for scope, ops in raw.items()}
    return NetworkProfile(pool.world_size, pool.ranks_per_host, fits, measured=True)
