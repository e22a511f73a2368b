"""``allreduce``: ring all-reduce of the segment (DDP's own algorithm).

    cost = t_ar(n)
"""
from __future__ import annotations

from autosync.plans.base import PlanDef


class AllReduce(PlanDef):
    name = "allreduce"
    features = {"frac_plan_allreduce": 0.0}
    fast_path = True

    def run(self, comm, t, seg, owners) -> None:
        import torch.distributed as dist

        dist.all_reduce(t, group=comm.pg)

    def cost(self, sim, nbytes, shapes, touched, owners, elem_size, rows=()) -> float:
        return sim.t("all_reduce", nbytes)


PLAN = AllReduce()
