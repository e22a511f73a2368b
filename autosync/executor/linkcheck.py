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
