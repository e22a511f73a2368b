"""The outer loop that parameter-averaging modes share: pseudo-gradients, their codecs, fragments.

Used by ``diloco`` (its outer optimizer, streaming fragments, compressed pseudo-gradients) and by
``local_sgd`` and ``selective`` when they average through a compressor (``outer_compressor``): the math
is in :mod:`autosync.plans.diloco`'s docstring. With outer lr 1 and no momentum the outer step is
parameter averaging, ``theta_g - mean_r(theta_g - theta_r) = mean_r theta_r``; through a codec it is the
average of the parameters as the codec delivers them, ``mean_r (theta_g - decode(encode(theta_g - theta_r)))``.

Codecs (``outer_compressor``): ``fp16``, ``bf16``, ``int8`` (one fp32 scale per block of :data:`BLOCK`
values: ``code = round(127 x / max|x|)``) or ``fp4`` (E3M0: a sign and a power of two ``2^-k``,
k = 0..6, or zero, times the block's ``max|x|``; two codes per byte). Compressed pseudo-gradients are
all-gathered (codes and scales) and each rank decodes and averages them in fp32, so every rank computes
the same ``theta_g``; the outer step runs in fp32. Per value, the round trip errs by at most
(:func:`error_bound`): fp16 ``2^-11 |x|`` (in its normal range), bf16 ``2^-8 |x|``, int8
``max|x| / 254``, fp4 ``max(|x| / 3, max|x| 2^-7)``. Simulator::

    step cost += max(0, t_outer(M_c / F) - tau * t_compute) / (period / F)
    t_outer(b) = t_ar(b) uncompressed, t_ag(b) compressed        (M_c: the model's bytes as sent)
"""
from __future__ import annotations

from typing import Any

from autosync import validation as v
from autosync.plans.base import Field

#: outer codecs and the bytes each sends per fp32 value (scales included for the block codecs)
BLOCK = 256
OUTER_CODECS = {"none": 4.0, "fp16": 2.0, "bf16": 2.0, "int8": 1.0 + 4.0 / BLOCK, "fp4": 0.5 + 4.0 / BLOCK}
FP4_LEVELS = 7                 # nonzero magnitudes 2^0 .. 2^-6


def _codec(value: Any, path: str) -> str | None:
    if value not in OUTER_CODECS:
        v.fail(path, f"expected one of {', '.join(OUTER_CODECS)}, got {value!r}")
    return None if value == "none" else value


#: the field every averaging mode takes: how its pseudo-gradients travel. Unset (or "none") reads as None and is
#: not written, so strategies written before the field existed keep their form and hash.
OUTER_COMPRESSOR = Field(None, read=_codec, unused=None)


def codec_of(sync) -> str:
    """The codec a strategy's sync sends pseudo-gradients with (``"none"``: fp32)."""
    return sync.outer_compressor or "none"


def outer_cost(sim, sync, model_bytes: float) -> float:
    """Seconds per step of the outer exchange, not overlapped with compute (the module docstring's formula)."""
    codec = codec_of(sync)
    sent = model_bytes / 4 * OUTER_CODECS[codec] / sync.fragments
    op = "all_reduce" if codec == "none" else "all_gather"
    exposed = max(0.0, sim.t(op, sent) - sync.delay * sim.compute_s)
    return exposed / (sync.period / sync.fragments)


def error_bound(codec: str, x, block_max):
    """The largest |x - decode(encode(x))| the codec allows, per value (``block_max``: max|x| of x's block)."""
    import torch

    a = x.abs()
    if codec == "none":
        return torch.zeros_like(a)
    if codec == "fp16":
        return a * 2.0 ** -11 + 2.0 ** -24
    if codec == "bf16":
        return a * 2.0 ** -8 + 1e-38
    if codec == "int8":
        return block_max / 254 * (1 + 1e-6)
    return torch.maximum(a / 3, block_max * 2.0 ** -(FP4_LEVELS)) * (1 + 1e-6)


def _blocks(flat):
    import torch.nn.functional as F

    pad = (-flat.numel()) % BLOCK
    return F.pad(flat, (0, pad)).view(-1, BLOCK)


def _fp4_levels():
    """The magnitudes a 4-bit code stands for (times its block's max|x|): 0, 2^-6, ..., 2^-1, 1."""
    import torch

    return torch.tensor([0.0] + [2.0 ** -k for k in range(FP4_LEVELS - 1, -1, -1)])


