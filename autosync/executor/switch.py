"""Switching a live training from one strategy to another, with the objects the user holds staying the same.

:class:`SwitchableModel` is an ``nn.Module`` whose ``module`` is the user's model (so its ``state_dict`` keys read
like DDP's, ``module.``-prefixed, and ``parameters()`` are the user's parameters) and whose forward runs through the
DDP of the current strategy, which it keeps out of its own submodules. :class:`SwitchableOptimizer` is the user's
optimizer: ``step``, ``zero_grad``, ``param_groups``, ``state`` and ``state_dict`` are the wrapped optimizer's (the
same parameter and state objects, never copied), and ``on_step`` callbacks run after each step, where a switch
may happen.

:meth:`SwitchableModel.switch` is **collective**: every rank calls it after the same optimizer step. It builds
the candidate's :class:`~autosync.executor.hooks.SyncState` (its subgroups are made in the same order on every
rank, then its plans' and compressors' states), then all ranks agree by an all-reduce whether every rank built
it. If any rank raised, every rank closes what it built and stays on its current strategy, and the call returns
the reasons on every rank (``"rank 1: RuntimeError: ..."``). Only then is the new DDP wrapped
(``init_sync=False``: the ranks' parameters are equal, as every lossless step leaves them), its hook registered
and the old DDP released. Gradients are set to None at a switch (a step has just consumed them).

What can be switched to: synchronous modes with any plans, compressors and fusion; and, by a
:class:`SwitchableModel` that holds the training's :class:`SwitchableOptimizer` (:meth:`SwitchableModel.bind`), the
local modes that wrap the optimizer (``local_sgd``, ``diloco``, ``adaptive``, ``selective``): the optimizer's
``step`` then runs through the mode's wrapper (torch's ``PostLocalSGDOptimizer`` with the mode's averager), the
same one :func:`~autosync.executor.apply.apply` builds. Under a local mode the ranks' parameters and optimizer
states drift apart; **leaving one** (a collective, at the switch) first finishes the averager's work in flight,
then averages every parameter and every floating-point optimizer state tensor over all ranks
(torch's ``average_parameters``)::

    theta <- mean_r theta_r        s <- mean_r s_r   (each state tensor s: Adam's moments, SGD's momentum, ...)

so every rank starts the next strategy from the same parameters, as DDP requires.

**Into a local mode, past its warm-up.** Its warm-up (``warmup_steps`` bsp steps) is the training's, not the
strategy's: once the training has taken as many steps (at least one), a local mode whose averager can start late
(torch's ``PeriodicModelAverager``: local SGD, selective; the outer loop's: DiLoCo, a local mode through a codec;
:func:`autosync.plans.outer.resumable`) starts past it, ``resumed``: its hook's steps are local from the first,
and its averager's first averaging is a whole period away (:func:`autosync.plans.outer.resume`). What the ranks
then start from:

- from a synchronous mode: their parameters, equal; DiLoCo's global copy starts from them;
- from a local mode: where each rank is, without an exchange. torch's averager averages them at its period;
  DiLoCo goes on from the global copy the last outer loop left (equal on every rank), so the pseudo-gradient of its
  first synchronization holds the inner steps the ranks took before the switch as well. Only into DiLoCo from a
  mode without a global copy (plain local SGD) are the parameters averaged first, and the global copy starts there.

On a slow link that saves, per switch, the warm-up's bsp steps and an all-reduce of the model. Into another local
mode that does not start past its warm-up (adaptive, or a training younger than the warm-up) only the parameters
are averaged: the optimizer's state stays each rank's own there, as it does under one (the state is most of the
bytes: Adam's two moments are twice the parameters'). Refused with one line, never
explored live: ZeRO's sharded state, asp (it trains without DDP, each rank at its own pace), and local modes on a
framework's DDP (:class:`SwitchableHook`: the framework steps its own optimizer). A strategy that raises inside
the comm hook during a backward is not caught here: torch raises it from the user's ``backward()``.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from autosync.executor.apply import _ranks_per_host, tuned_module
from autosync.executor.hooks import SyncState, autosync_hook
from autosync.plans.outer import global_copy, has_global_copy, resumable, resume
from autosync.strategy import Strategy
from autosync.workloads import embedding_parameter_names


def switchable(strategy: Strategy, local: bool = False) -> str | None:
    """Why ``strategy`` cannot be switched to in a live training (None: it can); ``local``: the switcher can run the
    local modes that wrap the optimizer (a :class:`SwitchableModel` bound to its optimizer)."""
    if strategy.optimizer_sharding == "zero":
        return "optimizer_sharding: zero reshapes the optimizer's state"
    kind = strategy.sync.kind
    if kind.asynchronous:
        return f"sync mode {strategy.sync.mode} trains without DDP"
    if kind.wraps_optimizer and not local:
        return f"sync mode {strategy.sync.mode} wraps the optimizer"
    return None


def average_everywhere(params: list, optimizer, pg) -> None:
    """Collective: every parameter in ``params`` and every floating-point state tensor ``optimizer`` (None: none)
    holds for them, averaged over the ranks of ``pg`` in place (one flat all-reduce, torch's
    ``average_parameters``)."""
    from torch.distributed.algorithms.model_averaging.utils import average_parameters

    tensors = list(params)
    for p in params if optimizer is not None else ():
        for _, t in sorted(optimizer.state.get(p, {}).items()):
            if torch.is_tensor(t) and t.is_floating_point():
                tensors.append(t)
    with torch.no_grad():
        average_parameters(iter(tensors), pg)


class SwitchableModel(torch.nn.Module):
    """The user's model, trained through the DDP of the strategy of the moment (see the module's docstring)."""

    def __init__(self, module: torch.nn.Module, strategy: Strategy, process_group=None,
                 ranks_per_host: int | None = None, **hook_options):
        super().__init__()
        self.module = module
        pg = process_group if process_group is not None else dist.group.WORLD
        object.__setattr__(self, "_pg", pg)
        object.__setattr__(self, "_rph", _ranks_per_host(ranks_per_host))
        object.__setattr__(self, "_hook_options", hook_options)
        object.__setattr__(self, "_embeddings", embedding_parameter_names(module))
        object.__setattr__(self, "ddp", None)
        object.__setattr__(self, "strategy", None)
        object.__setattr__(self, "_optimizer", None)
        object.__setattr__(self, "resumed", False)
        why = switchable(strategy)
        if why:
            raise ValueError(f"cannot train by {strategy.summary()}: {why}")
        state = SyncState(module, strategy, pg, self._rph, self._embeddings, **hook_options)
        self._install(strategy, state, init_sync=True)

    @property
    def autosync_state(self) -> SyncState:
        return self.ddp.autosync_state

    def bind(self, optimizer: "SwitchableOptimizer") -> None:
        """The training's optimizer: with it the local modes can be switched to (their wrapper steps it)."""
        object.__setattr__(self, "_optimizer", optimizer)

    def adapt(self, strategy: Strategy) -> Strategy | None:
        """The strategy as this switcher would train it: itself (the DDP is wrapped again at each switch); None when
        it cannot (:func:`switchable`)."""
        return None if switchable(strategy, local=self._optimizer is not None) else strategy

    def forward(self, *args, **kwargs):
        return self.ddp(*args, **kwargs)

    def no_sync(self):
        return self.ddp.no_sync()

    def _install(self, strategy: Strategy, state: SyncState, init_sync: bool) -> None:
        if self.ddp is not None:     # its reducer's hooks on the parameters go now, not whenever it is collected
            self.ddp._remove_autograd_hooks()
            for handle in getattr(self.ddp, "_accum_grad_hooks", []):
                handle.remove()
        f = strategy.fusion
        ddp = DDP(self.module, process_group=self._pg, bucket_cap_mb=f.bucket_cap_mb,
                  gradient_as_bucket_view=f.gradient_as_bucket_view, static_graph=f.static_graph,
                  init_sync=init_sync)
        ddp.register_comm_hook(state, autosync_hook)
        ddp.autosync_state = state
        old = self.ddp
        object.__setattr__(self, "ddp", ddp)
        object.__setattr__(self, "strategy", strategy)
        if old is not None:
            old.autosync_state.close()

    def switch(self, strategy: Strategy) -> str | None:
        """Collective: move every rank to ``strategy``; None when done, else why every rank stayed where it was.
        ``resumed`` says afterwards whether a local mode switched to started past its warm-up (see the module's
        docstring)."""
        local = self._optimizer is not None
        state, error = candidate_state(self.module, strategy, self._pg, self._rph, self._embeddings, local=local,
                                       **self._hook_options)
        if error is not None:
            return error
        leaving = self.strategy.sync.kind.wraps_optimizer
        old = getattr(self._optimizer.inner, "averager", None) if leaving else None
        if getattr(old, "drain", None) is not None:     # outer all-reduces in flight finish first
            old.drain()
        inner = None
        if local:
            from autosync.executor.apply import wrap_optimizer

            raw = self._optimizer.optimizer
            inner = wrap_optimizer(raw, self.module, strategy, self._pg, state) \
                if strategy.sync.kind.wraps_optimizer else raw
        new = getattr(inner, "averager", None)
        params = [p for p in self.module.parameters() if p.requires_grad]
        resumed = new is not None and resumable(new) and self._optimizer.steps >= max(1, new.warmup_steps)
        # the ranks' parameters are apart when a local mode past its warm-up (or one whose schedule is its own) ends
        apart = leaving and not (resumable(old) and old.step <= old.warmup_steps)
        carried = global_copy(old) if resumed and leaving else None
        # a local mode past its warm-up goes on from where the ranks are: torch's averager averages them at its
        # period, the outer loop's synchronizes against the global copy carried over; one with a global copy to
        # start and none to carry starts it from the ranks' mean
        goes_on = resumed and (carried is not None or not has_global_copy(new))
        if apart and not goes_on:
            # every rank from the same point: into another local mode the optimizer's state stays each rank's own,
            # as it is under one; into a synchronous one it is averaged too
            average_everywhere(params, None if strategy.sync.kind.wraps_optimizer else self._optimizer.optimizer,
                               self._pg)
        for p in self.module.parameters():
            p.grad = None
        self._install(strategy, state, init_sync=False)
        if local:
            self._optimizer.inner = inner
        if resumed:
            resume(new, [p for g in self._optimizer.optimizer.param_groups for p in g["params"] if p.requires_grad],
                   carried)
            state.iteration = strategy.sync.warmup_steps       # the hook's steps are local from the first
        object.__setattr__(self, "resumed", resumed)
        return None

    def release(self) -> None:
        """The end of the training: ``"auto"``'s tuner commits what it measured if its search had not ended
        (:meth:`~autosync.search.online.OnlineTuner.finish`); then the current hook's worker thread stops and its
        subgroups go."""
        tuner = getattr(self, "autosync_tuner", None)
        if tuner is not None:
            tuner.finish()
        if self.ddp is not None:
            self.ddp.autosync_state.close()


