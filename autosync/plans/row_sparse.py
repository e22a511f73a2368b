"""``row_sparse``: for embedding tables, exchange only the rows the batch touched, then scatter-add.

Per 2-D table with ``k`` touched rows per rank (1-D tensors are all-reduced)::

    cost = t_ag(8 W) + t_ag(8 W k) + t_ag(W k row_bytes)       (counts, indices, values)
"""
from __future__ import annotations

import math

from autosync.plans.base import PlanDef


class RowSparse(PlanDef):
    name = "row_sparse"
    embeddings_only = True
    features = {"frac_plan_row_sparse": 0.0}

    def run(self, comm, t, seg, owners) -> None:
        import torch
        import torch.distributed as dist

        from autosync.plans._torch import all_gather

        for off, numel, shape in seg.shapes:
            grad = t[off:off + numel]
            if len(shape) != 2:
                dist.all_reduce(grad, group=comm.pg)
                continue
            rows = grad.view(shape)
            idx = rows.abs().sum(1).nonzero().squeeze(1)
            counts = [torch.zeros(1, dtype=torch.long, device=t.device) for _ in range(comm.world)]
            dist.all_gather(counts, torch.tensor([idx.numel()], device=t.device), group=comm.pg)
            width = int(max(c.item() for c in counts))
            send_idx = torch.zeros(width, dtype=torch.long, device=t.device)
            send_idx[:idx.numel()] = idx
            send_val = torch.zeros(width, shape[1], dtype=t.dtype, device=t.device)
            send_val[:idx.numel()] = rows[idx]           # padding rows add zeros to row 0
            all_idx = torch.empty(width * comm.world, dtype=torch.long, device=t.device)
            all_val = torch.empty(width * comm.world, shape[1], dtype=t.dtype, device=t.device)
            all_gather(all_idx, send_idx, group=comm.pg)
            all_gather(all_val, send_val, group=comm.pg)
            rows.zero_().index_add_(0, all_idx, all_val)

    def cost(self, sim, nbytes, shapes, touched, owners, elem_size, rows=()) -> float:
        total = 0.0
        for shape, frac in zip(shapes, touched):
            if len(shape) != 2:
                total += sim.t("all_reduce", math.prod(shape) * elem_size)
                continue
            rows = frac * shape[0]
            total += sim.t("all_gather", 8 * sim.world) + sim.t("all_gather", sim.world * rows * 8) \
                + sim.t("all_gather", sim.world * rows * shape[1] * elem_size)
        return total


PLAN = RowSparse()
