"""``selective {islands, period, warmup_steps}``: selective receivers, chosen by path bandwidth.

After SELMCAST (and MALT's, Orpheus' and SFB's partial broadcasts): in peer-to-peer averaging a
rank need not send every update to every peer every step. ``islands`` splits the hosts into
groups (``[[0, 1], [2]]``: hosts 0 and 1 together, host 2 alone). After ``warmup_steps`` bsp
steps, each step a rank's gradient reaches only the ranks of its own island (one all-reduce per
bucket on the island's ranks, an average over the island), and every ``period`` steps torch's
``PeriodicModelAverager`` averages the parameters of all ranks, across the slow paths. One
island of every host would be bsp; one island per host is ``local_sgd``; selective lies between::

    bucket cost = max over islands I of t_ar^I(n)                                       lossy
    t_ar^I(n)   = 0 (one rank) | t_ar^intra(n) (one host) | 2(p-1) a + 2 (p-1)/p n / B_I
                  (p ranks, B_I the slowest path inside I, a the world all-reduce's per-hop latency)
    step cost  += t_ar(M) / period                              (M = the model's bytes, not overlapped)

**Receivers from the per-path bandwidth** (:func:`frontier`): ``B[a][b]`` is the bandwidth of the
path between hosts a and b, measured (the profile's ``path_bps``, one point-to-point transfer
per pair of hosts) or, without a measurement, the spec's (``min`` of the two host links). For
each threshold ``tau`` among the distinct path bandwidths, the islands are the connected
components of the hosts joined by paths of at least ``tau``. Measured bandwidths first fall into speed
classes (:func:`speed_classes`: paths within :data:`SAME_SPEED` of a faster one are one speed), so that the
noise of a measurement (9.54 against 9.52 Gbit/s on an even cluster) makes no island. Each candidate has a *time* (the
slowest island's all-reduce of the model, as above) and a *reach* (the mean fraction of the other
ranks that receive a rank's update each step). The candidates no other beats on both are the
Pareto frontier; bsp (reach 1) and local SGD (every host alone) are modes of their own and left
out. The search picks among the frontier's islands (and the period); the baseline ``selective``
takes the frontier point of greatest reach whose time is at most :data:`SLACK` times the
fastest's. On an even cluster there is no frontier and the mode is not offered.

Islands are host numbers (a rank's host is ``rank // ranks_per_host``), so a strategy applies to
any job with the same hosts. It cannot be combined with ZeRO.
"""
from __future__ import annotations

from typing import Any

from autosync import validation as v
from autosync.plans.base import Field
from autosync.plans.local_sgd import LocalSGD
from autosync.plans.outer import OUTER_CODECS, OUTER_COMPRESSOR, codec_of

PERIODS = (2, 4, 8)
SEARCH_WARMUP_STEPS = 2
SLACK = 2.0          # the baseline's time budget: at most this many times the fastest frontier point's
SAME_SPEED = 0.8     # a path at least this fraction of its class's fastest is the same speed (links measure within 15%)


def islands_text(islands) -> str:
    """``[[0, 1], [2]]`` -> ``"0,1|2"`` (the search space's categorical value; tables)."""
    return "|".join(",".join(str(h) for h in island) for island in islands)


def parse_islands(text: str) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(int(h) for h in part.split(",")) for part in text.split("|"))


def speed_classes(bw: list[list[float]], same: float = SAME_SPEED) -> list[list[float]]:
    """``bw`` with each path set to the slowest path of its speed class.

    Distinct bandwidths, fastest first, join the current class while at least ``same`` times its fastest; a slower
    one starts a new class. An even cluster measured with noise becomes one class (no islands)."""
    classes: list[list[float]] = []
    for x in sorted({x for row in bw for x in row if x > 0}, reverse=True):
        if classes and x >= classes[-1][0] * same:
            classes[-1].append(x)
        else:
            classes.append([x])
    slowest = {x: c[-1] for c in classes for x in c}
    return [[slowest.get(x, x) for x in row] for row in bw]


