"""``apply``: wrap a model and its optimizer so that training follows a strategy."""
from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from autosync.executor.hooks import SyncState, autosync_hook
from autosync.strategy import Strategy, load_strategy
from autosync.workloads import embedding_parameter_names


def _ranks_per_host(ranks_per_host: int | None) -> int | None:
    if ranks_per_host:
        return ranks_per_host
    env = os.environ.get("LOCAL_WORLD_SIZE")  # set by torchrun and by autosync's launcher
    return int(env) if env else None


def apply(model: torch.nn.Module, optimizer: torch.optim.Optimizer, strategy: Strategy | str | os.PathLike,
          process_group=None, ranks_per_host: int | None = None, init_sync: bool = True, **hook_options):
    """Return ``(ddp_model, optimizer)`` that train ``model`` by ``strategy``.

    Call on every rank after ``init_process_group``, with ``optimizer`` built over
    ``model.parameters()``. ``strategy`` is a Strategy or the path of a strategy file.
    ``ranks_per_host`` (default: ``$LOCAL_WORLD_SIZE``, else all ranks on one host) sets the
    hosts of ``hierarchical_allreduce`` and of local SGD's intra-host averaging.
    ``init_sync=False`` skips DDP's initial broadcast of rank 0's parameters (only when every
    rank built identical parameters, e.g. from one seed).

    - fusion -> DDP's ``bucket_cap_mb``, ``gradient_as_bucket_view``, ``static_graph``;
    - groups -> one comm hook (:mod:`autosync.executor.hooks`, running the plans of :mod:`autosync.plans`);
    - ``optimizer_sharding: zero`` -> torch's ZeroRedundancyOptimizer over the same
      optimizer class and defaults (per-parameter-group options are not carried over);
    - ``sync`` -> the mode's optimizer wrapper (``local_sgd``: torch's PostLocalSGDOptimizer
      with a PeriodicModelAverager: after ``warmup_steps`` steps gradients are averaged only
      inside a host and the parameters of all ranks every ``period`` steps).

    ``sync: asp`` -> no DDP (:class:`Unsynchronized`): gradients stay local and the optimizer wrapper
    exchanges with the parameter server after each step.

    The returned model has ``.autosync_state`` (a :class:`SyncState`); call
    ``autosync.executor.apply.release(ddp_model)`` to free its thread and subgroups.
    """
    if not isinstance(strategy, Strategy):
        strategy = load_strategy(strategy)
    pg = process_group if process_group is not None else dist.group.WORLD
    state = SyncState(model, strategy, pg, _ranks_per_host(ranks_per_host),
                      embedding_parameter_names(model), **hook_options)
    fusion = strategy.fusion
    if strategy.sync.kind.asynchronous:
        ddp = Unsynchronized(model, pg, init_sync)
    else:
        ddp = DDP(model, process_group=pg, bucket_cap_mb=fusion.bucket_cap_mb,
                  gradient_as_bucket_view=fusion.gradient_as_bucket_view, static_graph=fusion.static_graph,
                  init_sync=init_sync)
        ddp.register_comm_hook(state, autosync_hook)
    ddp.autosync_state = state
    return ddp, wrap_optimizer(optimizer, model, strategy, pg, state)


def wrap_optimizer(optimizer, model, strategy: Strategy, pg, state: SyncState):
    """``optimizer`` as ``strategy`` steps it: ZeRO's sharding, then the sync mode's wrapper (local SGD's and
    DiLoCo's averager, asp's exchange); what must finish before ``state``'s groups go is added to its closers.
    :func:`apply` and a live switch into a local mode (:mod:`autosync.executor.switch`) build it here."""
    if strategy.optimizer_sharding == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=type(optimizer),
                                            process_group=pg, **optimizer.defaults)
    optimizer = strategy.sync.kind.wrap_optimizer(optimizer, strategy.sync, pg)
    if hasattr(optimizer, "finish"):   # asp: release() stops the parameter server and hands out its parameters
        state.closers.append(optimizer.finish)
    drain = getattr(getattr(optimizer, "averager", None), "drain", None)
    if drain is not None:              # diloco: outer all-reduces still in flight finish before the groups go
        state.closers.append(drain)
    return optimizer


