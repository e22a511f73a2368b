"""NetworkProfile: collective micro-benchmarks fitted to ``t(n) = alpha + beta * n``.

On the live process group, each collective (all_reduce, reduce, broadcast, all_gather,
reduce_scatter, send_recv) is timed for message sizes 4 KiB, 16 KiB, ... 64 MiB (``n`` is
the bytes of the full tensor; all_gather/reduce_scatter: the full output/input; send_recv:
one way, from half a round trip). A size's time is the median over repetitions of the
slowest rank. A sweep stops after the first size slower than ``max_op_s`` (so a 100 mbit
cluster is not asked for 64 MiB all-reduces), or, in the live bench of a training, before the
first size predicted slower (``ahead``); every rank takes that decision from the same
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
from dataclasses import dataclass, field

import numpy as np

from autosync.cluster import Cluster

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
