"""``topk {ratio}``: the largest ``ratio`` of the elements (with error feedback), all-gathered as index/value pairs.

    k = ratio * n / 4;  cost = t_ag(W * 12 k) + select(n)          lossy

It works with plan allreduce only. The residual of what was not sent is added back the
next step (error feedback), kept per parameter (DDP reorders its buckets after the first step).
"""
from __future__ import annotations

from autosync.plans.base import CompressorDef, Field

RATIOS = (0.001, 0.01, 0.05)
SELECT_S_PER_ELEMENT = 4e-9      # torch.topk + bookkeeping on one core, measured order of magnitude


class TopK(CompressorDef):
    name = "topk"
    lossy = True
    plans = ("allreduce",)
    fields = {"ratio": Field(0.01, 0.0, 1.0)}
    bucket_dependent = True      # the top k are chosen per segment of a bucket
    features = {"frac_comp_topk": 0.0, "topk_ratio": 0.0}

    def suggest(self, trial, prefix: str) -> dict:
        return {"ratio": trial.suggest_categorical(f"{prefix}_topk_ratio", RATIOS)}

    def make_state(self, comm, group):
        return {"ratio": group.compressor.ratio, "error": {}}

    def run(self, comm, flat, seg, state, reduce) -> None:
        import torch

        from autosync.plans._torch import all_gather

        # the residual is kept per parameter: DDP rebuilds its buckets after the first step, in another order
        corrected = flat.clone()
        for (offset, numel, _), pid in zip(seg.shapes, seg.key):
            if pid in state["error"]:
                corrected[offset:offset + numel] += state["error"][pid]
        k = max(1, int(state["ratio"] * flat.numel()))
        idx = corrected.abs().topk(k, sorted=False).indices
        values = corrected[idx]
        error = corrected
        error[idx] = 0
        for (offset, numel, _), pid in zip(seg.shapes, seg.key):
            state["error"][pid] = error[offset:offset + numel]
        all_idx = torch.empty(k * comm.world, dtype=torch.long, device=flat.device)
        all_val = torch.empty(k * comm.world, dtype=flat.dtype, device=flat.device)
        all_gather(all_idx, idx, group=comm.pg)
        all_gather(all_val, values, group=comm.pg)
        flat.zero_().index_add_(0, all_idx, all_val).div_(comm.world)

    def cost(self, sim, compressor, nbytes, shapes, plan_cost):
        k = max(1, int(compressor.ratio * nbytes / 4))
        sent = 12 * k
        return sim.t("all_gather", sim.world * sent) + nbytes / 4 * SELECT_S_PER_ELEMENT, sent

    def group_features(self, compressor, share: float) -> dict[str, float]:
        return {"topk_ratio": compressor.ratio * share}

    def error_norm(self, state) -> float | None:
        return sum(float(e.float().norm()) ** 2 for e in state["error"].values()) ** 0.5


COMPRESSOR = TopK()
