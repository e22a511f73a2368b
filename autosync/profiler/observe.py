"""A profile from a training that is running: the user's own steps, and a few seconds of its own collectives.

:class:`StepObserver` watches steps of a model wrapped in DDP (the comm hook of the strategy of the moment runs,
so the gradient-ready times are those of the real backward, with its communication overlapping as it does):

- forward: a forward pre-hook and hook on the user's model;
- each trainable parameter's gradient-ready time, seconds after the forward ended
  (``register_post_accumulate_grad_hook``; the loss's own few operations count as backward);
- backward: from the forward's end to the last gradient;
- optimizer: ``optimizer.step()``, by the optimizer's step pre- and post-hooks (a step ends with it);
- FLOPs of one step's forward and backward (``torch.utils.flop_counter`` around one observed step, which is
  then left out of the times: counting slows it);
- embeddings' touched rows from their gradients at the step; the batch size from the forward's first tensor.

Medians over the observed steps make a :class:`~autosync.profiler.model.ModelProfile` as
:func:`~autosync.profiler.measure.profile_model` would (no sfb factor rows: ``sfb`` is not proposed from it).
:func:`network_here` runs :func:`~autosync.profiler.measure.profile_network`'s micro-benchmarks on the live
process group: every rank calls it at the same step.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from autosync.executor.memory import peak_rss_mb
from autosync.profiler.model import ModelProfile, ParamInfo
from autosync.profiler.network import COLLECTIVES, Fit, NetworkProfile

#: the network bench of a live training: sizes up to 4 MiB, none predicted slower than 0.1 s (a few seconds in all)
LIVE_SIZES = tuple(4096 * 4 ** i for i in range(6))
#: a live sweep stops before the first size predicted slower than this, by collective: all-reduce (whose large sizes
#: DDP's buckets and the local modes' averaging send) and send/recv (whose slope labels a job's link,
#: autosync.api._job_cluster: at 25 ms an emulated 1 gbit link read 200 mbit once) at 0.1 s; the others at 25 ms.
#: bench/results/live_network.md compares it with one limit for all
LIVE_MAX_OP_S = {op: 0.1 if op in ("all_reduce", "send_recv") else 0.025 for op in COLLECTIVES}


class StepObserver:
    """Hooks on a live model that record its steps; :meth:`profile` turns them into a ModelProfile."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, name: str, flops_step: int = 1):
        from autosync.profiler.measure import _owner_types
        from autosync.workloads import embedding_parameter_names

        self.model, self.name = model, name
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.embeddings = embedding_parameter_names(model)
        self.owner = _owner_types(model)
        self.fwd: list[float] = []
        self.bwd: list[float] = []
        self.opt: list[float] = []
        self.ready: dict[str, list[float]] = {n: [] for n, _ in self.named}
        self.touched: dict[str, list[float]] = {n: [] for n in self.embeddings}
        self.batch_size = 0
        self.flops = 0.0
        self.steps = 0
        self._flops_step = flops_step
        self._counter = None
        self._t0 = self._t1 = None
        self._last = 0.0
        self._now: dict[str, float] = {}
        self._opt_t0 = 0.0
        self._handles = [model.register_forward_pre_hook(self._pre, with_kwargs=True),
                         model.register_forward_hook(self._post),
                         optimizer.register_step_pre_hook(self._opt_pre),
                         optimizer.register_step_post_hook(self._opt_post)]
        for n, p in self.named:
            self._handles.append(p.register_post_accumulate_grad_hook(self._ready_hook(n)))

    def _pre(self, module, args, kwargs):
        if self.steps == self._flops_step and self._counter is None:
            from torch.utils.flop_counter import FlopCounterMode

            self._counter = FlopCounterMode(display=False)
            self._counter.__enter__()
        if not self.batch_size:
            first = next((t for t in [*args, *kwargs.values()] if isinstance(t, torch.Tensor)), None)
            if first is None:
                first = next((t for v in kwargs.values() if isinstance(v, dict) for t in v.values()
                              if isinstance(t, torch.Tensor)), None)
            self.batch_size = int(first.shape[0]) if first is not None and first.dim() else 1
        self._t0 = time.perf_counter()

    def _post(self, module, args, output):
        self._t1 = time.perf_counter()
        self._now = {}

    def _ready_hook(self, name: str):
        def hook(param: torch.Tensor) -> None:
            if self._t1 is not None:
                t = time.perf_counter()
                self._now[name] = t - self._t1
                self._last = t
        return hook

    def _opt_pre(self, optimizer, args, kwargs):
        for n, p in self.named:
            if n in self.embeddings and p.grad is not None and p.grad.dim() == 2 and not p.grad.is_sparse:
                self.touched[n].append((p.grad.abs().sum(1) != 0).float().mean().item())
        self._opt_t0 = time.perf_counter()

    def _opt_post(self, optimizer, args, kwargs):
        """The end of a training step: record it."""
        t1 = time.perf_counter()
        if self._counter is not None:
            self._counter.__exit__(None, None, None)
            self.flops = float(self._counter.get_total_flops())
            self._counter = None
        elif self._t0 is not None and self._t1 is not None and self.steps > 0:   # the first step builds buckets
            self.fwd.append(self._t1 - self._t0)
            self.bwd.append(max(self._last - self._t1, 0.0))
            self.opt.append(t1 - max(self._opt_t0, self._last))   # a closure (Lightning) runs the step's backward
                                                                   # inside step(): the optimizer's part is after it
            for n, t in self._now.items():
                self.ready[n].append(t)
        self.steps += 1
        self._t0 = self._t1 = None

    def close(self) -> None:
        if self._counter is not None:
            self._counter.__exit__(None, None, None)
            self._counter = None
        for h in self._handles:
            h.remove()
        self._handles = []

    def profile(self) -> ModelProfile:
        """The ModelProfile of the steps observed (at least one timed step)."""
        if not self.fwd:
            raise ValueError("no training step observed yet")
        bwd = statistics.median(self.bwd)
        infos = []
        for n, p in self.named:
            infos.append(ParamInfo(
                name=n, shape=tuple(p.shape), numel=p.numel(), dtype=str(p.dtype).removeprefix("torch."),
                module_type=self.owner.get(n, ""), is_embedding=n in self.embeddings,
                touched_rows=statistics.fmean(self.touched[n]) if self.touched.get(n) else 1.0,
                ready_s=statistics.median(self.ready[n]) if self.ready[n] else bwd))
        infos.sort(key=lambda info: info.ready_s)
        return ModelProfile(self.name, self.batch_size, infos, statistics.median(self.fwd), bwd,
                            statistics.median(self.opt), self.flops, peak_rss_mb(), torch.get_num_threads(),
                            extra={"observed_steps": len(self.fwd)})


def network_here(ranks_per_host: int, device: str = "cpu", sizes=LIVE_SIZES, max_op_s: float | dict[str, float] = LIVE_MAX_OP_S,
                 reps: int = 3) -> NetworkProfile:
    """Collective: the network micro-benchmarks of :func:`~autosync.profiler.measure.profile_network`, run on the
    default process group by every rank at once; every rank gets rank 0's fits. Each sweep stops before a size
    predicted slower than ``max_op_s`` (``ahead``: a training pays for every second of it;
    bench/results/live_network.md compares the limits)."""
    from autosync.executor.launch import RankContext
    from autosync.profiler.measure import _bench_task

    world = dist.get_world_size()
    ctx = RankContext(dist.get_rank(), world, ranks_per_host, device=device, backend=dist.get_backend())
    raw = [_bench_task(ctx, tuple(sizes), max_op_s, reps, ahead=True)]
    dist.broadcast_object_list(raw, src=0)
    fits = {scope: {op: Fit.from_points(points) for op, points in ops.items()} for scope, ops in raw[0].items()}
    return NetworkProfile(world, ranks_per_host, fits, measured=True)
