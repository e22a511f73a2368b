"""Hugging Face Transformers ``Trainer``: a callback that trains by an autosync strategy file.

    from transformers import Trainer, TrainingArguments
    from autosync.integrations.transformers import AutosyncCallback, training_arguments

    args = TrainingArguments("out", **training_arguments("strategy.yaml"), ...)   # DDP's bucket options
    trainer = Trainer(model, args, train_dataset=...)
    trainer.add_callback(AutosyncCallback(trainer, "strategy.yaml"))
    trainer.train()        # under torchrun

The Trainer wraps the model in DDP itself (through Accelerate) just before training starts; at
``on_train_begin`` the callback registers autosync's comm hook on that DDP (:func:`autosync.register`), and
for ``local_sgd``, ``adaptive`` and ``selective`` runs the mode's parameter averager after every optimizer
step (``on_optimizer_step``), as torch's PostLocalSGDOptimizer would. DDP's bucket options must be given to
``TrainingArguments`` (``ddp_bucket_cap_mb``, ``ddp_static_graph``): :func:`training_arguments` gives them. Refused with one line: ``sync: asp`` and
``optimizer_sharding: zero``.

``AutosyncCallback(trainer, "auto", auto_options={...})`` tunes while training (:func:`autosync.api.auto`): the
comm hook is switched among lossless candidates at the end of update steps (``on_step_end``), DDP's bucket
options staying those the Trainer wrapped with; ``auto_options`` are :class:`autosync.api.AutoOptions`' fields.
"""
from __future__ import annotations

import os

from transformers import TrainerCallback

from autosync.strategy import Strategy, StrategyError, load_strategy


def _load(strategy) -> Strategy:
    s = strategy if isinstance(strategy, Strategy) else load_strategy(strategy)
    if s.sync.kind.asynchronous:
        raise StrategyError(f"sync.mode: {s.sync.mode} trains without DDP; the Trainer cannot carry it")
    if s.optimizer_sharding == "zero":
        raise StrategyError("optimizer_sharding: zero is not carried by AutosyncCallback; use the Trainer's "
                            "DeepSpeed or FSDP options for sharded optimizer state")
    return s


def training_arguments(strategy: Strategy | str | os.PathLike) -> dict:
    """``TrainingArguments`` keyword arguments for the strategy's DDP bucket options: ``ddp_bucket_cap_mb`` (an
    integer there: rounded, at least 1) and ``ddp_static_graph``. The Trainer has no knob for
    ``gradient_as_bucket_view`` (it keeps DDP's default, False; the hook runs either way). ``"auto"``: none (the
    tuner keeps the layout the Trainer wraps with)."""
    if isinstance(strategy, str) and strategy == "auto":
        return {}
    s = _load(strategy)
    return {"ddp_bucket_cap_mb": max(1, round(s.fusion.bucket_cap_mb)), "ddp_static_graph": s.fusion.static_graph}


class AutosyncCallback(TrainerCallback):
    """Registers autosync's comm hook on the Trainer's DDP model when training begins; runs local SGD's averager.
    ``module``: the attribute of the Trainer's model that holds the model that was tuned, when names differ."""

    def __init__(self, trainer, strategy: Strategy | str | os.PathLike, ranks_per_host: int | None = None,
                 module=None, auto_options: dict | None = None):
        self.trainer, self.module = trainer, module
        self.auto = self.tuner = self.switch = None
        if isinstance(strategy, str) and strategy == "auto":
            from autosync.api import AutoOptions

            self.auto = AutoOptions.build(**(auto_options or {}))
            strategy = Strategy.default()
        elif auto_options:
            raise StrategyError('auto_options go with AutosyncCallback(trainer, "auto")')
        self.strategy = _load(strategy)
        self.ranks_per_host = ranks_per_host
        self.state = None
        self.averager = None

    def on_train_begin(self, args, state, control, **kwargs):
        import warnings

        from torch.nn.parallel import DistributedDataParallel as DDP

        from autosync.executor.apply import attach_hook, fusion_mismatch

        model = self.trainer.model_wrapped
        if not isinstance(model, DDP):
            raise StrategyError("AutosyncCallback: the Trainer did not wrap the model in DistributedDataParallel "
                                "(run it under torchrun with more than one process)")
        if self.auto is not None:
            from autosync.api import auto_tuner
            from autosync.executor.switch import SwitchableHook

            self.switch = SwitchableHook(model, ranks_per_host=self.ranks_per_host, module=self.module)
            self.state = self.switch.state
            optimizer = getattr(self.trainer.optimizer, "optimizer", self.trainer.optimizer)   # Accelerate wraps it
            self.tuner = auto_tuner(self.switch, optimizer, self.auto, self.ranks_per_host)
            return
        mismatch = fusion_mismatch(model, self.strategy)
        if mismatch:
            warnings.warn(f"AutosyncCallback: the Trainer wrapped the model with {mismatch}; pass "
                          f"TrainingArguments(**training_arguments(strategy))", stacklevel=2)
        self.state = attach_hook(model, self.strategy, ranks_per_host=self.ranks_per_host, module=self.module)
        self.averager = self.strategy.sync.kind.averager(self.strategy.sync, self.state.pg)

    def on_optimizer_step(self, args, state, control, **kwargs):
        """After each optimizer step, before the gradients are zeroed (the averager skips parameters without
        gradients), as torch's PostLocalSGDOptimizer does."""
        if self.averager is not None:
            self.averager.average_parameters(p for p in self.trainer.model.parameters() if p.requires_grad)

    def on_step_end(self, args, state, control, **kwargs):
        """``"auto"``: the end of an update step is the end of the tuner's step."""
        if self.tuner is not None:
            self.tuner.after_step()
            self.state = self.switch.state

    def on_train_end(self, args, state, control, **kwargs):
        if self.tuner is not None:      # a training that ended during the search: what it measured so far
            self.tuner.finish()
        if self.state is not None:
            self.state.close()
