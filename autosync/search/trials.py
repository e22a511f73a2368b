"""Measure strategies on kept-alive ranks and record every outcome in the dataset.

Shared by ``collect`` (random + baselines) and ``tune`` (cost-model proposals): the
executor knows nothing of search, the store nothing of processes; this module joins them.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass

from autosync.datasets.store import DatasetStore
from autosync.executor.launch import RankPool
from autosync.executor.measure import TrialResult, TrialSpec, measure
from autosync.models.simulator import simulate
from autosync.profiler import Profile
from autosync.strategy import Strategy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrialSettings:
    """How every trial of a campaign is run."""

    warmup_steps: int = 2
    max_steps: int = 8
    min_steps: int = 3
    time_budget_s: float = 4.0       # timed steps are cut to fit about this long
    timeout_s: float = 90.0          # the trial's time limit: all ranks are killed past it
    seed: int = 0


def context_row(profile: Profile) -> dict:
    """The columns every row of one (workload, cluster) context shares."""
    m, c = profile.model, profile.cluster
    emb = sum(p.nbytes for p in m.params if p.is_embedding)
    ar = profile.network.fits["world"]["all_reduce"]
    return {
        "context_id": profile.context_id, "workload": m.workload, "cluster": c.spec(), "world_size": c.world_size,
        "nodes": c.nodes, "ranks_per_node": c.ranks_per_node,
        "bandwidth_bps": min(c.link_of(k).rate_bps for k in range(c.nodes)),
        "latency_s": max(c.link_of(k).latency_s for k in range(c.nodes)), "heterogeneous": c.heterogeneous,
        "batch_size": m.batch_size, "n_params": sum(p.numel for p in m.params), "n_tensors": len(m.params),
        "model_bytes": m.total_bytes, "embedding_bytes_frac": emb / max(m.total_bytes, 1),
        "forward_s": m.forward_s, "backward_s": m.backward_s, "optimizer_s": m.optimizer_s,
        "flops_per_step": m.flops_per_step, "allreduce_alpha_s": ar.alpha_s,
        "allreduce_beta_s_per_byte": ar.beta_s_per_byte,
        "torch_version": profile.env.get("torch", ""), "cores": profile.env.get("cores") or os.cpu_count(),
    }


def sim_columns(profile: Profile, strategy: Strategy) -> dict:
    sim = simulate(profile, strategy)
    return {"sim_step_s": sim.step_s, "sim_compute_s": sim.compute_s, "sim_exposed_comm_s": sim.exposed_comm_s,
            "sim_comm_s": sim.comm_s, "sim_bytes": json.dumps(sim.bytes_per_plan, sort_keys=True)}


def trial_row(profile: Profile, strategy: Strategy, source: str, result: TrialResult) -> dict:
    return {**context_row(profile), **sim_columns(profile, strategy),
            "strategy": strategy.to_json(), "strategy_hash": strategy.hash, "source": source,
            "lossless": strategy.is_lossless, "status": result.status, "reason": result.reason,
            "samples_per_s": result.samples_per_s, "median_step_s": result.step_s, "cv": result.cv,
            "steps": len(result.step_times), "peak_mem_mb": result.peak_mem_mb, "timestamp": time.time()}


def measure_strategy(pool: RankPool, profile: Profile, strategy: Strategy, settings: TrialSettings,
                     workload=None) -> TrialResult:
    """One trial; ``workload`` (default: the profile's workload name) may be a workloads.InMemory."""
    spec = TrialSpec(workload or profile.model.workload, strategy.canonical(), profile.model.batch_size,
                     warmup_steps=settings.warmup_steps, steps=settings.max_steps, seed=settings.seed,
                     time_budget_s=settings.time_budget_s, min_steps=settings.min_steps)
    result, _ = measure(pool, spec, timeout=settings.timeout_s)
    return result


def run_trials(pool: RankPool, profile: Profile, candidates: list[tuple[str, Strategy]], store: DatasetStore,
               settings: TrialSettings, on_done=None) -> list[tuple[str, Strategy, TrialResult]]:
    """Measure each (source, strategy) not yet stored for this context; append each result at once."""
    stored = {h for ctx, h in store.keys() if ctx == profile.context_id}
    out = []
    for source, strategy in candidates:
        if strategy.hash in stored:
            if on_done:
                on_done(source, strategy, None)
            continue
        result = measure_strategy(pool, profile, strategy, settings)
        store.append([trial_row(profile, strategy, source, result)])
        stored.add(strategy.hash)
        log.info("%s %s %s: %s %.1f samples/s %s", profile.context_id, source, strategy.hash, result.status,
                 result.samples_per_s, result.reason)
        out.append((source, strategy, result))
        if on_done:
            on_done(source, strategy, result)
    return out
