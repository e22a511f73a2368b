"""``sharded_ps``: the segment cut into ``partitions`` shards, each reduced to and broadcast from its owner.

With one shard per rank, owned in rank order, this is reduce-scatter + all-gather::

    cost = t_rs(n) + t_ag(n)

otherwise the shards run concurrently on their owners; with ``s`` the largest share of one
owner::

    cost = t_reduce(s n) + t_bcast(s n) + 2 (partitions - 1) alpha_reduce
"""
from __future__ import annotations

from autosync.plans.base import PARTITIONS, PLACEMENT, PlanDef


class ShardedParameterServer(PlanDef):
    name = "sharded_ps"
    fields = {"partitions": PARTITIONS, "placement": PLACEMENT}
    features = {"frac_plan_sharded_ps": 0.0, "partitions": 0.0}

    def owner_count(self, partitions: int) -> int:
        return partitions

    def fixed_owners(self, partitions: int, world: int) -> tuple[int, ...] | None:
        return tuple(range(world)) if partitions == world else None

    def suggest(self, trial, prefix: str, world: int) -> dict:
        parts = sorted({2, 4, world} - {1})
        return {"partitions": trial.suggest_categorical(f"{prefix}_partitions", parts) if parts else 2}

    def run(self, comm, t, seg, owners) -> None:
        import torch
        import torch.distributed as dist

        from autosync.plans._torch import all_gather, reduce_scatter

        n, parts = t.numel(), len(owners)
        if parts == comm.world and owners == tuple(range(comm.world)):
            size = -(-n // parts)
            padded = torch.zeros(size * parts, dtype=t.dtype, device=t.device)
            padded[:n] = t
            mine = torch.empty(size, dtype=t.dtype, device=t.device)
            reduce_scatter(mine, padded, group=comm.pg)
            all_gather(padded, mine, group=comm.pg)
            t.copy_(padded[:n])
            return
        bounds = [n * i // parts for i in range(parts + 1)]
        shards = [(t[a:b], comm.global_rank(o)) for a, b, o in zip(bounds, bounds[1:], owners) if b > a]
        for work in [dist.reduce(s, dst=o, group=comm.pg, async_op=True) for s, o in shards]:
            work.wait()
        for work in [dist.broadcast(s, src=o, group=comm.pg, async_op=True) for s, o in shards]:
            work.wait()

    def cost(self, sim, nbytes, shapes, touched, owners, elem_size, rows=()) -> float:
        if owners == tuple(range(sim.world)):
            return sim.t("reduce_scatter", nbytes) + sim.t("all_gather", nbytes)
        share = max(owners.count(r) for r in set(owners)) / len(owners)
        extra = (len(owners) - 1) * sim.alpha("reduce")
        return sim.t("reduce", nbytes * share) + sim.t("broadcast", nbytes * share) + 2 * extra

    def group_features(self, partitions: int, share: float) -> dict[str, float]:
        return {"partitions": partitions * share}


PLAN = ShardedParameterServer()
