"""PyTorch Lightning: a ``DDPStrategy`` that trains by an autosync strategy file.

    import pytorch_lightning as pl
    from autosync.integrations.lightning import AutosyncDDPStrategy

    trainer = pl.Trainer(devices=2, strategy=AutosyncDDPStrategy("strategy.yaml"))   # GPUs with NCCL or CPUs with gloo
    trainer.fit(model, loader)

What it carries: ``fusion`` (DDP's ``bucket_cap_mb``, ``gradient_as_bucket_view``, ``static_graph``), every
plan and compressor (autosync's comm hook, registered by :func:`autosync.register` once Lightning has
wrapped the model), ``ssp``, and the parameter averaging of ``local_sgd``, ``adaptive`` and ``selective``
(the mode's torch ``ModelAverager``, run by Lightning's own post-step averaging, as for Lightning's
``model_averaging_period``). Refused with one line when the strategy is built: ``sync: asp`` (no DDP at all)
and ``optimizer_sharding: zero`` (use Lightning's own ZeRO strategies). ``ranks_per_host`` defaults to the
number of devices per node.

``AutosyncDDPStrategy("auto", auto_options={...})`` tunes while training (:func:`autosync.api.auto`): the comm
hook is switched among lossless candidates at the end of optimizer steps (DDP's bucket options stay those it was
wrapped with); ``auto_options`` are :class:`autosync.api.AutoOptions`' fields (``out``, ``window``, ...).
"""
from __future__ import annotations

import os

import torch
from pytorch_lightning.strategies import DDPStrategy

from autosync.strategy import Strategy, StrategyError, load_strategy


class AutosyncDDPStrategy(DDPStrategy):
    """Lightning's ``DDPStrategy`` with an autosync strategy (a :class:`~autosync.Strategy` or a file path);
    ``module``: the attribute of the LightningModule that holds the model that was tuned (``"net"``), so that the
    file's parameter names match; other keyword arguments go to ``DDPStrategy`` (a ``bucket_cap_mb`` there would
    contradict the file: refused)."""

    strategy_name = "autosync_ddp"

    def __init__(self, strategy: Strategy | str | os.PathLike, ranks_per_host: int | None = None, module=None,
                 auto_options: dict | None = None, **kwargs):
        self._auto = None
        self._switch = self._tuner = None
        if isinstance(strategy, str) and strategy == "auto":
            from autosync.api import AutoOptions

            self._auto = AutoOptions.build(**(auto_options or {}))
            super().__init__(**kwargs)
            self.autosync_strategy, self.autosync_state = None, None
            self._ranks_per_host, self._module = ranks_per_host, module
            return
        if auto_options:
            raise StrategyError("auto_options go with AutosyncDDPStrategy(\"auto\")")
        s = strategy if isinstance(strategy, Strategy) else load_strategy(strategy)
        if s.sync.kind.asynchronous:
            raise StrategyError(f"sync.mode: {s.sync.mode} trains without DDP; Lightning's DDPStrategy cannot "
                                "carry it (use autosync.apply in a plain loop)")
        if s.optimizer_sharding == "zero":
            raise StrategyError("optimizer_sharding: zero is not carried by AutosyncDDPStrategy; use Lightning's "
                                "DeepSpeed or FSDP strategy for sharded optimizer state")
        clash = sorted({"bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "ddp_comm_hook",
                        "ddp_comm_state", "ddp_comm_wrapper", "model_averaging_period"} & set(kwargs))
        if clash:
            raise StrategyError(f"AutosyncDDPStrategy: {clash[0]} comes from the strategy file; do not pass it")
        from autosync.executor.apply import ddp_kwargs

        super().__init__(**ddp_kwargs(s), **kwargs)
        self.autosync_strategy = s
        self.autosync_state = None
        self._ranks_per_host = ranks_per_host
        self._module = module

    def _rph(self) -> int | None:
        return self._ranks_per_host or len(self.parallel_devices or []) or None

    def _register_ddp_hooks(self) -> None:
        from autosync.executor.apply import attach_hook

        if self._auto is not None:
            from autosync.executor.switch import SwitchableHook

            self._switch = SwitchableHook(self.model, ranks_per_host=self._rph(), module=self._module)
            self.autosync_state = self._switch.state
            return
        s = self.autosync_strategy
        rph = self._rph()
        state = attach_hook(self.model, s, ranks_per_host=rph, module=self._module)
        self.autosync_state = state            # kept after teardown unwraps the model (``hook_calls``)
        self._model_averager = s.sync.kind.averager(s.sync, state.pg)   # None for bsp and ssp

    def optimizer_step(self, optimizer, closure, model=None, **kwargs):
        """Lightning's step; with ``"auto"``, then the tuner's end of step (the tuner is made at the first step,
        when the optimizer exists)."""
        if self._auto is not None and self._tuner is None:
            from autosync.api import auto_tuner

            self._tuner = auto_tuner(self._switch, optimizer, self._auto, self._rph())
        if self._tuner is not None and callable(closure):
            inner, tuner = closure, self._tuner

            def closure():       # the loss Lightning's closure returns: the loss guard's input
                loss = inner()
                if isinstance(loss, torch.Tensor) and loss.dim() == 0:
                    tuner.observe_loss(loss)
                return loss
        out = super().optimizer_step(optimizer, closure, model, **kwargs)
        if self._tuner is not None:
            self._tuner.after_step()
            self.autosync_state = self._switch.state
        return out

    @property
    def autosync_tuner(self):
        """The online tuner of ``"auto"`` (its windows and commit), None otherwise."""
        return self._tuner

    def teardown(self) -> None:
        if self._tuner is not None:     # a training that ended during the search: what it measured so far
            self._tuner.finish()
        if self.autosync_state is not None:
            self.autosync_state.close()
        super().teardown()
