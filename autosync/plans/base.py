"""The three kinds of registry entry: a plan, a compressor, a sync mode.

Each entry is one small object that holds everything autosync knows about one idea:

- its **validation** (which strategy fields it takes, their ranges),
- its **search space** (what Optuna may choose for it),
- its **hook body** (what it does to a segment of a DDP bucket on real ranks),
- its **simulator cost** (seconds, from the profile's ``alpha + beta * bytes`` fits),
- its **features** (what the learned cost model sees of it).

The hook (:mod:`autosync.executor.hooks`), the simulator (:mod:`autosync.models.simulator`),
the features (:mod:`autosync.models.features`), the strategy schema and the search space
iterate over the registry (:mod:`autosync.plans`) and never switch on a name. Entries import
torch only inside their hook bodies, so the CLI and the cost model load without it.

The hook-side ``comm`` argument is the executor's ``SyncState``: ``pg``, ``world``,
``rank``, ``ranks_per_host``, ``intra_group``, ``leader_group``, ``mode_state``, ``global_rank(r)``,
``subgroup(ranks)``. The
simulator-side ``sim`` argument offers ``t(collective, nbytes, scope)``, ``alpha(collective)``,
``world``, ``nodes``, ``ranks_per_node``, ``paths`` (host-to-host bandwidths, bit/s), ``flop_rate`` and
``compute_s`` (one step's compute, seconds).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

from autosync import validation as v


@dataclass(frozen=True)
class Field:
    """One strategy field an entry takes: its default, its range, and how it is read.

    A default that is a bool, float or int reads as one (floats in ``(lo, hi]``, ints in ``[lo, hi]``); any other
    field gives ``read(value, path)``, which returns the value or fails with the path. ``required`` (a message
    saying what to give) makes the field mandatory. ``unused`` is what the field reads as on a strategy whose
    choice does not take it (a plan without ``partitions`` has one shard). ``traffic`` False: the field changes
    the math but not what is sent, when, or how much is computed once the mode has warmed up (DiLoCo's outer
    learning rate), so strategies that differ only in such fields step at the same speed
    (:meth:`autosync.strategy.Strategy.traffic_hash`). The schema
    (:mod:`autosync.strategy`) parses, validates, prints and hashes every field through this, and the search's
    diversity signature covers them all, so an entry with a new field is still one module and one line.
    """

    default: Any = None
    lo: float | None = None
    hi: float | None = None
    read: Callable[[Any, str], Any] | None = None
    required: str = ""
    unused: Any = None
    traffic: bool = True

    def parse(self, value: Any, path: str) -> Any:
        if self.read is not None:
            return self.read(value, path)
        if isinstance(self.default, bool):
            return v.boolean(path, value)
        if isinstance(self.default, float):
            return v.number(path, value, self.lo, self.hi)
        if isinstance(self.default, int):
            return v.integer(path, value, self.lo, self.hi)
        return value


class Entry:
    """What every registry entry has: a name, whether it changes DDP's math, its fields and its features."""

    name: ClassVar[str]
    lossy: ClassVar[bool] = False
    #: the strategy fields this entry takes, in the order the strategy file writes them
    fields: ClassVar[dict[str, Field]] = {}
    #: feature name -> value when the entry is not used (features are summed over groups)
    features: ClassVar[dict[str, float]] = {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    def read_fields(self, raw: Mapping[str, Any], path: str) -> dict[str, Any]:
        """This entry's fields from ``raw`` (a mapping): given ones validated, missing ones at their default."""
        out = {}
        for name, f in self.fields.items():
            if raw.get(name) is not None:
                out[name] = f.parse(raw[name], f"{path}.{name}")
            elif f.required:
                v.fail(f"{path}.{name}", f.required)
            else:
                out[name] = f.default
        self.check(out, path)
        return out

    def check(self, values: dict[str, Any], path: str) -> None:
        """Validation across this entry's fields (each is valid alone); fails with the path."""


class PlanDef(Entry):
    """How the ranks sum one segment (a run of one group's gradients inside a bucket).

    ``fields`` are the group fields the plan takes (``partitions``, ``placement``: :data:`PARTITIONS`,
    :data:`PLACEMENT`).
    """

    needs_hosts: ClassVar[bool] = False       # needs intra-host and host-leader process groups
    embeddings_only: ClassVar[bool] = False   # only for embedding tables
    fast_path: ClassVar[bool] = False         # DDP's own async all-reduce can run it (no worker thread)
    compressible: ClassVar[bool] = True       # a compressor may change what it sends (sfb sends factors: no)
    immediate: ClassVar[bool] = False         # needs this step's own activations (not under ssp or asp)

    # --- schema ------------------------------------------------------------------------------
    def owner_count(self, partitions: int) -> int:
        """How many owner (server) ranks a group of this plan has; 0 = none."""
        return 0

    def fixed_owners(self, partitions: int, world: int) -> tuple[int, ...] | None:
        """Owners that are not balanced but fixed by the plan itself (None = balance by bytes)."""
        return None

    def check(self, values: dict[str, Any], path: str) -> None:
        placement = values.get("placement")
        want = self.owner_count(values.get("partitions", 1))
        if placement is not None and len(placement) != want:
            v.fail(f"{path}.placement", f"expected {want} owner rank(s), got {len(placement)}")

    # --- search space --------------------------------------------------------------------------
    def applicable(self, nodes: int, ranks_per_node: int, embedding_group: bool) -> bool:
        """Whether the search space offers this plan for a group (of embeddings or not) on a cluster."""
        return not self.embeddings_only or embedding_group

    def suggest(self, trial, prefix: str, world: int) -> dict[str, Any]:
        """The plan's own group fields, asked of an Optuna trial (parameter names start with ``prefix``)."""
        return {}

    def offered(self, params) -> bool:
        """Whether the search space offers the plan at all for a model (``params``: its profile's ParamInfo)."""
        return True

    # --- per-rank state (built by the hook's SyncState on every rank) -------------------------------
    def make_state(self, comm, model, params) -> Any:
        """State of one group on one rank (``params``: the group's parameters), e.g. module hooks."""
        return None

    def end_step(self, state) -> None:
        """Called once per backward that went through the hook, after the last bucket."""

    def close_state(self, state) -> None:
        """Undo :meth:`make_state` (remove hooks)."""

    # --- hook, simulator, features ----------------------------------------------------------------
    def run(self, comm, t, seg, owners: tuple[int, ...]) -> None:
        """Sum ``t`` over all ranks, in place (on every rank)."""
        raise NotImplementedError

    def cost(self, sim, nbytes: float, shapes: list, touched: list[float], owners: tuple[int, ...],
             elem_size: int, rows=()) -> float:
        """Seconds to sum ``nbytes`` of this segment (``shapes``: its tensors; ``touched``: fraction of rows
        used, per tensor; ``rows``: factor rows per step, per tensor, 0 where it has none -- sfb)."""
        raise NotImplementedError

    def traffic(self, nbytes: float, shapes: list, rows, elem_size: int, world: int) -> float | None:
        """Bytes one rank sends for the segment when that is not its gradient's size (None: it is)."""
        return None

    def group_features(self, partitions: int, share: float) -> dict[str, float]:
        """Feature contributions of one group holding ``share`` of the model's bytes."""
        return {}


class CompressorDef(Entry):
    """What is sent instead of the raw gradient."""

    plans: ClassVar[tuple[str, ...] | None] = None   # the plans it works with; None = every plan
    identity: ClassVar[bool] = False                 # sends the gradient as it is
    #: its math depends on how gradients are cut into buckets (e.g. top-k over a segment), so the
    #: bucket size enters the strategy's lossy key (:meth:`autosync.strategy.Strategy.lossy_key`)
    bucket_dependent: ClassVar[bool] = False

    def works_with(self, plan: PlanDef) -> bool:
        """Whether this compressor may change what ``plan`` (a registry entry) sends."""
        if not (self.identity or plan.compressible):
            return False
        return self.plans is None or plan.name in self.plans

    def suggest(self, trial, prefix: str) -> dict[str, Any]:
        return {}

    def make_state(self, comm, group) -> Any:
        """Per-group state kept across steps (error feedback, PowerSGD's matrices); built on every rank."""
        return None

    def run(self, comm, flat, seg, state, reduce: Callable[[Any], None]) -> None:
        """Average ``flat`` over ranks in place; ``reduce(t)`` sums a tensor by the group's plan."""
        raise NotImplementedError

    def end_step(self, state) -> None:
        """Called once per backward, after the last bucket."""

    def cost(self, sim, compressor, nbytes: float, shapes: list,
             plan_cost: Callable[[float, int], float]) -> tuple[float, float]:
        """(seconds, bytes sent) for a segment of ``nbytes`` fp32 bytes compressed by ``compressor`` (the
        strategy's value, with its fields); ``plan_cost(bytes, element size)`` prices the group's plan."""
        raise NotImplementedError

    def group_features(self, compressor, share: float) -> dict[str, float]:
        return {}

    def error_norm(self, state) -> float | None:
        """The norm of the error-feedback residual this rank holds (None: no error feedback)."""
        return None


class SyncModeDef(Entry):
    """When ranks synchronize: every step (bsp) or less often."""

    needs_hosts: ClassVar[bool] = False
    allows_zero: ClassVar[bool] = True           # may be combined with ZeroRedundancyOptimizer
    bypasses_plans: ClassVar[bool] = False       # some steps skip the groups' plans
    #: after ``warmup_steps`` every step's buckets stay inside the host (:meth:`local_step` true, :meth:`run_local`
    #: averages over the host's ranks): with one rank per host the groups' plans and the buckets send nothing
    host_local_after_warmup: ClassVar[bool] = False
    #: ranks do not wait for each other (asp): each runs at its own pace, throughput is the sum of the ranks'
    #: rates, and statistical efficiency depends on timing (measured on the cluster, in time-based windows)
    asynchronous: ClassVar[bool] = False
    #: the mode's work runs in an optimizer wrapper (:meth:`wrap_optimizer`: local SGD's averager)
    wraps_optimizer: ClassVar[bool] = False
    #: a step's gradients are synchronized within that step (not ssp's later steps, not asp's server loop)
    same_step: ClassVar[bool] = True
    #: how often the mode communicates depends on the training trajectory (adaptive: it averages when the ranks'
    #: models drift apart), so its throughput is measured training as the efficiency protocol does
    #: (:meth:`autosync.executor.measure.TrialSpec.recipe`)
    follows_trajectory: ClassVar[bool] = False
    #: seed pairs the efficiency protocol trains at least (:mod:`autosync.efficiency`): 2 for modes whose ranks'
    #: models drift apart between averages (local SGD and its family, selective), which stall or converge seed by
    #: seed (vit-tiny's local SGD: bench/results/lossy_window_applied.md); one seed cannot see that
    min_pairs: ClassVar[int] = 1

    def suggest(self, trial, profile=None) -> dict[str, Any]:
        return {}

    def offered(self, profile) -> bool:
        """Whether the search space offers the mode for ``profile`` (selective: only on uneven paths)."""
        return True

    def make_state(self, comm, sync) -> Any:
        """Per-job state (``comm.mode_state``), built on every rank in the same order; its process subgroups come
        from ``comm.subgroup(ranks)`` (destroyed at close)."""
        return None

    def steps_per_round(self, sync) -> int:
        """Steps after which the pattern repeats; timed steps are whole rounds, step time their mean."""
        return 1

    def delay(self, sync) -> int:
        """Steps between computing a gradient and applying its average (0: the same step; ssp: its staleness)."""
        return 0

    def window(self, sync) -> float:
        """Steps a fast rank may run ahead of the slowest one before it waits (1 for bsp): how much of a
        straggler's delay the mode absorbs (simulator)."""
        return 1.0

    def local_step(self, comm, iteration: int, sync) -> bool:
        """True when this step's buckets skip the plans and stay inside the host."""
        return False

    def run_local(self, comm, buffer) -> None:
        """What a bucket gets on a step where :meth:`local_step` is true."""
        raise NotImplementedError

    def averager(self, sync, process_group):
        """The torch ``ModelAverager`` the mode averages parameters with after optimizer steps (None: none)."""
        return None

    def wrap_optimizer(self, optimizer, sync, process_group):
        """The optimizer that carries out the mode (e.g. torch's PostLocalSGDOptimizer)."""
        return optimizer

    def bucket_cost(self, sim, nbytes: float, sync=None) -> float | None:
        """Seconds of one bucket when the mode replaces the plans (None: the plans run)."""
        return None

    def step_cost(self, sim, sync, model_bytes: float) -> float:
        """Extra seconds per step, not overlapped with backward (amortized averaging)."""
        return 0.0

    def sync_features(self, sync) -> dict[str, float]:
        return {}


def read_placement(value: Any, path: str) -> tuple[int, ...]:
    """A ``placement``: a list of owner ranks."""
    if not isinstance(value, (list, tuple)):
        v.fail(path, f"expected a list of ranks, got {value!r}")
    return tuple(v.integer(f"{path}[{i}]", r, 0) for i, r in enumerate(value))


#: the group fields of the parameter-server plans
PARTITIONS = Field(1, 1, 4096, unused=1)        # sharded_ps: number of shards
PLACEMENT = Field(None, read=read_placement)     # ps / sharded_ps: owner ranks; None = balanced by bytes
