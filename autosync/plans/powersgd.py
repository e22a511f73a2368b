"""``powersgd {rank}``: torch's PowerSGD hook (Vogels et al. 2019) on the segment, with error feedback.

Each matrix-shaped gradient ``M`` (n x m) is approximated by ``P Q^T`` of rank r, found by
one power iteration warm-started from the last step; ``P`` and ``Q`` are all-reduced in two
rounds; 1-D tensors (and matrices too small to gain) are all-reduced uncompressed::

    cost = t_ar(dense) + 2 t_ar(4 r (n + m) / 2) + 6 n m r / flop_rate      lossy

It works with plan allreduce only. Its first two steps are plain all-reduce
(``start_powerSGD_iter=2``).
"""
from __future__ import annotations

import math

from autosync.plans.base import CompressorDef, Field

RANKS = (1, 2, 4, 8, 16)


class _SegmentBucket:
    """The part of a GradBucket that torch's powerSGD_hook reads, for one segment."""

    def __init__(self, index: int, flat, seg):
        self._index, self._flat = index, flat
        self._grads = [flat[o:o + n].view(shape) for o, n, shape in seg.shapes]

    def buffer(self):
        return self._flat

    def gradients(self):
        return self._grads

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:  # iterations are counted by end_step, once per backward
        return False


class PowerSGD(CompressorDef):
    name = "powersgd"
    lossy = True
    plans = ("allreduce",)
    fields = {"rank": Field(4, 1, 1024)}
    features = {"frac_comp_powersgd": 0.0, "powersgd_rank": 0.0}

    def suggest(self, trial, prefix: str) -> dict:
        return {"rank": trial.suggest_categorical(f"{prefix}_powersgd_rank", RANKS)}

    def make_state(self, comm, group):
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

        return {"torch": powerSGD_hook.PowerSGDState(
            process_group=comm.pg, matrix_approximation_rank=group.compressor.rank, start_powerSGD_iter=2,
            min_compression_rate=2, use_error_feedback=True, warm_start=True, random_seed=0), "ids": {}}

    def run(self, comm, flat, seg, state, reduce) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

        seg_id = state["ids"].setdefault(seg.key, len(state["ids"]))
        out = powerSGD_hook.powerSGD_hook(state["torch"], _SegmentBucket(seg_id, flat, seg)).wait()
        if out.data_ptr() != flat.data_ptr():
            flat.copy_(out)

    def end_step(self, state) -> None:
        state["torch"].iter += 1

    def cost(self, sim, compressor, nbytes, shapes, plan_cost):
        r = compressor.rank
        low, dense, flops = 0.0, 0.0, 0.0
        for s in shapes:
            rows, cols = s[0], math.prod(s[1:]) if len(s) > 1 else 1
            k = min(r, rows, cols)
            if len(s) > 1 and (rows + cols) * k < rows * cols / 2:
                low += 4 * k * (rows + cols)
                flops += 6 * rows * cols * k
            else:
                dense += 4 * math.prod(s)
        t = sim.t("all_reduce", dense) + sim.t("all_reduce", low / 2) * 2 + flops / max(sim.flop_rate, 1.0)
        return t, dense + low

    def group_features(self, compressor, share: float) -> dict[str, float]:
        return {"powersgd_rank": compressor.rank * share}

    def error_norm(self, state) -> float | None:
        errors = state["torch"].error_dict.values()
        return sum(float(e.float().norm()) ** 2 for e in errors) ** 0.5


COMPRESSOR = PowerSGD()