#: how to set DDP's bucket options where a framework wraps the model itself
BUCKET_KNOBS = ("torch DDP(bucket_cap_mb=...), Lightning DDPStrategy(bucket_cap_mb=...), Accelerate "
                "DistributedDataParallelKwargs(bucket_cap_mb=...), Transformers TrainingArguments(ddp_bucket_cap_mb=...)")


def ddp_kwargs(strategy: Strategy | str | os.PathLike) -> dict:
    """The strategy's DDP bucket options as keyword arguments (``bucket_cap_mb``, ``gradient_as_bucket_view``,
    ``static_graph``): for ``DistributedDataParallel(...)``, Accelerate's ``DistributedDataParallelKwargs(...)``.
    ``"auto"``: none (DDP's defaults; tuning while training keeps the layout the model is wrapped with)."""
    if isinstance(strategy, str) and strategy == "auto":
        return {}
    if not isinstance(strategy, Strategy):
        strategy = load_strategy(strategy)
    f = strategy.fusion
    return {"bucket_cap_mb": f.bucket_cap_mb, "gradient_as_bucket_view": f.gradient_as_bucket_view,
            "static_graph": f.static_graph}


def fusion_mismatch(ddp: DDP, strategy: Strategy) -> str | None:
    """What of the strategy's ``fusion`` an already-built DDP does not follow (None: all of it)."""
    fusion = strategy.fusion
    cap = getattr(ddp, "bucket_bytes_cap", None)
    out = []
    if cap is not None and abs(cap - int(fusion.bucket_cap_mb * 1024 * 1024)) > 1:
        out.append(f"bucket_cap_mb={cap / 1024 / 1024:g} (the strategy says {fusion.bucket_cap_mb:g})")
    if getattr(ddp, "gradient_as_bucket_view", fusion.gradient_as_bucket_view) != fusion.gradient_as_bucket_view:
        out.append(f"gradient_as_bucket_view={ddp.gradient_as_bucket_view}")
    if bool(getattr(ddp, "static_graph", fusion.static_graph)) != fusion.static_graph:
        out.append(f"static_graph={ddp.static_graph}")
    return ", ".join(out) or None


def register(ddp_model: DDP, strategy: Strategy | str | os.PathLike, optimizer=None, process_group=None,
             ranks_per_host: int | None = None, module=None, **hook_options):
    """Apply ``strategy`` to a model some framework already wrapped in DDP; returns ``optimizer``, wrapped as the
    strategy's sync mode needs (None when none was given and none is needed).

    For Lightning, Accelerate and the Transformers ``Trainer``, which build the DDP themselves. Call on every rank,
    after the wrapping and before the first backward. ``module``: where the tuned model sits inside the wrapped
    one, when parameter names differ by a prefix (:func:`tuned_module`). The comm hook and its state are registered on
    ``ddp_model`` (``ddp_model.autosync_state``; :func:`release` frees it). DDP's bucket options cannot change
    after wrapping: when they differ from the strategy's ``fusion`` a warning names the framework knobs that set
    them (:data:`BUCKET_KNOBS`); the hook still runs, only the bucket layout differs. Refused with one line:
    ``sync: asp`` (it needs no DDP at all: use :func:`apply`), and ZeRO or a sync mode that wraps the optimizer
    (local_sgd, adaptive, selective) without ``optimizer``.

        model = accelerator.prepare(model)                 # a DDP on every rank
        optimizer = autosync.register(model, "strategy.yaml", optimizer)
    """
    import warnings

    from autosync.validation import StrategyError

    if not isinstance(strategy, Strategy):
        strategy = load_strategy(strategy)
    if not isinstance(ddp_model, DDP):
        raise StrategyError(f"register: expected a torch DistributedDataParallel model, got "
                            f"{type(ddp_model).__name__} (for an unwrapped model use autosync.apply)")
    kind = strategy.sync.kind
    if kind.asynchronous:
        raise StrategyError(f"register: sync mode {strategy.sync.mode} trains without DDP; use autosync.apply "
                            "on the unwrapped model")
    if (strategy.optimizer_sharding == "zero" or kind.wraps_optimizer) and optimizer is None:
        what = "optimizer_sharding: zero" if strategy.optimizer_sharding == "zero" else f"sync mode {strategy.sync.mode}"
        raise StrategyError(f"register: {what} wraps the optimizer; pass it (optimizer = register(model, "
                            "strategy, optimizer))")
    mismatch = fusion_mismatch(ddp_model, strategy)
    if mismatch:
        warnings.warn(f"autosync.register: the model was wrapped with {mismatch}; set it where the model is "
                      f"wrapped: {BUCKET_KNOBS}", stacklevel=2)
    state = attach_hook(ddp_model, strategy, process_group, ranks_per_host, module, **hook_options)
    return None if optimizer is None else wrap_optimizer(optimizer, ddp_model.module, strategy, state.pg, state)


