"""The registry: every plan, compressor and sync mode autosync knows, one module each.

Adding a plan is one module (a :class:`~autosync.plans.base.PlanDef` with its validation
fields, search choices, hook body, simulator cost and features) and one line below. The
order of each table is the order of the search space's choices and of the feature
columns; append, never insert, or seeded random draws of ``collect`` change.

    >>> from autosync import plans
    >>> list(plans.PLANS)
    ['allreduce', 'ps', 'sharded_ps', 'hierarchical_allreduce', 'row_sparse', 'sfb']
    >>> plans.compressor("powersgd").lossy
    True
"""
from __future__ import annotations

from autosync.plans import (adaptive, allreduce, asp, bsp, diloco, hierarchical_allreduce, local_sgd, lowp, none,
                            powersgd, ps, row_sparse, selective, sfb, sharded_ps, ssp, topk)
from autosync.plans.base import CompressorDef, PlanDef, SyncModeDef

PLANS: dict[str, PlanDef] = {p.name: p for p in (
    allreduce.PLAN,
    ps.PLAN,
    sharded_ps.PLAN,
    hierarchical_allreduce.PLAN,
    row_sparse.PLAN,
    sfb.PLAN,
)}
COMPRESSORS: dict[str, CompressorDef] = {c.name: c for c in (
    none.COMPRESSOR,
    lowp.FP16,
    lowp.BF16,
    powersgd.COMPRESSOR,
    topk.COMPRESSOR,
)}
SYNC_MODES: dict[str, SyncModeDef] = {m.name: m for m in (
    bsp.MODE,
    local_sgd.MODE,
    ssp.MODE,
    adaptive.MODE,
    asp.MODE,
    selective.MODE,
    diloco.MODE,
)}


def plan(name: str) -> PlanDef:
    return PLANS[name]


def compressor(name: str) -> CompressorDef:
    return COMPRESSORS[name]


def sync_mode(name: str) -> SyncModeDef:
    return SYNC_MODES[name]


def feature_defaults() -> dict[str, float]:
    """Every registry feature with its value when nothing uses it, in registry order."""
    out: dict[str, float] = {}
    for entry in (*PLANS.values(), *COMPRESSORS.values(), *SYNC_MODES.values()):
        out.update(entry.features)
    return out


__all__ = ["COMPRESSORS", "PLANS", "SYNC_MODES", "CompressorDef", "PlanDef", "SyncModeDef", "compressor",
           "feature_defaults", "plan", "sync_mode"]
