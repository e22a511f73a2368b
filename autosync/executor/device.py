"""The device a rank computes on, the backend that follows it, and clocks that are right on it.

One rank, one device: ``cuda:<LOCAL_RANK>`` when the job has GPUs, else ``cpu``
(``AUTOSYNC_DEVICE=cpu|cuda`` overrides). The backend follows the device: NCCL for CUDA,
gloo for CPU (``AUTOSYNC_BACKEND`` overrides; gloo also carries CUDA tensors for its
collectives, but its send and recv take host memory only: :func:`p2p_device`). CUDA kernels
run asynchronously to the host, so a clock read on the host measures nothing unless the
device is synchronized first: every timing in
autosync reads :func:`now` (synchronize, then ``perf_counter``) or, for marks taken from
inside autograd (gradient-ready times), records CUDA events resolved afterwards
(:class:`Marks`).
"""
from __future__ import annotations

import os
import time
from typing import Any

from autosync.context import device_kind


def default_device(local_rank: int | None = None) -> str:
    """``cuda:<local rank>`` when CUDA is available (or asked for), else ``cpu``."""
    import torch

    want = os.environ.get("AUTOSYNC_DEVICE", "").strip().lower()
    if want and want not in ("cpu", "cuda"):
        from autosync.errors import UserError

        raise UserError(f"AUTOSYNC_DEVICE={want!r}: use cpu or cuda")
    if want == "cpu" or (not want and not torch.cuda.is_available()):
        return "cpu"
    if not torch.cuda.is_available():
        from autosync.errors import UserError

        raise UserError("AUTOSYNC_DEVICE=cuda but torch sees no CUDA device (torch "
                        f"{torch.__version__}, CUDA build: {torch.version.cuda or 'no'})")
    lr = int(os.environ.get("LOCAL_RANK", 0)) if local_rank is None else local_rank
    return f"cuda:{lr % torch.cuda.device_count()}"


def backend_for(device: str) -> str:
    """nccl for a CUDA device, gloo for the CPU; ``AUTOSYNC_BACKEND`` overrides."""
    override = os.environ.get("AUTOSYNC_BACKEND", "").strip().lower()
    if override:
        return override
    return "nccl" if str(device).startswith("cuda") else "gloo"


def p2p_device(backend: str, device: str) -> str:
    """Where a point-to-point buffer lives: on ``device``, except over gloo, whose send/recv write the buffer's
    pointer to a socket as host memory (a CUDA tensor aborts the process: "writev ... Bad address", seen on an
    H200), so there it is on the CPU, as a gloo job on GPUs would stage it."""
    return "cpu" if str(backend).lower() == "gloo" else device


def describe(device: str) -> dict[str, Any]:
    """Name and count of the devices and the library versions, for a Context's environment."""
    import torch

    out: dict[str, Any] = {}
    if device_kind(device) == "cuda":
        out.update(device_name=torch.cuda.get_device_name(torch.device(device)),
                   device_count=torch.cuda.device_count(), cuda=torch.version.cuda)
        try:
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001 - a build without NCCL
            out["nccl"] = None
    else:
        out.update(device_name="cpu", device_count=os.cpu_count())
    return out


def set_device(device: str) -> None:
    """Make ``device`` this thread's current CUDA device (no-op on the CPU)."""
    if device_kind(device) == "cuda":
        import torch

        torch.cuda.set_device(torch.device(device))


def synchronize(device: str) -> None:
    """Wait for every kernel queued on ``device`` (no-op on the CPU)."""
    if device_kind(device) == "cuda":
        import torch

        torch.cuda.synchronize(torch.device(device))


def now(device: str) -> float:
    """``perf_counter()`` after the device has finished what was queued: a host clock that means something."""
    synchronize(device)
    return time.perf_counter()


def to_device(batch: dict, device: str) -> dict:
    """A batch (keyword arguments of one forward call) with its tensors on ``device``."""
    if device_kind(device) == "cpu":
        return batch
    return {k: (v.to(device, non_blocking=True) if hasattr(v, "to") else v) for k, v in batch.items()}


def reduce_values(values, op: str = "sum", device: str = "cpu", group=None, dtype=None) -> list:
    """All-reduce a list (or list of lists) of numbers over ``group`` and return it on the host.

    NCCL reduces only CUDA tensors, so the numbers travel on ``device`` and come back.
    """
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=dtype or torch.float64, device=device)
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op], group=group)
    return t.cpu().tolist()


class Marks:
    """Moments inside a step (e.g. when each gradient is ready), relative to a start, right on any device.

    On the CPU a mark is ``perf_counter()``; on CUDA it is an event recorded on the current
    stream, resolved by :meth:`seconds` after a synchronize, so it dates the kernels'
    completion rather than their launch.
    """

    def __init__(self, device: str):
        self.cuda = device_kind(device) == "cuda"
        self.device = device
        self._start: Any = None

    def mark(self) -> Any:
        if self.cuda:
            import torch

            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def start(self) -> None:
        self._start = self.mark()

    def seconds(self, mark: Any) -> float:
        """Seconds from :meth:`start` to ``mark`` (synchronizes on CUDA)."""
        if self.cuda:
            mark.synchronize()
            return self._start.elapsed_time(mark) / 1e3
        return mark - self._start
