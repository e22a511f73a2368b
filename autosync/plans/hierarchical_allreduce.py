"""``hierarchical_allreduce``: reduce inside each host, all-reduce among host leaders, broadcast inside the host.

    cost = t_reduce^intra(n) + t_ar^inter(n) + t_bcast^intra(n)     (several hosts of several ranks)
    cost = t_ar(n)                                                  (otherwise: it is a plain all-reduce)
"""
from __future__ import annotations

from autosync.plans.base import PlanDef


class HierarchicalAllReduce(PlanDef):
    name = "hierarchical_allreduce"
    needs_hosts = True
    features = {"frac_plan_hierarchical_allreduce": 0.0}

    def applicable(self, nodes: int, ranks_per_node: int, embedding_group: bool) -> bool:
        return nodes > 1 and ranks_per_node > 1

    def run(self, comm, t, seg, owners) -> None:
        import torch.distributed as dist

        if comm.intra_group is None:
            dist.all_reduce(t, group=comm.pg)
            return
        rph = comm.ranks_per_host
        leader = comm.global_rank((comm.rank // rph) * rph)
        dist.reduce(t, dst=leader, group=comm.intra_group)
        if comm.leader_group is not None and comm.rank % rph == 0:
            dist.all_reduce(t, group=comm.leader_group)
        dist.broadcast(t, src=leader, group=comm.intra_group)

    def cost(self, sim, nbytes, shapes, touched, owners, elem_size, rows=()) -> float:
        if sim.nodes == 1 or sim.ranks_per_node == 1:
            return sim.t("all_reduce", nbytes)
        return (sim.t("reduce", nbytes, "intra") + sim.t("all_reduce", nbytes, "inter")
                + sim.t("broadcast", nbytes, "intra"))


PLAN = HierarchicalAllReduce()