def tuned_module(ddp_model: DDP, module=None) -> torch.nn.Module:
    """The module whose parameter names the strategy uses: ``ddp_model.module``, or its submodule ``module`` (an
    attribute path such as ``"net"``, or the module itself) when a framework's wrapper (a LightningModule, a
    Trainer's model with a loss) holds the model that was tuned. Every trainable parameter must be inside it."""
    from autosync.validation import StrategyError

    root = ddp_model.module
    if module is None:
        return root
    sub = module
    if isinstance(module, str):
        sub = root
        for part in module.split("."):
            if not hasattr(sub, part):
                raise StrategyError(f"module {module!r}: {type(root).__name__} has no attribute path {module!r}")
            sub = getattr(sub, part)
    inside = {id(p) for p in sub.parameters()}
    outside = [n for n, p in root.named_parameters() if p.requires_grad and id(p) not in inside]
    if outside:
        raise StrategyError(f"module {module!r}: the trainable parameter {outside[0]!r} is outside it; the strategy "
                            "must cover every parameter DDP synchronizes")
    return sub


def attach_hook(ddp_model: DDP, strategy: Strategy, process_group=None, ranks_per_host: int | None = None,
                module=None, **hook_options) -> SyncState:
    """Build the strategy's :class:`SyncState` for an existing DDP and register autosync's comm hook on it
    (parameter names resolved in :func:`tuned_module`)."""
    pg = process_group if process_group is not None else ddp_model.process_group
    model = tuned_module(ddp_model, module)
    state = SyncState(model, strategy, pg, _ranks_per_host(ranks_per_host), embedding_parameter_names(model),
                      **hook_options)
    ddp_model.register_comm_hook(state, autosync_hook)
    ddp_model.autosync_state = state
    return state



class Unsynchronized(torch.nn.Module):
    """What an asynchronous mode (asp) trains through instead of DDP: the model, with DDP's ``module`` and
    ``no_sync()``, and no collective at all after the initial broadcast. DDP itself would make every rank wait
    for the others when it rebuilds its buckets at the second step and when it broadcasts buffers."""

    def __init__(self, module: torch.nn.Module, process_group, init_sync: bool = True):
        super().__init__()
        self.module = module
        if init_sync:
            src = dist.get_global_rank(process_group, 0) if process_group is not dist.group.WORLD else 0
            with torch.no_grad():
                for t in [*module.parameters(), *module.buffers()]:
                    dist.broadcast(t, src=src, group=process_group)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        yield


def release(ddp_model) -> None:
    """Stop the hook's worker thread and destroy the subgroups it made; with ``"auto"``
    (:func:`autosync.api.register`), first the tuner commits what it measured if its search had not ended. The
    model ``autosync.apply(model, optimizer, "auto")`` returned releases itself (its ``release``)."""
    if callable(getattr(type(ddp_model), "release", None)):     # a SwitchableModel: its tuner, then its DDP's hook
        ddp_model.release()
        return
    tuner = getattr(ddp_model, "autosync_tuner", None)
    if tuner is not None:
        tuner.finish()
    state = getattr(ddp_model, "autosync_state", None)
    if state is not None:
        state.close()
