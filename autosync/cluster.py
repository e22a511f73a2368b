"""Cluster spec: hosts, ranks per host, and the link of every host.

Grammar::

    NODESxRANKS@LINK[;nodeK=LINK]...[;nodeK=cpu:SPEED]...[;stragglers=SLOWDOWNx@PERCENT%[,every=TIME]]
    LINK := BANDWIDTH[,LATENCY][,jitter=TIME][,loss=PERCENT%]
    BANDWIDTH := number + kbit|mbit|gbit          (1 mbit .. 100 gbit)
    TIME      := number + us|ms|s                 (latency <= 1 s)
    SPEED     := number in 0.05 .. 1              (the host's compute speed; 1 = a full share)

e.g. ``2x2@1gbit,200us``, ``3x1@500mbit;node2=100mbit``, ``2x1@100mbit,1ms,jitter=100us,loss=1%``,
``2x1@1gbit;node1=cpu:0.5`` (host 1 computes at half speed), ``4x1@1gbit;stragglers=3x@20%``
(intermittent stragglers: in each slice of ``every`` (default 500ms) of wall-clock time, with
probability 20% one rank drawn at random computes 3x slower for that slice).

Compute: a host's *speed* is the fraction of its fair share of the machine's cores its ranks
get (on an emulated cluster, a CPU limit on each of its ranks; see
:mod:`autosync.executor.emulate`); the intermittent stragglers slow one random rank at a time.

A link is a host's connection to the switch. The latency given is host-to-host one way:
each host link delays each direction by half of it, so hosts ``a`` and ``b`` see
``(lat_a + lat_b) / 2`` one way and ``min(rate_a, rate_b)`` of bandwidth. The same object
describes a real cluster (for prediction) and an emulated one (for measurement).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from autosync.errors import UserError

RATE_UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
MIN_RATE, MAX_RATE = 1e6, 100e9
MAX_LATENCY = 1.0
MIN_SPEED = 0.05
MAX_SLOWDOWN = 20.0
DEFAULT_SLICE_S = 0.5


class ClusterSpecError(UserError):
    """A cluster spec that does not parse or is out of range."""


def _fmt_rate(bps: float) -> str:
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bps >= scale and (bps / scale) == int(bps / scale):
            return f"{int(bps / scale)}{unit}"
    return f"{bps / 1e6:g}mbit"


def _fmt_time(seconds: float) -> str:
    us = round(seconds * 1e6)
    if us % 1000 == 0:
        return f"{us // 1000}ms"
    return f"{us}us"


@dataclass(frozen=True)
class Link:
    """One host's link: rate in bit/s, one-way host-to-host latency and jitter in s, loss fraction."""

    rate_bps: float
    latency_s: float = 0.0
    jitter_s: float = 0.0
    loss: float = 0.0

    def spec(self) -> str:
        parts = [_fmt_rate(self.rate_bps)]
        if self.latency_s or self.jitter_s or self.loss:
            parts.append(_fmt_time(self.latency_s))
        if self.jitter_s:
            parts.append(f"jitter={_fmt_time(self.jitter_s)}")
        if self.loss:
            parts.append(f"loss={self.loss * 100:g}%")
        return ",".join(parts)


@dataclass(frozen=True)
class Stragglers:
    """Intermittent stragglers: in each ``slice_s`` of wall-clock time, with probability ``fraction``, one rank
    drawn at random computes ``slowdown`` times slower (its CPU share divided by ``slowdown``) for that slice."""

    slowdown: float
    fraction: float
    slice_s: float = DEFAULT_SLICE_S

    def spec(self) -> str:
        text = f"stragglers={self.slowdown:g}x@{self.fraction * 100:g}%"
        return text + (f",every={_fmt_time(self.slice_s)}" if self.slice_s != DEFAULT_SLICE_S else "")


