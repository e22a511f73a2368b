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
from pathlib import Path

from autosync.datasets.store import DatasetStore
from autosync.executor.launch import RankPool
from autosync.executor.measure import TrialResult, TrialSpec, measure
from autosync.models.simulator import simulate
from autosync.profiler import Profile
from autosync.strategy import Strategy, loads_strategy

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
        "bandwidth_bps": c.slowest_rate_bps,
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
            "steps": len(result.step_times), "peak_mem_mb": result.peak_mem_mb,
            "sent_bytes_per_step": result.sent_bytes_per_step, "timestamp": time.time()}


class Journal:
    """The trial an in-job run is measuring, kept on disk so that a job that dies inside it stores it as failed.

    In a job (:class:`autosync.executor.job.JobPool`) a rank killed mid-trial takes every rank down
    with it, rank 0 included, before anything is recorded. So rank 0 writes the trial here *before*
    running it (one JSON file in the dataset folder, replaced atomically) and removes it once the
    outcome is stored. When the job starts again, :meth:`recover` stores a leftover trial of the
    context as failed (or timed out, when a watchdog wrote that reason), and the search goes on.
    """

    DEFAULT_REASON = ("the job ended while this trial ran (a rank was killed or crashed, or the job was stopped); "
                      "stored as failed when the job started again")

    def __init__(self, store: DatasetStore):
        self.store = store
        self.path = Path(store.root) / "in-job-started.json"

    def _write(self, entry: dict) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(entry))
        os.replace(tmp, self.path)

    def begin(self, profile: Profile, strategy: Strategy, source: str) -> None:
        self._write({"context_id": profile.context_id, "strategy": strategy.to_json(), "source": source,
                     "status": "failed", "reason": self.DEFAULT_REASON, "started": time.time()})

    def abort(self, status: str, reason: str) -> None:
        """Say why the job is ending inside the trial (a watchdog's timeout)."""
        try:
            entry = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        self._write({**entry, "status": status, "reason": f"{reason}; stored when the job started again"})

    def end(self) -> None:
        self.path.unlink(missing_ok=True)

    def recover(self, profile: Profile) -> tuple[str, Strategy] | None:
        """Store a trial of this context that a previous run of the job started and never finished (as failed,
        unless its outcome was stored after all); its (source, strategy), or None when there is none."""
        try:
            entry = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            log.warning("%s: unreadable, removed", self.path)
            self.end()
            return None
        if entry.get("context_id") != profile.context_id:
            return None
        strategy = loads_strategy(entry["strategy"])
        if strategy.hash not in {h for ctx, h in self.store.keys() if ctx == profile.context_id}:
            result = TrialResult(profile.model.workload, strategy.hash, profile.cluster.world_size,
                                 profile.model.batch_size, entry["status"], entry["reason"][:500])
            self.store.append([trial_row(profile, strategy, entry["source"], result)])
            log.warning("%s %s: %s", profile.context_id, strategy.hash, entry["reason"])
        self.end()
        return entry["source"], strategy


def measure_strategy(pool: RankPool, profile: Profile, strategy: Strategy, settings: TrialSettings,
                     workload=None, store: DatasetStore | None = None, source: str = "") -> TrialResult:
    """One trial; ``workload`` (default: the profile's workload name) may be a workloads.InMemory.

    Inside a job (a pool with ``on_abort``) and given the ``store`` its outcome goes to, the trial is
    written to the :class:`Journal` first; the caller ends it once the outcome is stored.
    """
    spec = TrialSpec(workload or profile.model.workload, strategy.canonical(), profile.model.batch_size,
                     warmup_steps=settings.warmup_steps, steps=settings.max_steps, seed=settings.seed,
                     time_budget_s=settings.time_budget_s, min_steps=settings.min_steps)
    if store is not None and getattr(pool, "in_job", False):
        if not pool.alive:
            pool.start()    # a job whose last trial failed ends here, before this trial is journaled
        journal = Journal(store)
        journal.begin(profile, strategy, source)
        pool.on_abort = journal.abort
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
        result = measure_strategy(pool, profile, strategy, settings, store=store, source=source)
        store.append([trial_row(profile, strategy, source, result)])
        Journal(store).end()
        stored.add(strategy.hash)
        log.info("%s %s %s: %s %.1f samples/s %s", profile.context_id, source, strategy.hash, result.status,
                 result.samples_per_s, result.reason)
        out.append((source, strategy, result))
        if on_done:
            on_done(source, strategy, result)
    return out
