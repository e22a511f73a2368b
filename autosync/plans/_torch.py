"""Collectives under their current names (torch >= 2.10 renamed the tensor forms); imported lazily."""
from __future__ import annotations

import torch.distributed as dist

reduce_scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
all_gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