@dataclass(frozen=True)
class Cluster:
    nodes: int
    ranks_per_node: int
    link: Link
    overrides: tuple[tuple[int, Link], ...] = ()
    speeds: tuple[tuple[int, float], ...] = ()      # (node, compute speed < 1): hosts slower than a full share
    stragglers: Stragglers | None = None

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    def link_of(self, node: int) -> Link:
        return dict(self.overrides).get(node, self.link)

    @property
    def slowest_rate_bps(self) -> float:
        """The rate of the slowest host link (what a ring all-reduce across hosts is bound by)."""
        return min(self.link_of(k).rate_bps for k in range(self.nodes))

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def speed_of(self, node: int) -> float:
        """The compute speed of host ``node`` (1.0 = a full share of the machine)."""
        return dict(self.speeds).get(node, 1.0)

    @property
    def heterogeneous(self) -> bool:
        return bool(self.overrides)

    @property
    def min_speed(self) -> float:
        return min((s for _, s in self.speeds), default=1.0)

    @property
    def uneven_compute(self) -> bool:
        """Whether ranks compute at different speeds (uneven hosts or stragglers)."""
        return bool(self.speeds) or self.stragglers is not None

    def path(self, a: int, b: int) -> tuple[float, float]:
        """(bandwidth bit/s, one-way latency s) between hosts a and b."""
        la, lb = self.link_of(a), self.link_of(b)
        return min(la.rate_bps, lb.rate_bps), (la.latency_s + lb.latency_s) / 2

    def spec(self) -> str:
        """The canonical spec string (parse(c.spec()) == c)."""
        text = f"{self.nodes}x{self.ranks_per_node}@{self.link.spec()}"
        text += "".join(f";node{k}={link.spec()}" for k, link in self.overrides)
        text += "".join(f";node{k}=cpu:{speed:g}" for k, speed in self.speeds)
        return text + (f";{self.stragglers.spec()}" if self.stragglers else "")

    def __str__(self) -> str:
        return self.spec()

    @classmethod
    def parse(cls, text: str) -> "Cluster":
        return parse_cluster(text)


_HEAD = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*@\s*(.+)$", re.IGNORECASE)
_QTY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*([a-z%]*)\s*$", re.IGNORECASE)


def _quantity(text: str, units: dict[str, float], what: str, spec: str) -> float:
    m = _QTY.match(text)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in units:
        raise ClusterSpecError(f"cluster spec {spec!r}: {what} {text.strip()!r} needs a number and a unit "
                               f"({', '.join(units)})")
    return round(float(m.group(1)) * units[unit], 9)  # to the nanosecond: 100us == 100e-6


def _parse_link(text: str, spec: str, where: str) -> Link:
    parts = [p.strip() for p in text.split(",")]
    rate = _quantity(parts[0], RATE_UNITS, f"{where} bandwidth", spec)
    if not MIN_RATE <= rate <= MAX_RATE:
        raise ClusterSpecError(f"cluster spec {spec!r}: {where} bandwidth {parts[0]} is outside 1mbit..100gbit")
    latency = jitter = loss = 0.0
    for i, part in enumerate(parts[1:]):
        key, eq, value = part.partition("=")
        key = key.strip().lower()
        if not eq and i == 0:
            latency = _quantity(part, TIME_UNITS, f"{where} latency", spec)
        elif key == "jitter":
            jitter = _quantity(value, TIME_UNITS, f"{where} jitter", spec)
        elif key == "loss":
            m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*%\s*", value)
            if not m:
                raise ClusterSpecError(f"cluster spec {spec!r}: {where} loss {value.strip()!r} must be a percentage "
                                       "like 1%")
            loss = float(m.group(1)) / 100
            if loss >= 1:
                raise ClusterSpecError(f"cluster spec {spec!r}: {where} loss must be below 100%")
        else:
            raise ClusterSpecError(f"cluster spec {spec!r}: unknown {where} option {part!r} "
                                   "(expected LATENCY, jitter=TIME or loss=PERCENT%)")
    if latency > MAX_LATENCY:
        raise ClusterSpecError(f"cluster spec {spec!r}: {where} latency {_fmt_time(latency)} is over 1 s")
    if jitter > latency and jitter:
        raise ClusterSpecError(f"cluster spec {spec!r}: {where} jitter must not exceed the latency")
    return Link(rate, latency, jitter, loss)