def encode(codec: str, flat) -> list:
    """``flat`` (fp32, 1-D) as the tensors the codec sends."""
    import torch

    if codec == "none":
        return [flat]
    if codec in ("fp16", "bf16"):
        return [flat.to(torch.float16 if codec == "fp16" else torch.bfloat16)]
    blocks = _blocks(flat)
    scale = blocks.abs().amax(dim=1)
    unit = blocks / scale.clamp_min(1e-30)[:, None]          # in [-1, 1]
    if codec == "int8":
        return [torch.round(unit * 127).to(torch.int8), scale]
    # fp4: bit 3 the sign, bits 0-2 the index of the nearest of FP4 (linear distance)
    levels = _fp4_levels()
    index = torch.bucketize(unit.abs(), (levels[:-1] + levels[1:]) / 2).to(torch.uint8)
    code = (index | torch.where(unit < 0, 8, 0).to(torch.uint8)).view(-1)
    packed = code[0::2] | (code[1::2] << 4)
    return [packed, scale]


def decode(codec: str, parts: list, numel: int):
    """The fp32 values ``parts`` (from :func:`encode`) stand for, as a 1-D tensor of ``numel``."""
    import torch

    if codec in ("none", "fp16", "bf16"):
        return parts[0].float()
    if codec == "int8":
        codes, scale = parts
        return (codes.float() / 127 * scale[:, None]).view(-1)[:numel]
    packed, scale = parts
    code = torch.stack([packed & 15, packed >> 4], dim=1).view(-1)
    mag = _fp4_levels()[(code & 7).long()]
    value = torch.where(code >= 8, -mag, mag).view(-1, BLOCK) * scale[:, None]
    return value.view(-1)[:numel]