def agree(pg, build):
    """Collective: ``build()`` on every rank, then agree whether every rank succeeded. Returns (what it built or None,
    None) when all did, else (None, every failing rank's reason); what any rank built is closed then."""
    error, built = None, None
    try:
        built = build()
    except Exception as e:  # noqa: BLE001 - any failure of a candidate reverts every rank
        error = f"{type(e).__name__}: {e}"
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(pg) == "nccl" else \
        torch.device("cpu")
    ok = torch.tensor([0 if error else 1], dtype=torch.int32, device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=pg)
    if ok.item():
        return built, None
    if built is not None:
        built.close()
    errors: list = [None] * dist.get_world_size(pg)
    dist.all_gather_object(errors, error, group=pg)
    return None, "; ".join(f"rank {r}: {e}" for r, e in enumerate(errors) if e)


def candidate_state(module, strategy: Strategy, pg, ranks_per_host, embeddings, local: bool = False,
                    **hook_options):
    """Collective (as :func:`agree`): ``strategy``'s SyncState on every rank, or (None, why not). A strategy that
    cannot be switched to at all is refused on every rank alike, before anything is built."""
    error = switchable(strategy, local)
    if error is not None:
        return None, error

    def build() -> SyncState:
        strategy.check_world(dist.get_world_size(pg))
        return SyncState(module, strategy, pg, ranks_per_host, embeddings, **hook_options)

    return agree(pg, build)


