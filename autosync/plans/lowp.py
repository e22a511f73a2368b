"""``fp16`` / ``bf16``: the gradient, divided by W first (no overflow), sent at half precision by the plan.

    cost = plan(n / 2)          lossy: rounding to 11 (fp16) or 8 (bf16) significant bits
"""
from __future__ import annotations

from autosync.plans.base import CompressorDef


class LowPrecision(CompressorDef):
    lossy = True

    def __init__(self, name: str):
        self.name = name
        self.features = {f"frac_comp_{name}": 0.0}

    def run(self, comm, flat, seg, state, reduce) -> None:
        import torch

        low = flat.div(comm.world).to(getattr(torch, {"fp16": "float16", "bf16": "bfloat16"}[self.name]))
        reduce(low)
        flat.copy_(low)

    def cost(self, sim, compressor, nbytes, shapes, plan_cost):
        return plan_cost(nbytes / 2, 2), nbytes / 2


FP16 = LowPrecision("fp16")
BF16 = LowPrecision("bf16")