def components(bw: list[list[float]], tau: float) -> tuple[tuple[int, ...], ...]:
    """The hosts' connected components over paths of at least ``tau`` bit/s, each sorted, in order of first host."""
    n = len(bw)
    seen: set[int] = set()
    out = []
    for start in range(n):
        if start in seen:
            continue
        stack, comp = [start], set()
        while stack:
            a = stack.pop()
            if a in comp:
                continue
            comp.add(a)
            stack += [b for b in range(n) if b != a and b not in comp and bw[a][b] >= tau]
        seen |= comp
        out.append(tuple(sorted(comp)))
    return tuple(out)


def island_time(islands, bw: list[list[float]], nbytes: float, ranks_per_host: int, hop_latency_s: float,
                intra_time) -> float:
    """Seconds of the slowest island's all-reduce of ``nbytes`` (module docstring); ``intra_time(n)`` inside a host."""
    worst = 0.0
    for island in islands:
        p = len(island) * ranks_per_host
        if p == 1 or nbytes <= 0:
            continue
        if len(island) == 1:
            t = intra_time(nbytes)
        else:
            slowest = min(bw[a][b] for a in island for b in island if a != b)
            t = 2 * (p - 1) * hop_latency_s + 2 * (p - 1) / p * nbytes * 8 / slowest
        worst = max(worst, t)
    return worst


def reach(islands, ranks_per_host: int) -> float:
    """The mean fraction of the other ranks that receive a rank's update each step."""
    world = sum(len(i) for i in islands) * ranks_per_host
    if world <= 1:
        return 1.0
    return sum(len(i) * ranks_per_host * (len(i) * ranks_per_host - 1) for i in islands) / (world * (world - 1))


def frontier(bw: list[list[float]], nbytes: float, ranks_per_host: int = 1, hop_latency_s: float = 0.0,
             intra_time=lambda n: 0.0) -> list[dict[str, Any]]:
    """The Pareto frontier of island choices (module docstring), fastest first.

    Each point: ``islands`` (tuple of host tuples), ``text``, ``threshold_bps``, ``time_s`` and ``reach``."""
    n = len(bw)
    bw = speed_classes(bw)
    taus = sorted({bw[a][b] for a in range(n) for b in range(n) if a != b}, reverse=True)
    points: dict[tuple, dict] = {}
    for tau in taus:
        islands = components(bw, tau)
        if len(islands) == 1 or (len(islands) == n and ranks_per_host > 1) or islands in points:
            continue    # bsp, or local SGD (each host alone, with several ranks per host)
        if len(islands) == n:
            continue    # every rank alone: local SGD with one rank per host
        points[islands] = {"islands": islands, "text": islands_text(islands), "threshold_bps": tau,
                           "time_s": island_time(islands, bw, nbytes, ranks_per_host, hop_latency_s, intra_time),
                           "reach": reach(islands, ranks_per_host)}
    cands = sorted(points.values(), key=lambda p: (p["time_s"], -p["reach"]))
    out: list[dict] = []
    for p in cands:   # keep a point only if it reaches more than every faster point
        if not out or p["reach"] > out[-1]["reach"]:
            out.append(p)
    return out


def pick(points: list[dict[str, Any]], slack: float = SLACK) -> dict[str, Any] | None:
    """The frontier point of greatest reach whose time is at most ``slack`` times the fastest's (the baseline)."""
    if not points:
        return None
    budget = points[0]["time_s"] * slack
    return max((p for p in points if p["time_s"] <= budget or p is points[0]), key=lambda p: p["reach"])


def profile_frontier(profile) -> list[dict[str, Any]]:
    """:func:`frontier` of a profile: its per-path bandwidths, the model's bytes, the world all-reduce's latency."""
    c = profile.cluster
    if c.nodes < 3:
        return []
    bw, _ = profile.path_bps()
    world_alpha = profile.network.fits["world"]["all_reduce"].alpha_s
    hop = world_alpha / max(1, 2 * (c.world_size - 1))
    return frontier(bw, profile.model.total_bytes, c.ranks_per_node, hop,
                    lambda n: profile.network.time("all_reduce", n, "intra"))


