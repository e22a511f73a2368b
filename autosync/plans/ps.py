"""``ps``: a parameter server built from collectives: reduce to the owner rank, broadcast from it.

    cost = t_reduce(n) + t_bcast(n)

The owner is ``placement[0]``, or the least-loaded rank by bytes (see ``Strategy.owners``).
"""
from __future__ import annotations

from autosync.plans.base import PLACEMENT, PlanDef


class ParameterServer(PlanDef):
    name = "ps"
    fields = {"placement": PLACEMENT}
    features = {"frac_plan_ps": 0.0}

    def owner_count(self, partitions: int) -> int:
        return 1

    def run(self, comm, t, seg, owners) -> None:
        import torch.distributed as dist

        owner = comm.global_rank(owners[0])
        dist.reduce(t, dst=owner, group=comm.pg)
        dist.broadcast(t, src=owner, group=comm.pg)

    def cost(self, sim, nbytes, shapes, touched, owners, elem_size, rows=()) -> float:
        return sim.t("reduce", nbytes) + sim.t("broadcast", nbytes)


PLAN = ParameterServer()
