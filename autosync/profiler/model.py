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

import functools
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist

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
        return self.numel * element_size(self.dtype)


@functools.lru_cache(maxsize=None)
def element_size(dtype: str) -> int:
    """Bytes per element of the torch dtype named ``dtype`` ("float32", "bfloat16", ...)."""
    return torch.empty(0, dtype=getattr(torch, dtype)).element_size()


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
