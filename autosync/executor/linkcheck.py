"""Measure host links with torch.distributed point-to-point transfers and a ping-pong.

For host ``k`` the pair is (first rank of host k, first rank of another host). Latency is
half the best round trip of a 4-byte ping-pong (the median is at the mercy of wake-up
delays of 1-2 ms on a busy 2-core VM); bandwidth is ``bytes / (t - rtt)`` for
a transfer from host k, where ``t`` runs from the receiver's go-signal to the last byte,
median of a few repetitions after a warm-up transfer (TCP's window opens first).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from autosync.cluster import Cluster
from autosync.executor.launch import RankContext, RankPool


@dataclass(frozen=True)
class LinkMeasurement:
    host: int
    peer: int
    configured_bps: float
    configured_latency_s: float
    measured_bps: float
    measured_latency_s: float


def _pair_task(ctx: RankContext, a: int, b: int, nbytes: int, reps: int, pings: int) -> tuple[float, float]:
    import torch
    import torch.distributed as dist

    dist.barrier()
    if ctx.rank not in (a, b):
        dist.barrier()
        return 0.0, 0.0
    peer = b if ctx.rank == a else a
    token = torch.zeros(1)
    rtts = []
    for _ in range(pings):
        t0 = time.perf_counter()
        if ctx.rank == b:
            dist.send(token, peer)
            dist.recv(token, peer)
        else:
            dist.recv(token, peer)
            dist.send(token, peer)
        rtts.append(time.perf_counter() - t0)
    rtt = min(rtts[1:])
    payload = torch.zeros(nbytes // 4)
    warm = torch.zeros(max(1, nbytes // 16))
    times = []
    for i in range(reps + 1):
        t0 = time.perf_counter()
        if ctx.rank == b:  # receiver gives the go, then times until the last byte
            dist.send(token, peer)
            dist.recv(warm if i == 0 else payload, peer)
        else:
            dist.recv(token, peer)
            dist.send(warm if i == 0 else payload, peer)
        if i:
            times.append(time.perf_counter() - t0)
    dist.barrier()
    if ctx.rank != b:
        return 0.0, 0.0
    transfer = max(statistics.median(times) - rtt, 1e-9)
    return nbytes * 8 / transfer, rtt / 2


def check_links(pool: RankPool, cluster: Cluster, seconds: float = 0.5, reps: int = 3,
                pings: int = 21, timeout: float = 300.0) -> list[LinkMeasurement]:
    """Measure every host link of ``cluster`` on the ranks of ``pool`` (one pair per host)."""
    if cluster.nodes < 2:
        return []
    out = []
    for host in range(cluster.nodes):
        peer = 1 if host == 0 else 0
        rate, latency = cluster.path(host, peer)
        nbytes = int(min(max(rate / 8 * seconds, 1 << 20), 256 << 20)) // 4 * 4
        a, b = host * cluster.ranks_per_node, peer * cluster.ranks_per_node
        results = pool.run(_pair_task, a, b, nbytes, reps, pings, timeout=timeout)
        bps, lat = results[b]
        out.append(LinkMeasurement(host, peer, rate, latency, bps, lat))
    return out


def check_paths(pool: RankPool, cluster: Cluster, seconds: float = 0.25, reps: int = 2, pings: int = 5,
                timeout: float = 300.0) -> list[list[float]]:
    """The bandwidth (bit/s) of every host-to-host path, from a transfer between the first ranks of each pair
    (sized for ``seconds`` at the spec's rate); the diagonal is 0."""
    n = cluster.nodes
    out = [[0.0] * n for _ in range(n)]
    for a in range(n):
        for b in range(a + 1, n):
            rate, _ = cluster.path(a, b)
            nbytes = int(min(max(rate / 8 * seconds, 1 << 18), 64 << 20)) // 4 * 4
            ra, rb = a * cluster.ranks_per_node, b * cluster.ranks_per_node
            bps, _ = pool.run(_pair_task, ra, rb, nbytes, reps, pings, timeout=timeout)[rb]
            out[a][b] = out[b][a] = round(bps, 0)
    return out


@dataclass(frozen=True)
class ComputeMeasurement:
    host: int
    configured_speed: float        # the spec's speed of the host (stragglers not included)
    measured_speed: float          # median over the host's ranks of the per-round rate / rate with every limit lifted
    rate: float                    # matrix products per second of the host's ranks (median)


def _compute_task(ctx: RankContext, seconds: float) -> float:
    """Matrix products per second while every rank computes at once (the ranks share the machine's cores)."""
    import torch
    import torch.distributed as dist

    a = torch.randn(128, 128)
    dist.barrier()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(8):
            a = torch.tanh(a @ a)
        n += 8
    rate = n / (time.perf_counter() - t0)
    dist.barrier()
    return rate


def check_compute(pool: RankPool, cluster: Cluster, limits=None, seconds: float = 2.0,
                  timeout: float = 300.0, rounds: int = 3) -> list[ComputeMeasurement]:
    """Measure each host's compute speed on the ranks of ``pool``.

    Every rank runs the same matrix products, all at once, in ``rounds`` interleaved pairs of
    ``seconds / rounds / 2`` each: with the CPU limits of ``limits`` (an
    :class:`~autosync.executor.emulate.CpuLimits`) lifted (the full-share reference) and applied.
    A rank's speed is the median over the rounds of its limited rate over the reference rate of
    the same round: load from elsewhere shifts both halves of a pair, and one pair taken under
    load does not move the median. (Rates on this 2-core machine swing 2x between rounds: a median
    limited rate over the best reference read 0.55 for an unlimited host; CI once read 0.78.)
    A host's speed is its ranks' median. Without ``limits`` (a real cluster, or even compute) it is
    each host's median rate over the fastest host's.
    """
    if limits is None:
        rates = [statistics.median(r) for r in zip(*(pool.run(_compute_task, seconds / rounds, timeout=timeout)
                                                       for _ in range(rounds)))]
        ratios = [rate / max(rates) for rate in rates]
    else:
        pairs = []
        for _ in range(rounds):
            limits.lift(True)
            try:
                free = pool.run(_compute_task, seconds / rounds / 2, timeout=timeout)
            finally:
                limits.lift(False)
            pairs.append((free, pool.run(_compute_task, seconds / rounds / 2, timeout=timeout)))
        rates = [statistics.median(r) for r in zip(*(limited for _, limited in pairs))]
        ratios = [statistics.median(r) for r in zip(*([l / f for f, l in zip(free, limited)]
                                                      for free, limited in pairs))]
    out = []
    for host in range(cluster.nodes):
        ranks = range(host * cluster.ranks_per_node, (host + 1) * cluster.ranks_per_node)
        out.append(ComputeMeasurement(host, cluster.speed_of(host),
                                      statistics.median(ratios[r] for r in ranks),
                                      statistics.median(rates[r] for r in ranks)))
    return out
