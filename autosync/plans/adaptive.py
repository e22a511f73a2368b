"""``adaptive {max_period, threshold, warmup_steps}``: local SGD that averages when the ranks diverge.

The moment to synchronize is decided at run time, by all ranks together (after Prediction
Synchronous Parallel and Sync-on-the-fly). As in local SGD, after ``warmup_steps`` bsp steps the
gradients are averaged only inside a host; after every optimizer step each rank takes the same
fixed random sample of ``m`` (4096) of its parameters, ``x_r``, and one all-reduce of ``m + 1``
numbers gives every rank the divergence of the models::

    D = sqrt(mean_r ||x_r - xbar||^2) / ||xbar||          (xbar = mean_r x_r; the sampled local drift)

The parameters of all ranks are averaged (torch's ``average_parameters``, as local SGD's
averager does) when ``D > threshold`` (the models have drifted enough that averaging is worth
its cost) or when ``max_period`` steps have passed since the last averaging; so ranks that agree
(similar data, small learning rate) synchronize rarely and ranks that diverge often. The rule
is :meth:`AdaptiveModelAverager.average_parameters`; its two knobs are ``threshold`` (default
0.005: the local-SGD drift measured on the built-in workloads is 0.003-0.017) and
``max_period``. Each step's decision is the same on every rank (it is computed from reduced
numbers). The statistic's all-reduce is small but it is a barrier every step: this mode saves
bandwidth, not a straggler's waits. ::

    bucket cost = t_ar^intra(n) (several ranks per host; 0 with one)                      lossy
    step cost  += t_ar(4 (m + 1)) + t_ar(M) / (max_period / 2)      (simulator: averaging assumed at
                                                                     half the longest period)
It cannot be combined with ZeRO.
"""
from __future__ import annotations

import math

from autosync.plans.base import Field
from autosync.plans.local_sgd import LocalSGD

SAMPLE = 4096
MAX_PERIODS = (4, 8, 16)
THRESHOLDS = (0.002, 0.005, 0.01)
SEARCH_WARMUP_STEPS = 2


def _averager_class():
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.model_averaging import utils
    from torch.distributed.algorithms.model_averaging.averagers import ModelAverager

    class AdaptiveModelAverager(ModelAverager):
        """Averages parameters when the sampled divergence exceeds ``threshold`` or ``max_period`` steps passed.

        ``syncs`` counts averagings, ``divergences`` keeps each step's D (after the warm-up).
        """

        def __init__(self, warmup_steps: int, max_period: int, threshold: float, process_group=None,
                     sample: int = SAMPLE, seed: int = 0):
            super().__init__(process_group)
            self.warmup_steps, self.max_period, self.threshold = warmup_steps, max_period, threshold
            self.sample, self.seed = sample, seed
            self.last_sync = warmup_steps - 1
            self.syncs = 0
            self.divergences: list[float] = []
            self._index = None

        def _sampled(self, params: list) -> "torch.Tensor":
            if self._index is None:
                sizes = [p.numel() for p in params]
                n = sum(sizes)
                gen = torch.Generator().manual_seed(self.seed)
                picks = torch.randperm(n, generator=gen)[:min(self.sample, n)].sort().values
                self._index, start = [], 0
                for p, size in zip(params, sizes):
                    mine = picks[(picks >= start) & (picks < start + size)] - start
                    self._index.append(mine.to(p.device))
                    start += size
            return torch.cat([p.detach().reshape(-1)[i].double() for p, i in zip(params, self._index)])

        def divergence(self, params: list) -> float:
            x = self._sampled(params)
            stat = torch.cat([x, x.pow(2).sum().reshape(1)])
            dist.all_reduce(stat, group=self.process_group)
            world = dist.get_world_size(self.process_group)
            mean = stat[:-1] / world
            spread = max(0.0, float(stat[-1]) / world - float(mean.pow(2).sum()))
            return math.sqrt(spread) / max(float(mean.norm()), 1e-30)

        def average_parameters(self, params) -> None:
            if self.step >= self.warmup_steps:
                plist = list(utils.get_params_to_average(params))
                d = self.divergence(plist)
                self.divergences.append(d)
                if d > self.threshold or self.step - self.last_sync >= self.max_period:
                    utils.average_parameters_or_parameter_groups(params, self.process_group)
                    self.last_sync = self.step
                    self.syncs += 1
            self.step += 1

    return AdaptiveModelAverager


class Adaptive(LocalSGD):
    name = "adaptive"
    follows_trajectory = True
    fields = {"max_period": Field(8, 2, 10_000, unused=0), "threshold": Field(0.005, 0.0, 10.0, unused=0.0),
              "warmup_steps": Field(10, 0, 1_000_000, unused=0)}
    features = {"adaptive": 0.0, "adaptive_max_period": 0.0, "adaptive_threshold": 0.0}

    def suggest(self, trial, profile=None) -> dict:
        return {"warmup_steps": SEARCH_WARMUP_STEPS,
                "max_period": trial.suggest_categorical("adaptive_max_period", MAX_PERIODS),
                "threshold": trial.suggest_categorical("adaptive_threshold", THRESHOLDS)}

    def steps_per_round(self, sync) -> int:
        return sync.max_period

    def window(self, sync) -> float:
        return 1.0

    def averager(self, sync, process_group):
        return _averager_class()(sync.warmup_steps, sync.max_period, sync.threshold, process_group)

    def step_cost(self, sim, sync, model_bytes: float) -> float:
        return sim.t("all_reduce", 8 * (SAMPLE + 1)) + sim.t("all_reduce", model_bytes) / max(1.0, sync.max_period / 2)

    def sync_features(self, sync) -> dict[str, float]:
        return {"adaptive": 1.0, "adaptive_max_period": float(sync.max_period), "adaptive_threshold": sync.threshold}


MODE = Adaptive()
