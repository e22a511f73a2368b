"""`collect`: build the runtime dataset, context by context.

Per (workload, cluster) context: bring the emulated cluster up once, profile once (or
reuse the stored profile), then measure every baseline and ``per_context`` strategies
drawn at random from the full space (or from some sync modes only: a new mode's trials for
an existing dataset), on ranks kept alive across the trials. The random
draws are seeded by the context, so an interrupted campaign, started again, draws the
same strategies and skips those already stored.
"""
from __future__ import annotations

import hashlib
import logging

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from autosync.cluster import Cluster
from autosync.context import Context
from autosync.datasets.store import DatasetStore
from autosync.executor.emulate import open_ranks
from autosync.profiler import Profile
from autosync.profiler.measure import run_profile
from autosync.search.baselines import baselines
from autosync.search.space import random_strategies
from autosync.search.trials import Journal, TrialSettings, run_trials
from autosync.strategy import Strategy

log = logging.getLogger(__name__)


def context_seed(context_id: str, seed: int) -> int:
    return int(hashlib.sha256(f"{context_id}|{seed}".encode()).hexdigest()[:8], 16)


def candidates_for(profile: Profile, per_context: int, seed: int,
                   modes: tuple[str, ...] | None = None) -> list[tuple[str, Strategy]]:
    """Baselines first (the DDP default leads), then the context's random draws.

    ``modes`` (sync mode names) keeps the DDP default, the baselines of these modes and draws of these modes only
    (seeded apart from the full space's draws): new modes' trials for the contexts of an existing dataset."""
    out = [(name, s) for name, s in baselines(profile).items()
           if not modes or name == "ddp_default" or s.sync.mode in modes]
    known = {s.hash for _, s in out}
    context = profile.context_id if not modes else f"{profile.context_id}|{','.join(modes)}"
    for s in random_strategies(profile, per_context + len(out), context_seed(context, seed), modes=modes):
        if s.hash not in known and len(out) < len(known) + per_context:
            out.append(("random", s))
    return out[:len(known) + per_context]


def collect(workloads: list[str], clusters: list[Cluster], store: DatasetStore, per_context: int,
            settings: TrialSettings = TrialSettings(), batch_size: int | None = None, seed: int = 0,
            progress: bool = True, unshaped: bool = False, pool=None,
            modes: tuple[str, ...] | None = None) -> dict[str, int]:
    """Run the campaign; returns counts of trials by status (skipped = already stored).

    ``modes`` restricts the baselines and draws to these sync modes (:func:`candidates_for`).
    ``unshaped`` measures on local loopback instead of the emulated cluster (only when asked:
    without the rights to emulate it refuses); those rows carry an unshaped context id.
    ``pool``, the job's own ranks, replaces the emulated cluster (in-job mode).
    """
    counts = {"ok": 0, "failed": 0, "timeout": 0, "skipped": 0}
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("ETA"), TimeRemainingColumn(), disable=not progress, transient=False)
    with bar:
        guess = per_context + 9  # baselines per context; fewer when one equals another (known after profiling)
        total = bar.add_task("collect", total=len(workloads) * len(clusters) * guess)
        for cluster in clusters:
            with open_ranks(cluster, unshaped, pool) as ranks:
                for workload in workloads:
                    bar.update(total, description=f"{workload} on {cluster}: profiling")
                    profile = context_profile(store, ranks, cluster, workload, batch_size)
                    if getattr(ranks, "in_job", False):   # in a job: a trial the last run died in is stored as failed
                        Journal(store).recover(profile)
                    cands = candidates_for(profile, per_context, seed, modes)
                    bar.update(total, total=bar.tasks[total].total + len(cands) - guess)
                    bar.update(total, description=f"{workload} on {cluster}")

                    def done(source, strategy, result):
                        counts["skipped" if result is None else result.status] += 1
                        bar.advance(total)

                    run_trials(ranks, profile, cands, store, settings, on_done=done)
        bar.update(total, description="collect: done")
    store.compact()
    return counts


def context_profile(store: DatasetStore, pool, cluster: Cluster, workload, batch_size: int | None = None,
                    status=None) -> Profile:
    """The stored profile of the context that ``pool`` measures, or a new one measured on it (and stored)."""
    from autosync import workloads as wl

    batch = batch_size or wl.default_batch_size(workload)
    context = Context.on(pool, workload, batch, cluster)
    stored = store.load_profile_dict(context.id)
    if stored is not None:
        return Profile.from_dict(stored, str(store.profile_path(context.id)))
    if status:
        status(f"profiling {workload} on {context.label}")
    profile = run_profile(pool, cluster, workload, batch)
    store.save_profile(profile.context_id, profile.to_dict())
    return profile