def read_islands(islands, where: str) -> tuple[tuple[int, ...], ...]:
    """``islands``: a list of host lists (or ``'0,1|2'``) that covers every host once; sorted."""
    if isinstance(islands, str):
        try:
            islands = parse_islands(islands)
        except ValueError:
            v.fail(where, f"expected host lists like [[0, 1], [2]] or '0,1|2', got {islands!r}")
    if not isinstance(islands, (list, tuple)) or not islands or not all(
            isinstance(i, (list, tuple)) and i and all(isinstance(h, int) and not isinstance(h, bool) and h >= 0
                                                        for h in i) for i in islands):
        v.fail(where, f"expected a non-empty list of non-empty lists of host numbers, got {islands!r}")
    hosts = sorted(h for i in islands for h in i)
    if hosts != list(range(len(hosts))):
        v.fail(where, f"every host 0..{max(hosts)} must be in exactly one island, got {islands!r}")
    return tuple(sorted(tuple(sorted(i)) for i in islands))


class Selective(LocalSGD):
    name = "selective"
    lossy = True
    needs_hosts = True
    allows_zero = False
    bypasses_plans = True
    host_local_after_warmup = False     # its local steps average over islands of hosts (run_local)
    fields = {"islands": Field(read=read_islands, unused=(), required=(
                  "required for mode selective: the hosts that average every step, as a list of host lists (e.g. "
                  "[[0, 1], [2]]); `autosync tune` chooses them from the per-path bandwidth")),
              "period": Field(4, 2, 10_000, unused=1), "warmup_steps": Field(10, 0, 1_000_000, unused=0),
              "outer_compressor": OUTER_COMPRESSOR}
    features = {"selective": 0.0, "selective_period": 1.0, "selective_reach": 1.0, "outer_bytes": 1.0}

    def suggest(self, trial, profile=None) -> dict:
        points = profile_frontier(profile) if profile is not None else []
        text = trial.suggest_categorical("selective_islands", [p["text"] for p in points])
        return {"islands": text, "warmup_steps": SEARCH_WARMUP_STEPS,
                "period": trial.suggest_categorical("selective_period", PERIODS)}

    def offered(self, profile) -> bool:
        return bool(profile_frontier(profile))

    def make_state(self, comm, sync):
        """The island subgroup of this rank (None when its island is one rank): every rank creates every island's
        group, in order."""
        import torch.distributed as dist

        hosts = comm.world // comm.ranks_per_host
        covered = sum(len(i) for i in sync.islands)
        if covered != hosts:
            raise v.StrategyError(f"sync.islands: covers {covered} hosts, but this job has {hosts} "
                                  f"({comm.world} ranks, {comm.ranks_per_host} per host)")
        ranks = dist.get_process_group_ranks(comm.pg)
        mine = None
        for island in sync.islands:
            members = [ranks[h * comm.ranks_per_host + r] for h in island for r in range(comm.ranks_per_host)]
            if len(members) == 1:
                continue
            group = comm.subgroup(members)
            if comm.rank // comm.ranks_per_host in island:
                mine = (group, len(members))
        return mine

    def run_local(self, comm, buffer) -> None:
        """Average ``buffer`` over the ranks of this rank's island only."""
        import torch.distributed as dist

        if comm.mode_state is not None:
            group, size = comm.mode_state
            dist.all_reduce(buffer, group=group)
            buffer.div_(size)

    def bucket_cost(self, sim, nbytes: float, sync=None) -> float | None:
        bw = sim.paths
        hop = sim.alpha("all_reduce") / max(1, 2 * (sim.world - 1))
        return island_time(sync.islands, bw, nbytes, sim.ranks_per_node, hop,
                           lambda n: sim.t("all_reduce", n, "intra"))

    def sync_features(self, sync) -> dict[str, float]:
        return {"selective": 1.0, "selective_period": float(sync.period),
                "selective_reach": reach(sync.islands, 1), "outer_bytes": OUTER_CODECS[codec_of(sync)] / 4}


MODE = Selective()
