"""``none``: the gradient is sent as it is (fp32); the plan sums it and every rank divides by W.

    cost = plan(n)
"""
from __future__ import annotations

from autosync.plans.base import CompressorDef


class NoCompression(CompressorDef):
    name = "none"
    identity = True
    features = {"frac_comp_none": 0.0}

    def run(self, comm, flat, seg, state, reduce) -> None:
        reduce(flat)
        flat.div_(comm.world)

    def cost(self, sim, compressor, nbytes, shapes, plan_cost):
        return plan_cost(nbytes, 4), nbytes


COMPRESSOR = NoCompression()
