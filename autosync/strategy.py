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
from typing import Any, Iterable

import yaml

from autosync import plans as registry
from autosync.validation import StrategyError
from autosync.validation import boolean as _bool
from autosync.validation import choice as _choice
from autosync.validation import fail as _fail
from autosync.validation import mapping as _mapping
from autosync.validation import number as _number

SCHEMA_VERSION = 1
SHARDING = ("none", "zero")


def _who_takes(table: dict, kind: str, field_name: str) -> str:
    """``only mode local_sgd takes it`` / ``only plans ps and sharded_ps take a placement``."""
    found = [n for n, d in table.items() if field_name in d.fields]
    names = [", ".join(found[:-1]), found[-1]] if len(found) > 2 else found
    plural = len(found) > 1
    what = "it" if kind == "mode" else field_name if field_name.endswith("s") else f"a {field_name}"
    if kind == "compressor":
        return f"only the {' and '.join(names)} {kind}{'s' if plural else ''} take{'' if plural else 's'} {what}"
    return f"only {kind}{'s' if plural else ''} {' and '.join(names)} take{'' if plural else 's'} {what}"


_FIELDS: dict[tuple, dict] = {}


def table_fields(table: dict) -> dict:
    """Every field the entries of a registry table take (the first declaration of a name), in registry order;
    computed once per table and set of entries (the schema and the search's diversity signature ask for it on every
    strategy)."""
    key = (id(table), *table)
    out = _FIELDS.get(key)
    if out is None:
        out = {}
        for entry in table.values():
            for name, f in entry.fields.items():
                out.setdefault(name, f)
        _FIELDS[key] = out
    return out


def _plain(value):
    return [_plain(x) for x in value] if isinstance(value, tuple) else value


class _Choice:
    """A registry choice (a compressor, a group's plan, a sync mode) and the values of its fields, which read as
    attributes (``compressor.rank``, ``sync.period``); a field the choice does not take reads as its ``unused``
    value. The fields are the registry entry's own (:class:`autosync.plans.base.Field`)."""

    TABLE: dict = {}
    KIND = ""            # what the table's entries are called in messages

    def __getattr__(self, key: str):
        if key.startswith("__"):
            raise AttributeError(key)
        for k, value in self.__dict__.get("values", ()):
            if k == key:
                return value
        known = table_fields(type(self).TABLE)
        if key in known:
            return known[key].unused
        raise AttributeError(f"{type(self).__name__} has no field {key!r}")

    @classmethod
    def read_values(cls, entry, raw, path: str, foreign_default_ok: bool = False) -> tuple:
        """``entry``'s field values from ``raw``; a field that only other entries take is an error (or, with
        ``foreign_default_ok``, ignored when it has the value that means "not used")."""
        for name, f in table_fields(cls.TABLE).items():
            if name in raw and name not in entry.fields and not (foreign_default_ok and raw[name] == f.unused):
                _fail(f"{path}.{name}", _who_takes(cls.TABLE, cls.KIND, name))
        return tuple(entry.read_fields(raw, path).items())

    def field_dict(self) -> dict:
        """The values that are set, as plain data (lists, not tuples), in the entry's order."""
        return {k: _plain(value) for k, value in self.values if value is not None}


@dataclass(frozen=True)
class Compressor(_Choice):
    """Gradient compression: a compressor of the registry and its fields (e.g. powersgd {rank}, topk {ratio})."""

    TABLE, KIND = registry.COMPRESSORS, "compressor"
    name: str = "none"
    values: tuple = ()

    @classmethod
    def parse(cls, raw: Any, path: str) -> "Compressor":
        if isinstance(raw, str):
            raw = {"name": raw}
        raw = _mapping(path, raw, ("name", *table_fields(cls.TABLE)))
        name = _choice(f"{path}.name", raw.get("name", "none"), cls.TABLE)
        return cls(name, cls.read_values(registry.compressor(name), raw, path))

    def to_dict(self) -> dict:
        return {"name": self.name, **self.field_dict()}

    @property
    def lossy(self) -> bool:
        return registry.compressor(self.name).lossy


@dataclass(frozen=True)
class Group(_Choice):
    """One ordered group: the parameters whose names match ``match``, their plan (and its fields) and compressor."""

    TABLE, KIND = registry.PLANS, "plan"
    match: tuple[str, ...] = ("*",)
    plan: str = "allreduce"
    compressor: Compressor = field(default_factory=Compressor)
    values: tuple = ()

    @classmethod
    def parse(cls, raw: Any, path: str) -> "Group":
        raw = _mapping(path, raw, ("match", "plan", "compressor", *table_fields(cls.TABLE)))
        match = raw.get("match", "*")
        match = (match,) if isinstance(match, str) else match
        if (not isinstance(match, (list, tuple)) or not match
                or not all(isinstance(m, str) and m for m in match)):
            _fail(f"{path}.match", f"expected a glob or a non-empty list of globs, got {raw.get('match')!r}")
        plan = _choice(f"{path}.plan", raw.get("plan", "allreduce"), cls.TABLE)
        kind = registry.plan(plan)
        comp = Compressor.parse(raw.get("compressor", "none"), f"{path}.compressor")
        if not registry.compressor(comp.name).works_with(kind):
            allowed = registry.compressor(comp.name).plans or ()
            _fail(f"{path}.compressor.name", f"{comp.name} works only with plan {' or '.join(allowed)}, not {plan}")
        # a plan field at the value that means "not used" (partitions: 1) is accepted on any plan
        return cls(tuple(match), plan, comp, cls.read_values(kind, raw, path, foreign_default_ok=True))

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
        return {"match": self.match[0] if len(self.match) == 1 else list(self.match), "plan": self.plan,
                "compressor": self.compressor.to_dict(), **self.field_dict()}


