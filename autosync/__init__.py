"""autosync: learn how to synchronize gradients in data-parallel PyTorch training.

Public API::

    strategy = autosync.tune("bert-mini", cluster="2x1@100mbit", measure=8)   # or tune(model, make_batch, ...)
    strategy = autosync.load_strategy("strategy.yaml")
    model, optimizer = autosync.apply(model, optimizer, strategy)   # inside any DDP training script
    optimizer = autosync.register(ddp_model, strategy, optimizer)   # a model a framework wrapped in DDP already
"""
from autosync.cluster import Cluster, parse_cluster
from autosync.errors import UserError
from autosync.strategy import Strategy, StrategyError, load_strategy, loads_strategy, save_strategy


def __getattr__(name):
    """``apply``, ``register`` and ``release`` import torch: loaded on first use, so the CLI answers --help at once.
    ``apply`` and ``register`` are :mod:`autosync.api`'s (a strategy, a strategy file, or ``"auto"``)."""
    if name in ("apply", "register"):
        from autosync import api

        return getattr(api, name)
    if name in ("ddp_kwargs", "release"):
        from autosync.executor import apply as _apply

        return getattr(_apply, name)
    raise AttributeError(f"module 'autosync' has no attribute {name!r}")


def tune(*args, **kwargs):
    """Find a strategy for a workload or model on a cluster; see :func:`autosync.api.tune`."""
    from autosync.api import tune as _tune

    return _tune(*args, **kwargs)


def profile(*args, **kwargs):
    """Profile a workload and a cluster; see :func:`autosync.api.profile`."""
    from autosync.api import profile as _profile

    return _profile(*args, **kwargs)


__all__ = ["Cluster", "Strategy", "StrategyError", "UserError", "apply", "ddp_kwargs", "load_strategy", "loads_strategy",
           "parse_cluster", "profile", "register", "release", "save_strategy", "tune"]
__version__ = "0.1.0"
