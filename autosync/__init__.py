"""autosync: learn how to synchronize gradients in data-parallel PyTorch training.

Public API::

    strategy = autosync.load_strategy("strategy.yaml")
    model, optimizer = autosync.apply(model, optimizer, strategy)   # inside any DDP training script
"""
from autosync.errors import UserError
from autosync.executor.apply import apply, release
from autosync.strategy import Strategy, StrategyError, load_strategy, loads_strategy, save_strategy

__all__ = ["Strategy", "StrategyError", "UserError", "apply", "release", "load_strategy", "loads_strategy",
           "save_strategy"]
__version__ = "0.1.0"
