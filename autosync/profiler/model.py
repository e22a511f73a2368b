"""ModelProfile: what the cost model needs to know about a workload's model.

Per trainable parameter (in DDP's steady-state bucket order, i.e. the order gradients
become ready): name, shape, element count, dtype, owning module type, whether it is an
embedding table and the fraction of its rows one batch touches, and the moment its
gradient is ready, in seconds after backward starts (``register_post_accumulate_grad_hook``).
Step phases (forward, backward, optimizer step) are medians of repeated runs; FLOPs per
step come from ``torch.utils.flop_counter``; peak memory is the process's VmHWM.

DDP's bucket layout for any ``bucket_cap_mb`` is computed with torch's own
``_compute_bucket_assignment_by_size`` over the ready order, as DDP does when it rebuilds
its buckets after the first iteration (first bucket capped at 1 MiB).
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from autosync import workloads
from autosync.errors import UserError
from autosync.executor.memory import peak_rss_mb, reset_peak_rss

FIRST_BUCKET_BYTES = getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 1 << 20)


@dataclass(frozen=True)
class ParamInfo:
    name: str
    shape: tuple[int, ...]
    numel: int
    dtype: str
    module_type: str
    is_embedding: bool
    touched_rows: float      # fraction of rows with a non-zero gradient per batch (1.0 for dense)
    ready_s: float           # gradient ready, seconds after backward started
    factor_rows: float = 0.0  # rows of the factors per step whose product is its gradient (plan sfb); 0: none

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty(0, dtype=getattr(torch, self.dtype)).element_size()


@dataclass
class ModelProfile:
    workload: str
    batch_size: int
    params: list[ParamInfo]          # in gradient-ready order (DDP's steady-state bucket order)
    forward_s: float
    backward_s: float
    optimizer_s: float
    flops_per_step: float
    peak_mem_mb: float
    threads: int = 1
    extra: dict = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(p.nbytes for p in self.params)

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s + self.optimizer_s

    def buckets(self, bucket_cap_mb: float) -> list[list[int]]:
        """DDP's buckets for ``bucket_cap_mb``: lists of indices into ``params``, in reduction order."""
        tensors = [torch.empty(p.numel, dtype=getattr(torch, p.dtype), device="meta") for p in self.params]
        limits = [FIRST_BUCKET_BYTES, int(bucket_cap_mb * 1024 * 1024)]
        indices = list(range(len(tensors)))
        buckets, _ = dist._compute_bucket_assignment_by_size(tensors, limits, [False] * len(tensors), indices)
        return sorted(buckets, key=min)

    def to_dict(self) -> dict:
        d = asdict(self)
        for p in d["params"]:
            p["shape"] = list(p["shape"])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ModelProfile":
        d = dict(d)
        d["params"] = [ParamInfo(**{**p, "shape": tuple(p["shape"])}) for p in d["params"]]
        return cls(**d)


def _owner_types(model: nn.Module) -> dict[str, str]:
    out = {}
    for mod_name, mod in model.named_modules():
        for p_name, _ in mod.named_parameters(recurse=False):
            out[f"{mod_name}.{p_name}" if mod_name else p_name] = type(mod).__name__
    return out


def profile_model(workload, batch_size: int | None = None, repeats: int = 5, warmup: int = 2,
                  seed: int = 0, device: str = "cpu") -> ModelProfile:
    """Profile ``workload`` in this process (no communication) at ``batch_size`` per rank, on ``device``.

    On CUDA every time is of finished kernels: phases are read after a synchronize, gradient-ready
    times from events recorded in the gradient hooks (:class:`autosync.executor.device.Marks`).
    """
    from autosync.executor.device import Marks, now, to_device

    model, make_batch = workloads.build(workload, seed=seed)
    model.to(device)
    batch_size = batch_size or workloads.default_batch_size(workload)
    workloads.check_batch(workload, model, make_batch, batch_size)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    embeddings = workloads.embedding_parameter_names(model)
    owner = _owner_types(model)
    optimizer = torch.optim.SGD([p for _, p in named], lr=1e-3, momentum=0.9)
    gen = torch.Generator().manual_seed(seed)

    ready: dict[str, list] = {n: [] for n, _ in named}      # marks, resolved to seconds after each backward
    touched: dict[str, list[float]] = {n: [] for n in embeddings}
    marks = Marks(device)
    ready_s: dict[str, list[float]] = {n: [] for n, _ in named}

    def hook_for(name: str):
        def hook(param: torch.Tensor) -> None:
            ready[name].append(marks.mark())
        return hook

    handles = [p.register_post_accumulate_grad_hook(hook_for(n)) for n, p in named]
    from autosync.plans.sfb import Factors, _matches, outer_sum

    factors = Factors(model, {id(p) for _, p in named})
    factor_rows: dict[str, list[float]] = {n: [] for n, p in named if id(p) in factors.names}
    fwd, bwd, opt = [], [], []
    reset_peak_rss()
    try:
        for i in range(warmup + repeats):
            batch = to_device(make_batch(batch_size, gen), device)
            t0 = now(device)
            loss = workloads.loss_of(model(**batch))
            t1 = now(device)
            marks.start()
            loss.backward()
            t2 = now(device)
            for n, v in ready.items():
                if i >= warmup:
                    ready_s[n].extend(marks.seconds(m) for m in v)
                v.clear()
            for n, p in named:
                if n in embeddings and p.grad is not None:
                    touched[n].append((p.grad.abs().sum(1) != 0).float().mean().item())
                if n in factor_rows:     # sfb: rows of its factors, if their product is its gradient
                    got = factors.take(id(p))
                    exact = got is not None and p.grad is not None and _matches(
                        outer_sum(got[1], got[0], factors.transposed[id(p)]), p.grad)
                    factor_rows[n].append(float(got[0].shape[0]) if exact else float("nan"))
            t3 = now(device)
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
            t4 = now(device)
            if i >= warmup:
                fwd.append(t1 - t0)
                bwd.append(t2 - t1)
                opt.append(t4 - t3)
    except UserError:
        raise
    except Exception as e:
        raise workloads.WorkloadError(f"workload {workload!r}: a training step failed: {type(e).__name__}: {e}") \
            from None
    finally:
        for h in handles:
            h.remove()
        factors.close()
    peak = peak_rss_mb()
    if device.startswith("cuda"):   # what bounds a GPU job is its device memory
        peak = torch.cuda.max_memory_allocated(torch.device(device)) / 2 ** 20

    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        workloads.loss_of(model(**to_device(make_batch(batch_size, gen), device))).backward()
    optimizer.zero_grad(set_to_none=False)

    infos = []
    for n, p in named:
        times = ready_s[n]
        infos.append(ParamInfo(
            name=n, shape=tuple(p.shape), numel=p.numel(), dtype=str(p.dtype).removeprefix("torch."),
            module_type=owner.get(n, ""), is_embedding=n in embeddings,
            touched_rows=statistics.fmean(touched[n]) if touched.get(n) else 1.0,
            ready_s=statistics.median(times) if times else statistics.median(bwd),
            factor_rows=_rows(factor_rows.get(n))))
    infos.sort(key=lambda info: info.ready_s)
    return ModelProfile(str(workload), batch_size, infos, statistics.median(fwd), statistics.median(bwd),
                        statistics.median(opt), float(counter.get_total_flops()), peak, torch.get_num_threads())


def _rows(seen: list[float] | None) -> float:
    """A weight's factor rows per step: their mean when every step's factors gave its gradient, else 0."""
    if not seen or any(math.isnan(r) for r in seen):
        return 0.0
    return statistics.fmean(seen)