def parse_cluster(text: str) -> Cluster:
    """Parse a spec string; ClusterSpecError names what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise ClusterSpecError("cluster spec is empty: expected NODESxRANKS@BANDWIDTH[,LATENCY], e.g. 2x2@1gbit,200us")
    head, *overrides = text.split(";")
    m = _HEAD.match(head)
    if not m:
        raise ClusterSpecError(f"cluster spec {text!r}: expected NODESxRANKS@BANDWIDTH[,LATENCY], e.g. 2x2@1gbit,200us")
    nodes, ranks = int(m.group(1)), int(m.group(2))
    if nodes < 1 or ranks < 1:
        raise ClusterSpecError(f"cluster spec {text!r}: nodes and ranks per node must be at least 1")
    if nodes > 64 or ranks > 64:
        raise ClusterSpecError(f"cluster spec {text!r}: at most 64 nodes and 64 ranks per node")
    link = _parse_link(m.group(3), text, "link")
    found: dict[int, Link] = {}
    speeds: dict[int, float] = {}
    stragglers = None
    for item in overrides:
        if not item.strip():
            continue
        sm = re.fullmatch(r"\s*stragglers\s*=\s*(.+)", item, re.IGNORECASE)
        if sm:
            if stragglers is not None:
                raise ClusterSpecError(f"cluster spec {text!r}: stragglers are given twice")
            stragglers = _parse_stragglers(sm.group(1), text)
            continue
        om = re.fullmatch(r"\s*node(\d+)\s*=\s*(.+)", item, re.IGNORECASE)
        if not om:
            raise ClusterSpecError(f"cluster spec {text!r}: override {item.strip()!r} must look like nodeK=BANDWIDTH, "
                                   "nodeK=cpu:SPEED or stragglers=SLOWDOWNx@PERCENT%")
        k = int(om.group(1))
        if k >= nodes:
            raise ClusterSpecError(f"cluster spec {text!r}: node{k} does not exist (nodes are node0..node{nodes - 1})")
        value = om.group(2).strip()
        if value.lower().startswith("cpu:"):
            if k in speeds:
                raise ClusterSpecError(f"cluster spec {text!r}: node{k}'s compute speed is given twice")
            speeds[k] = _parse_speed(value[4:], text, f"node{k}")
            continue
        if k in found:
            raise ClusterSpecError(f"cluster spec {text!r}: node{k} is overridden twice")
        found[k] = _parse_link(value, text, f"node{k}")
    return Cluster(nodes, ranks, link, tuple(sorted((k, v) for k, v in found.items() if v != link)),
                   tuple(sorted((k, s) for k, s in speeds.items() if s != 1.0)), stragglers)


def _parse_speed(value: str, spec: str, where: str) -> float:
    try:
        speed = float(value)
    except ValueError:
        speed = float("nan")
    if not MIN_SPEED <= speed <= 1.0:
        raise ClusterSpecError(f"cluster spec {spec!r}: {where} cpu speed {value.strip()!r} must be a number in "
                               f"{MIN_SPEED:g}..1 (the fraction of a full share of the machine; hosts can be slowed, "
                               "not sped up)")
    return round(speed, 6)


def _parse_stragglers(value: str, spec: str) -> Stragglers:
    head, *opts = [p.strip() for p in value.split(",")]
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*x\s*@\s*([0-9]*\.?[0-9]+)\s*%", head, re.IGNORECASE)
    if not m:
        raise ClusterSpecError(f"cluster spec {spec!r}: stragglers {value.strip()!r} must look like "
                               "SLOWDOWNx@PERCENT% (e.g. 3x@20%: one random rank 3x slower 20% of the time)")
    slowdown, fraction = float(m.group(1)), float(m.group(2)) / 100
    if not 1.0 < slowdown <= MAX_SLOWDOWN:
        raise ClusterSpecError(f"cluster spec {spec!r}: straggler slowdown must be above 1 and at most "
                               f"{MAX_SLOWDOWN:g}")
    if not 0.0 < fraction < 1.0:
        raise ClusterSpecError(f"cluster spec {spec!r}: straggler percentage must be between 0% and 100%")
    slice_s = DEFAULT_SLICE_S
    for opt in opts:
        key, eq, v = opt.partition("=")
        if key.strip().lower() != "every" or not eq:
            raise ClusterSpecError(f"cluster spec {spec!r}: unknown stragglers option {opt!r} (expected every=TIME)")
        slice_s = _quantity(v, TIME_UNITS, "stragglers every", spec)
        if not 0.05 <= slice_s <= 60:
            raise ClusterSpecError(f"cluster spec {spec!r}: stragglers every= must be within 50ms..60s")
    return Stragglers(round(slowdown, 6), round(fraction, 6), slice_s)