def fragment_starts(step: int, warmup_steps: int, period: int, fragments: int) -> list[int]:
    """The fragments whose synchronization starts after ``step`` (0-based; none during the warm-up): fragment f
    when ``step >= warmup_steps`` and ``(step - warmup_steps - f * period // fragments) % period == 0``."""
    if step < warmup_steps:
        return []
    return [f for f in range(fragments) if (step - warmup_steps - f * period // fragments) % period == 0]


def averager_class():
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.model_averaging import utils
    from torch.distributed.algorithms.model_averaging.averagers import ModelAverager

    class OuterAverager(ModelAverager):
        """The outer loop, run after every inner optimizer step (``average_parameters``), as torch's model
        averagers are (PostLocalSGDOptimizer, Lightning's and the Trainer's averaging calls). ``sync``: a strategy's
        sync (its ``period``, ``warmup_steps``, ``fragments``, ``delay``, ``mix``, ``outer_lr``, ``outer_momentum``,
        ``nesterov``, ``outer_compressor``; a mode without one of them reads its "unused" value, which is plain
        averaging).
        """

        def __init__(self, sync, process_group=None):
            super().__init__(process_group)
            self.sync = sync
            self.period, self.warmup_steps, self.fragments = sync.period, sync.warmup_steps, sync.fragments
            self.world = dist.get_world_size(self.process_group)
            self.global_params: list | None = None
            self.params: list | None = None     # the parameters the global copy stands for (set at its start)
            self.outer: list = []              # one torch SGD per fragment over that fragment's global copy
            self.members: list[list[int]] = []
            self.pending: dict[int, tuple] = {}   # fragment -> (step to apply at, work handle, buffers)

        # --- schedule -------------------------------------------------------------------------------------
        # --- the outer loop -------------------------------------------------------------------------------
        def _start(self, params: list, fragment: int):
            idx = self.members[fragment]
            delta = torch.cat([(self.global_params[i] - params[i].detach()).reshape(-1).float() for i in idx])
            codec = codec_of(self.sync)
            if codec == "none":
                work = dist.all_reduce(delta, group=self.process_group, async_op=True)
                return work, ("none", delta, delta.numel())
            parts = encode(codec, delta)
            gathered = [[torch.empty_like(p) for _ in range(self.world)] for p in parts]
            works = [dist.all_gather(g, p, group=self.process_group, async_op=True) for g, p in zip(gathered, parts)]
            return works, (codec, gathered, delta.numel())

        def _finish(self, params: list, fragment: int, work, payload) -> None:
            codec, data, numel = payload
            for w in (work if isinstance(work, list) else [work]):
                w.wait()
            if codec == "none":
                mean = data / self.world
            else:
                mean = sum(decode(codec, [g[r] for g in data], numel) for r in range(self.world)) / self.world
            idx = self.members[fragment]
            offset = 0
            for i in idx:
                g = self.global_params[i]
                n = g.numel()
                g.grad = mean[offset:offset + n].view_as(g).to(g.dtype)
                offset += n
            self.outer[fragment].step()
            mix = self.sync.mix
            with torch.no_grad():
                for i in idx:
                    p, g = params[i], self.global_params[i]
                    if mix:
                        p.mul_(mix).add_(g.to(p.dtype), alpha=1 - mix)
                    else:
                        p.copy_(g)

        def _begin(self, params: list, average: bool, start: dict | None = None) -> None:
            """The global copy starts from the ranks' parameters: equal at the end of the last bsp warm-up step;
            without a warm-up (``average``) they are averaged first, after the first step, as torch's averager
            does at its step ``warmup_steps``. ``start``: global tensors to go on from instead, by ``id`` of their
            parameter (:meth:`resume`)."""
            if average:
                utils.average_parameters_or_parameter_groups(params, self.process_group)
            start = start or {}
            self.params = list(params)
            self.global_params = [start[id(p)] if id(p) in start else p.detach().clone().float() for p in params]
            self.members = [list(range(f, len(params), self.fragments)) for f in range(self.fragments)]
            s = self.sync
            self.outer = [torch.optim.SGD([self.global_params[i] for i in idx], lr=s.outer_lr,
                                          momentum=s.outer_momentum, nesterov=s.nesterov and s.outer_momentum > 0)
                          if idx else None for idx in self.members]

        def average_parameters(self, params) -> None:
            # from its start on, the parameters the global copy stands for; before it, those with a gradient
            plist = self.params if self.params is not None else list(utils.get_params_to_average(params))
            step = self.step
            if step == self.warmup_steps - 1:
                self._begin(plist, average=False)
            elif step == 0 == self.warmup_steps:
                self._begin(plist, average=True)
            elif step >= self.warmup_steps:
                for f, (due, work, payload) in sorted(self.pending.items()):
                    if due == step:
                        self._finish(plist, f, work, payload)
                        del self.pending[f]
                for f in fragment_starts(step, self.warmup_steps, self.period, self.fragments):
                    if not self.members[f]:
                        continue
                    work, payload = self._start(plist, f)
                    if self.sync.delay:
                        self.pending[f] = (step + self.sync.delay, work, payload)
                    else:
                        self._finish(plist, f, work, payload)
            self.step += 1

        def resume(self, params: list, global_params: dict | None = None) -> None:
            """Start past the warm-up, the next synchronization of each fragment a whole schedule away (call ``s``
            of this averager is ``warmup_steps + 1 + s``): the training before stood for the warm-up. ``params``:
            the trainable parameters, in the optimizer's order. The global copy goes on from ``global_params`` (an
            outer loop's, :func:`global_copy`: equal on every rank), or starts from ``params``, which must then be
            equal on every rank."""
            self._begin(list(params), average=False, start=global_params)
            self.step = self.warmup_steps + 1

        def drain(self) -> None:
            """Wait for outer all-reduces still in flight (at the end of training)."""
            for _, work, _ in self.pending.values():
                for w in (work if isinstance(work, list) else [work]):
                    w.wait()
            self.pending.clear()

    return OuterAverager


def has_global_copy(averager) -> bool:
    """Whether ``averager`` is the outer loop's (it has a global copy and starts late through its own ``resume``)."""
    return callable(getattr(averager, "resume", None))


def resumable(averager) -> bool:
    """Whether ``averager`` can start past its warm-up (:func:`resume`): torch's ``PeriodicModelAverager`` (local SGD,
    selective) and the outer loop's (DiLoCo, a local mode through a codec)."""
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

    return isinstance(averager, PeriodicModelAverager) or has_global_copy(averager)


def global_copy(averager) -> dict | None:
    """The global copy an outer loop's ``averager`` synchronizes against (equal on every rank), by ``id`` of each
    parameter; None for another averager or before its warm-up ended."""
    if not has_global_copy(averager) or averager.global_params is None:
        return None
    return {id(p): g for p, g in zip(averager.params, averager.global_params)}


def resume(averager, params: list, global_params: dict | None = None) -> None:
    """Start ``averager`` (:func:`resumable`) past its warm-up, its next averaging a whole period away. torch's
    ``PeriodicModelAverager`` averages inside its call ``s`` when ``s >= warmup_steps`` and
    ``(s - warmup_steps) % period == 0``: starting at ``s = warmup_steps + 1`` it averages after ``period`` calls.
    The outer loop's (``OuterAverager.resume``) also sets its global copy."""
    if has_global_copy(averager):
        averager.resume(params, global_params)
    else:
        averager.step = averager.warmup_steps + 1