def framework_fusion(ddp: DDP, strategy: Strategy) -> Strategy:
    """``strategy`` with the bucket options of an already-wrapped DDP (which cannot change them)."""
    cap = getattr(ddp, "bucket_bytes_cap", int(strategy.fusion.bucket_cap_mb * 2 ** 20))
    fusion = {"bucket_cap_mb": round(cap / 2 ** 20, 6),
              "gradient_as_bucket_view": bool(getattr(ddp, "gradient_as_bucket_view", False)),
              "static_graph": bool(getattr(ddp, "static_graph", False))}
    return Strategy.from_dict({**strategy.canonical(), "fusion": fusion})


class SwitchableHook:
    """What a framework's DDP (Lightning's, the Trainer's) can switch: its comm hook. One hook is registered once and
    runs the :class:`~autosync.executor.hooks.SyncState` of the moment; :meth:`switch` (collective, as
    :meth:`SwitchableModel.switch`) swaps it. DDP's buckets were laid out when the framework wrapped the model:
    every strategy here carries the DDP's own ``fusion`` (:func:`framework_fusion`)."""

    def __init__(self, ddp: DDP, process_group=None, ranks_per_host: int | None = None, module=None):
        self.ddp = ddp
        self.module = tuned_module(ddp, module)
        self._pg = process_group if process_group is not None else ddp.process_group
        self._rph = _ranks_per_host(ranks_per_host)
        self._embeddings = embedding_parameter_names(self.module)
        self.strategy = framework_fusion(ddp, Strategy.default())
        self.state = SyncState(self.module, self.strategy, self._pg, self._rph, self._embeddings)
        ddp.register_comm_hook(self, _switching_hook)
        ddp.autosync_state = self.state

    def adapt(self, strategy: Strategy) -> Strategy | None:
        """The strategy as this switcher trains it: with the DDP's own bucket options; None when it cannot (a local
        mode: the framework steps its own optimizer)."""
        return None if switchable(strategy) else framework_fusion(self.ddp, strategy)

    def switch(self, strategy: Strategy) -> str | None:
        why = switchable(strategy)
        if why is not None:
            return why
        strategy = self.adapt(strategy)
        built, error = candidate_state(self.module, strategy, self._pg, self._rph, self._embeddings)
        if error is not None:
            return error
        old, self.state, self.strategy = self.state, built, strategy
        built.hook_calls = old.hook_calls        # the DDP's count across its strategies, as the integrations report it
        self.ddp.autosync_state = built
        old.close()
        return None

    def release(self) -> None:
        self.state.close()


def _switching_hook(holder, bucket):     # no annotations: DDP checks them, and this module's are strings
    """DDP comm hook: :func:`~autosync.executor.hooks.autosync_hook` with the holder's state of the moment."""
    return autosync_hook(holder.state, bucket)


class SwitchableOptimizer:
    """The user's optimizer with callbacks after each ``step`` (where the online tuner may switch strategies).
    ``step`` runs through ``inner``: the optimizer itself, or a local mode's wrapper of it (set by the switch);
    ``last_step_s``: how long the last one took (a local mode's averaging included)."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer
        self.inner = optimizer
        self.on_step: list = []
        self.last_step_s = 0.0
        self.steps = 0          # steps taken through it

    def step(self, closure=None):
        t0 = time.perf_counter()
        out = self.inner.step(closure) if closure is not None else self.inner.step()
        self.last_step_s = time.perf_counter() - t0
        self.steps += 1
        for callback in self.on_step:
            callback()
        return out

    def zero_grad(self, set_to_none: bool = True):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name):          # param_groups, state, state_dict, load_state_dict, defaults, ...
        return getattr(self.optimizer, name)