@dataclass(frozen=True)
class Sync(_Choice):
    """When ranks synchronize: a mode of the registry (bsp, local_sgd, ...) and its fields."""

    TABLE, KIND = registry.SYNC_MODES, "mode"
    mode: str = "bsp"
    values: tuple = ()

    @classmethod
    def parse(cls, raw: Any, path: str = "sync") -> "Sync":
        if isinstance(raw, str):
            raw = {"mode": raw}
        raw = _mapping(path, raw, ("mode", *table_fields(cls.TABLE)))
        mode = _choice(f"{path}.mode", raw.get("mode", "bsp"), cls.TABLE)
        return cls(mode, cls.read_values(registry.sync_mode(mode), raw, path))

    @property
    def kind(self):
        """The registry entry of this mode."""
        return registry.sync_mode(self.mode)

    def to_dict(self) -> dict:
        return {"mode": self.mode, **{k: _plain(value) for k, value in self.values}}


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
        """DDP's defaults for bucketing and communication: 25 MB buckets, one ring all-reduce, no compression.

        One difference from ``DistributedDataParallel()``'s own defaults: ``gradient_as_bucket_view``
        is True here (DDP's default is False). Views save one copy of the gradients per step
        and compute the same update; every measured "DDP default" in autosync's data uses them.
        """
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
        if sharding == "zero" and not sync.kind.allows_zero:
            _fail("optimizer_sharding", f"zero cannot be combined with sync mode {sync.mode}")
        for i, g in enumerate(groups):
            if registry.plan(g.plan).immediate and not sync.kind.same_step:
                _fail(f"groups[{i}].plan", f"{g.plan} needs the activations of the step it synchronizes, so it "
                                           f"cannot run under sync mode {sync.mode}")
        return cls(groups, sync, Fusion.parse(raw.get("fusion")), sharding)

    # --- forms ---------------------------------------------------------------------------
    def canonical(self) -> dict:
        return {"autosync": SCHEMA_VERSION, "sync": self.sync.to_dict(), "fusion": self.fusion.to_dict(),
                "optimizer_sharding": self.optimizer_sharding, "groups": [g.to_dict() for g in self.groups]}

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.canonical(), sort_keys=False, default_flow_style=None)

    def to_json(self) -> str:
        return json.dumps(self.canonical(), sort_keys=True)

    def summary(self) -> str:
        """One line for tables and Optuna's dashboard, e.g. ``local_sgd(period=4) | allreduce x2, ps+fp16 |
        bucket 25 MB | LOSSY``."""
        fields = {k: v for k, v in self.sync.to_dict().items() if k != "mode"}
        sync = self.sync.mode + (f"({', '.join(f'{k}={v}' for k, v in fields.items())})" if fields else "")
        counts: dict[str, int] = {}
        for g in self.groups:
            name = g.plan + ("" if registry.compressor(g.compressor.name).identity else f"+{g.compressor.name}")
            counts[name] = counts.get(name, 0) + 1
        plans = ", ".join(n + (f" x{c}" if c > 1 else "") for n, c in counts.items())
        zero = " | zero" if self.optimizer_sharding == "zero" else ""
        return (f"{sync} | {plans} | bucket {self.fusion.bucket_cap_mb:g} MB{zero} | "
                f"{'lossless' if self.is_lossless else 'LOSSY'}")

    @property
    def hash(self) -> str:
        """Stable 16-hex-digit id of the canonical form."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    @property
    def traffic_hash(self) -> str:
        """The hash of the strategy with the sync mode's fields that do not change its traffic (``Field.traffic``
        False: DiLoCo's outer learning rate and momentum, a warm-up's length) at their unused values: strategies
        with the same traffic hash send the same bytes at the same steps, so they step at the same speed."""
        fields = self.sync.kind.fields
        values = tuple((k, fields[k].unused if k in fields and not fields[k].traffic else v)
                       for k, v in self.sync.values)
        same = Strategy(self.groups, Sync(self.sync.mode, values), self.fusion, self.optimizer_sharding)
        return same.hash

    def steady_traffic_hash(self, ranks_per_host: int) -> str:
        """:attr:`traffic_hash` as a live window times it, after the mode's warm-up: a mode whose steps then stay
        inside the host (``SyncModeDef.host_local_after_warmup``: local SGD, DiLoCo) with one rank per host sends
        nothing through the groups' plans and buckets, so the groups and fusion are left out (the default's
        stand in); every other strategy's is its :attr:`traffic_hash`."""
        if ranks_per_host != 1 or not self.sync.kind.host_local_after_warmup:
            return self.traffic_hash
        base = Strategy.default()
        return Strategy(base.groups, self.sync, base.fusion, self.optimizer_sharding).traffic_hash

    # --- semantics -----------------------------------------------------------------------
    @property
    def is_lossless(self) -> bool:
        """True when the strategy computes the same update as plain DDP (up to rounding)."""
        return not self.sync.kind.lossy and not any(g.compressor.lossy for g in self.groups)

    def lossy_key(self) -> str:
        """The choices that change the math of training: ``"lossless"`` for a lossless strategy, else a
        stable string of each group's parameters and compressor, the sync mode and its fields, and the
        bucket size when a compressor's result depends on it (top-k). Plans, placement, sharding and
        (otherwise) buckets are lossless and do not enter it, so one efficiency measurement serves every
        strategy with the same key, on every network (statistical efficiency, :mod:`autosync.efficiency`).
        """
        if self.is_lossless:
            return "lossless"
        groups = [[list(g.match), g.compressor.to_dict()] for g in self.groups]
        key: dict[str, Any] = {"groups": groups, "sync": self.sync.to_dict()}
        if any(registry.compressor(g.compressor.name).bucket_dependent for g in self.groups):
            key["bucket_cap_mb"] = self.fusion.bucket_cap_mb
        return json.dumps(key, sort_keys=True, separators=(",", ":"))

    def check_world(self, world_size: int) -> None:
        """Raise StrategyError if an owner rank does not exist in a world of ``world_size``."""
        for i, g in enumerate(self.groups):
            for j, r in enumerate(g.placement or ()):
                if r >= world_size:
                    _fail(f"groups[{i}].placement[{j}]", f"rank {r} does not exist in a world of {world_size} ranks")

    def owners(self, group_bytes: list[int], world: int) -> list[tuple[int, ...]]:
        """Owner ranks of every group whose plan has owners (``()`` for the others).

        A group's explicit ``placement`` wins; a plan may fix its owners itself (sharded_ps with
        one shard per rank takes the ranks in order, so it can run as reduce-scatter +
        all-gather); the rest are balanced by bytes, greedily: items (one per owner of a group,
        each ``group_bytes / owners``) go, largest first, to the least-loaded rank so far.
        """
        load = [0] * world
        owners: list[tuple[int, ...]] = [()] * len(self.groups)
        items = []
        for gi, g in enumerate(self.groups):
            kind = registry.plan(g.plan)
            n = kind.owner_count(g.partitions)
            if n == 0:
                continue
            fixed = g.placement if g.placement is not None else kind.fixed_owners(g.partitions, world)
            if fixed is not None:
                owners[gi] = tuple(fixed)
                for r in fixed:
                    load[r] += group_bytes[gi] // len(fixed)
            else:
                owners[gi] = (0,) * n
                items += [(group_bytes[gi] // n, gi, s) for s in range(n)]
        for nbytes, gi, shard in sorted(items, key=lambda t: (-t[0], t[1], t[2])):
            r = min(range(world), key=lambda k: (load[k], k))
            load[r] += nbytes
            owners[gi] = owners[gi][:shard] + (r,) + owners[gi][shard + 1:]
        return owners

    def resolve(self, named_params: Iterable[tuple[str, Any]], embedding_names: set[str] | None = None) -> list[int]:
        """Map each trainable parameter, in order, to the index of the one group that covers it.

        A parameter is covered by the group whose globs match its name; the catch-all
        ``"*"`` group takes the parameters no other group matched. ``embedding_names``, when
        given, lets row_sparse groups be checked to hold only embedding tables. Raises
        StrategyError naming parameters left uncovered or covered twice, and groups that
        cover nothing (a strategy written for another model).
        """
        names = [n for n, p in named_params if getattr(p, "requires_grad", True)]
        key = (tuple(names), None if embedding_names is None else frozenset(embedding_names))
        cache = self.__dict__.setdefault("_resolved", {})      # a search resolves each candidate several times
        if key not in cache:
            cache.clear()                                       # one model at a time
            cache[key] = self._resolve(names, embedding_names)
        return list(cache[key])

    def __getstate__(self) -> dict:
        """Pickled (sent to a rank, stored) without :meth:`resolve`'s cache: it belongs to the process's model."""
        state = dict(self.__dict__)
        state.pop("_resolved", None)
        return state

    def _resolve(self, names: list[str], embedding_names: set[str] | None) -> list[int]:
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
                plan = self.groups[gi].plan
                if registry.plan(plan).embeddings_only and name not in embedding_names:
                    _fail(f"groups[{gi}].plan", f"{plan} needs embedding tables, but {name} is not one")
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
