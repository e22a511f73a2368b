"""What every training run on the ranks shares: the optimizer, the learning rate and the seeds.

A trial (:mod:`autosync.executor.measure`) and a paired efficiency run (:mod:`autosync.efficiency.train`) are
comparable only while they build the model, the optimizer and the data order the same way; this module is the
one place that says how.

- the model's initial weights: ``workloads.build(workload, seed=seed)`` on every rank (the same on all);
- the data order: rank ``r`` draws its batches from :func:`data_generator` ``(seed, r)``,
  ``torch.Generator().manual_seed(seed * 100_003 + r)``;
- the optimizer: :func:`make_optimizer`, Adam or SGD with momentum 0.9;
- the learning rate of the efficiency protocol (Adam): ``lr_of`` (:mod:`autosync.workloads`), a built-in
  workload's own, else ``DEFAULT_LR``.
"""
from __future__ import annotations

from autosync.workloads import DEFAULT_LR, lr_of  # noqa: F401  (a workload's own: autosync.workloads)


def make_optimizer(name: str, lr: float, params):
    """``adam``: torch.optim.Adam(lr); anything else: SGD with momentum 0.9."""
    import torch

    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def data_generator(seed: int, rank: int):
    """The generator rank ``rank`` draws its training batches from."""
    import torch

    return torch.Generator().manual_seed(seed * 100_003 + rank)
