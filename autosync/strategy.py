"""Strategy: how each group of parameters is synchronized between ranks.

A strategy is a frozen, validated value with one versioned YAML/JSON form::

    autosync: 1
    sync: {mode: bsp}                      # or {mode: local_sgd, period: 4, warmup_steps: 10}
    fusion: {bucket_cap_mb: 25, gradient_as_bucket_view: true, static_graph: false}
    optimizer_sharding: none               # none | zero
    groups:                                # ordered; a parameter belongs to the first group that matches
      - match: "encoder.*"                 # fnmatch glob, or a list of globs, over parameter names
        plan: allreduce
      - match: "*"                         # the catch-all: every parameter no other group matched
        compressor: {name: fp16}

Every parameter must be covered by exactly one group: two groups matching the same
parameter is an error, except that a ``"*"`` group (at most one) takes what the others
leave. Every public constructor validates; errors are :class:`StrategyError` whose message
names the field path and the allowed values. ``canonical()`` is the sorted, fully
spelled-out dict; ``hash`` is the SHA-256 of its JSON, stable across runs and machines.
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from autosync.errors import UserError

SCHEMA_VERSION = 1
PLANS = ("allreduce", "hierarchical_allreduce", "ps", "sharded_ps", "row_sparse")
COMPRESSORS = ("none", "fp16", "bf16", "powersgd", "topk")
SYNC_MODES = ("bsp", "local_sgd")
SHARDING = ("none", "zero")
LOSSY_COMPRESSORS = ("fp16", "bf16", "powersgd", "topk")


class StrategyError(UserError):
    """A strategy that is malformed, or does not fit the model or the world it is used with."""


def _fail(path: str, msg: str) -> None:
    raise StrategyError(f"{path}: {msg}")


def _choice(path: str, value: Any, allowed: Iterable[str]) -> str:
    allowed = tuple(allowed)
    if value not in allowed:
        _fail(path, f"{value!r} is not one of {', '.join(allowed)}")
    return value


def _int(path: str, value: Any, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(path, f"expected an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        _fail(path, f"{value} is out of range [{lo}, {hi if hi is not None else 'inf'}]")
    return value


def _number(path: str, value: Any, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(path, f"expected a number, got {value!r}")
    if not lo < value <= hi:
        _fail(path, f"{value} is out of range ({lo}, {hi}]")
    return float(value)


def _bool(path: str, value: Any) -> bool:
    if not isinstance(value, bool):
        _fail(path, f"expected true or false, got {value!r}")
    return value


def _mapping(path: str, value: Any, keys: Iterable[str]) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        _fail(path, f"expected a mapping, got {type(value).__name__}")
    unknown = sorted(set(value) - set(keys))
    if unknown:
        _fail(f"{path}.{unknown[0]}", f"unknown field; allowed: {', '.join(keys)}")
    return value


@dataclass(frozen=True)
class Compressor:
    """Gradient compression: none | fp16 | bf16 | powersgd {rank} | topk {ratio} (error feedback)."""

    name: str = "none"
    rank: int | None = None       # powersgd: rank of the low-rank approximation
    ratio: float | None = None    # topk: fraction of elements sent

    @classmethod
    def parse(cls, raw: Any, path: str) -> "Compressor":
        if isinstance(raw, str):
            raw = {"name": raw}
        raw = _mapping(path, raw, ("name", "rank", "ratio"))
        name = _choice(f"{path}.name", raw.get("name", "none"), COMPRESSORS)
        rank = ratio = None
        if name == "powersgd":
            rank = _int(f"{path}.rank", raw.get("rank", 4), 1, 1024)
        elif "rank" in raw:
            _fail(f"{path}.rank", "only the powersgd compressor takes a rank")
        if name == "topk":
            ratio = _number(f"{path}.ratio", raw.get("ratio", 0.01), 0.0, 1.0)
        elif "ratio" in raw:
            _fail(f"{path}.ratio", "only the topk compressor takes a ratio")
        return cls(name, rank, ratio)

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"name": self.name}
        if self.rank is not None:
            d["rank"] = self.rank
        if self.ratio is not None:
            d["ratio"] = self.ratio
        return d

    @property
    def lossy(self) -> bool:
        return self.name in LOSSY_COMPRESSORS


@dataclass(frozen=True)
class Group:
    """One ordered group: the parameters whose names match ``match`` and their plan."""

    match: tuple[str, ...] = ("*",)
    plan: str = "allreduce"
    compressor: Compressor = field(default_factory=Compressor)
    partitions: int = 1                   # sharded_ps: number of shards
    placement: tuple[int, ...] | None = None  # ps / sharded_ps: owner ranks; None = balanced by bytes

    @classmethod
    def parse(cls, raw: Any, path: str) -> "Group":
        raw = _mapping(path, raw, ("match", "plan", "compressor", "partitions", "placement"))
        match = raw.get("match", "*")
        match = (match,) if isinstance(match, str) else match
        if (not isinstance(match, (list, tuple)) or not match
                or not all(isinstance(m, str) and m for m in match)):
            _fail(f"{path}.match", f"expected a glob or a non-empty list of globs, got {raw.get('match')!r}")
        match = tuple(match)
        plan = _choice(f"{path}.plan", raw.get("plan", "allreduce"), PLANS)
        comp = Compressor.parse(raw.get("compressor", "none"), f"{path}.compressor")
        if comp.name in ("powersgd", "topk") and plan != "allreduce":
            _fail(f"{path}.compressor.name", f"{comp.name} works only with plan allreduce, not {plan}")
        partitions = _int(f"{path}.partitions", raw.get("partitions", 1), 1, 4096)
        if partitions > 1 and plan != "sharded_ps":
            _fail(f"{path}.partitions", "only plan sharded_ps takes partitions")
        placement = raw.get("placement")
        if placement is not None:
            if plan not in ("ps", "sharded_ps"):
                _fail(f"{path}.placement", "only plans ps and sharded_ps take a placement")
            if not isinstance(placement, (list, tuple)):
                _fail(f"{path}.placement", f"expected a list of ranks, got {placement!r}")
            placement = tuple(_int(f"{path}.placement[{i}]", r, 0) for i, r in enumerate(placement))
            want = partitions if plan == "sharded_ps" else 1
            if len(placement) != want:
                _fail(f"{path}.placement", f"expected {want} owner rank(s), got {len(placement)}")
        return cls(match, plan, comp, partitions, placement)

    @property
    def is_catch_all(self) -> bool:
        return self.match == ("*",)

    def matches(self, name: str) -> bool:
        literal, globs = self._patterns
        return name in literal or any(fnmatch.fnmatchcase(name, m) for m in globs)

    @property
    def _patterns(self) -> tuple[frozenset[str], tuple[str, ...]]:
        """(exact names, real globs): exact names are looked up, not matched (groups of hundreds of names)."""
        cached = self.__dict__.get("_pattern_cache")
        if cached is None:
            is_glob = [any(c in m for c in "*?[") for m in self.match]
            cached = (frozenset(m for m, g in zip(self.match, is_glob) if not g),
                      tuple(m for m, g in zip(self.match, is_glob) if g))
            object.__setattr__(self, "_pattern_cache", cached)
        return cached

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"match": self.match[0] if len(self.match) == 1 else list(self.match), "plan": self.plan, "compressor": self.compressor.to_dict()}
        if self.plan == "sharded_ps":
            d["partitions"] = self.partitions
        if self.placement is not None:
            d["placement"] = list(self.placement)
        return d


@dataclass(frozen=True)
class Sync:
    """bsp (every step) or local_sgd (torch's post-local SGD: global averaging every ``period`` steps)."""

    mode: str = "bsp"
    period: int = 1
    warmup_steps: int = 0

    @classmethod
    def parse(cls, raw: Any, path: str = "sync") -> "Sync":
        if isinstance(raw, str):
            raw = {"mode": raw}
        raw = _mapping(path, raw, ("mode", "period", "warmup_steps"))
        mode = _choice(f"{path}.mode", raw.get("mode", "bsp"), SYNC_MODES)
        if mode == "bsp":
            for k in ("period", "warmup_steps"):
                if k in raw:
                    _fail(f"{path}.{k}", "only mode local_sgd takes it")
            return cls()
        return cls(mode, _int(f"{path}.period", raw.get("period", 4), 2, 10_000),
                   _int(f"{path}.warmup_steps", raw.get("warmup_steps", 10), 0, 1_000_000))

    def to_dict(self) -> dict:
        if self.mode == "bsp":
            return {"mode": "bsp"}
        return {"mode": self.mode, "period": self.period, "warmup_steps": self.warmup_steps}


@dataclass(frozen=True)
class Fusion:
    """DDP bucketing options (see torch.nn.parallel.DistributedDataParallel)."""

    bucket_cap_mb: float = 25.0
    gradient_as_bucket_view: bool = True
    static_graph: bool = False

    @classmethod
    def parse(cls, raw: Any, path: str = "fusion") -> "Fusion":
        raw = _mapping(path, raw, ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph"))
        return cls(_number(f"{path}.bucket_cap_mb", raw.get("bucket_cap_mb", 25.0), 0.0, 4096.0),
                   _bool(f"{path}.gradient_as_bucket_view", raw.get("gradient_as_bucket_view", True)),
                   _bool(f"{path}.static_graph", raw.get("static_graph", False)))

    def to_dict(self) -> dict:
        return {"bucket_cap_mb": self.bucket_cap_mb, "gradient_as_bucket_view": self.gradient_as_bucket_view,
                "static_graph": self.static_graph}


@dataclass(frozen=True)
class Strategy:
    """A complete synchronization strategy. Build with :meth:`from_dict` / :func:`load_strategy`."""

    groups: tuple[Group, ...] = (Group(),)
    sync: Sync = field(default_factory=Sync)
    fusion: Fusion = field(default_factory=Fusion)
    optimizer_sharding: str = "none"

    @classmethod
    def default(cls) -> "Strategy":
        """PyTorch DDP's default: 25 MB buckets, one ring all-reduce, no compression."""
        return cls()

    @classmethod
    def from_dict(cls, raw: Any) -> "Strategy":
        raw = _mapping("strategy", raw, ("autosync", "sync", "fusion", "optimizer_sharding", "groups"))
        version = raw.get("autosync", SCHEMA_VERSION)
        if version != SCHEMA_VERSION:
            _fail("autosync", f"schema version {version!r} is not supported (this autosync reads {SCHEMA_VERSION})")
        groups_raw = raw.get("groups", [{}])
        if not isinstance(groups_raw, list) or not groups_raw:
            _fail("groups", "expected a non-empty list of groups")
        groups = tuple(Group.parse(g, f"groups[{i}]") for i, g in enumerate(groups_raw))
        catch_all = [i for i, g in enumerate(groups) if g.is_catch_all]
        if len(catch_all) > 1:
            _fail(f"groups[{catch_all[1]}].match", "only one group may be the catch-all '*'")
        sharding = _choice("optimizer_sharding", raw.get("optimizer_sharding", "none"), SHARDING)
        sync = Sync.parse(raw.get("sync", "bsp"))
        if sharding == "zero" and sync.mode == "local_sgd":
            _fail("optimizer_sharding", "zero cannot be combined with sync mode local_sgd")
        return cls(groups, sync, Fusion.parse(raw.get("fusion")), sharding)

    # --- forms ---------------------------------------------------------------------------
    def canonical(self) -> dict:
        return {"autosync": SCHEMA_VERSION, "sync": self.sync.to_dict(), "fusion": self.fusion.to_dict(),
                "optimizer_sharding": self.optimizer_sharding, "groups": [g.to_dict() for g in self.groups]}

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.canonical(), sort_keys=False, default_flow_style=None)

    def to_json(self) -> str:
        return json.dumps(self.canonical(), sort_keys=True)

    @property
    def hash(self) -> str:
        """Stable 16-hex-digit id of the canonical form."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    # --- semantics -----------------------------------------------------------------------
    @property
    def is_lossless(self) -> bool:
        """True when the strategy computes the same update as plain DDP (up to rounding)."""
        return self.sync.mode == "bsp" and not any(g.compressor.lossy for g in self.groups)

    def check_world(self, world_size: int) -> None:
        """Raise StrategyError if an owner rank does not exist in a world of ``world_size``."""
        for i, g in enumerate(self.groups):
            for j, r in enumerate(g.placement or ()):
                if r >= world_size:
                    _fail(f"groups[{i}].placement[{j}]", f"rank {r} does not exist in a world of {world_size} ranks")

    def resolve(self, named_params: Iterable[tuple[str, Any]], embedding_names: set[str] | None = None) -> list[int]:
        """Map each trainable parameter, in order, to the index of the one group that covers it.

        A parameter is covered by the group whose globs match its name; the catch-all
        ``"*"`` group takes the parameters no other group matched. ``embedding_names``, when
        given, lets row_sparse groups be checked to hold only embedding tables. Raises
        StrategyError naming parameters left uncovered or covered twice, and groups that
        cover nothing (a strategy written for another model).
        """
        names = [n for n, p in named_params if getattr(p, "requires_grad", True)]
        catch_all = next((i for i, g in enumerate(self.groups) if g.is_catch_all), -1)
        owner: list[int] = []
        uncovered: list[str] = []
        twice: list[str] = []
        for name in names:
            hits = [i for i, g in enumerate(self.groups) if i != catch_all and g.matches(name)]
            if len(hits) > 1:
                twice.append(f"{name} (groups {', '.join(map(str, hits))})")
            if not hits and catch_all < 0:
                uncovered.append(name)
            owner.append(hits[0] if hits else catch_all)
        for problem, found in (("not covered by any group", uncovered), ("covered by more than one group", twice)):
            if found:
                more = f" and {len(found) - 3} more" if len(found) > 3 else ""
                raise StrategyError(f"groups: parameters {problem}: {', '.join(found[:3])}{more}")
        for i in range(len(self.groups)):
            if i not in owner:
                _fail(f"groups[{i}].match", f"{self.groups[i].to_dict()['match']!r} matches no parameter of this model")
        if embedding_names is not None:
            for name, gi in zip(names, owner):
                if self.groups[gi].plan == "row_sparse" and name not in embedding_names:
                    _fail(f"groups[{gi}].plan", f"row_sparse needs embedding tables, but {name} is not one")
        return owner


def _read_text(path: str | Path) -> str:
    try:
        return Path(path).read_text()
    except OSError as e:
        raise StrategyError(f"{path}: cannot read strategy file ({e.strerror})") from None


def loads_strategy(text: str, source: str = "<string>") -> Strategy:
    """Parse YAML or JSON text: a JSON object (the dataset's canonical form) with json.loads, 50x quicker than
    the pure-Python YAML parser; anything else with yaml.safe_load (never yaml.load)."""
    try:
        raw = json.loads(text) if text.lstrip().startswith("{") else _yaml(text, source)
    except json.JSONDecodeError:
        raw = _yaml(text, source)  # a YAML flow mapping that is not JSON
    try:
        return Strategy.from_dict(raw)
    except StrategyError as e:
        raise StrategyError(f"{source}: {e}") from None


def _yaml(text: str, source: str):
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise StrategyError(f"{source}: malformed YAML{where}: {getattr(e, 'problem', e)}") from None


def load_strategy(path: str | Path) -> Strategy:
    """Load a strategy file (.yaml, .yml or .json)."""
    return loads_strategy(_read_text(path), str(path))


def save_strategy(strategy: Strategy, path: str | Path) -> None:
    """Write a strategy as YAML, or JSON when the path ends in .json."""
    path = Path(path)
    text = strategy.to_json() + "\n" if path.suffix == ".json" else strategy.to_yaml()
    path.write_text(text)
