"""The Python face of autosync: ``tune``, ``profile``, ``run``, ``collect``. The CLI is a thin layer over it.

Every function takes keyword arguments, checks what the user handed over (workload,
strategy, output paths) before any long work, and raises :class:`UserError` (one line)
for anything the user can fix.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from autosync import workloads
from autosync.cluster import Cluster, parse_cluster
from autosync.context import Context
from autosync.datasets import SHIPPED_DATA
from autosync.datasets.store import DatasetStore
from autosync.errors import UserError
from autosync.outputs import check_output
from autosync.strategy import Strategy, load_strategy

log = logging.getLogger(__name__)
DEFAULT_STORAGE = "sqlite:///autosync-tune.db"


def resolve_workload(workload_or_model, make_batch: Callable | None = None, batch_size: int | None = None):
    """A workload name, or an nn.Module with its make_batch, checked by one forward call."""
    return checked_workload(workload_or_model, make_batch, batch_size)[0]


def checked_workload(workload_or_model, make_batch: Callable | None = None, batch_size: int | None = None):
    """(workload, its model): the workload resolved and checked by one forward call, the model built once."""
    from torch import nn

    if isinstance(workload_or_model, nn.Module):
        if make_batch is None:
            raise UserError("a model object needs its make_batch(batch_size, generator)")
        import pickle

        try:
            pickle.dumps(make_batch)
        except Exception:  # noqa: BLE001
            raise UserError("make_batch must be picklable (a module-level function) to reach the rank processes") \
                from None
        w = workloads.InMemory(type(workload_or_model).__name__, workload_or_model, make_batch,
                               batch_size or workloads.DEFAULT_BATCH_SIZE)
    else:
        if not isinstance(workload_or_model, str):
            raise UserError(f"expected a workload name or an nn.Module, got {type(workload_or_model).__name__}")
        w = workload_or_model
    model, mb = workloads.build(w)
    workloads.check_batch(str(w), model, mb, batch_size or workloads.default_batch_size(w))
    return w, model


def _cluster(cluster: str | Cluster) -> Cluster:
    return parse_cluster(cluster) if isinstance(cluster, str) else cluster


def emulated(cluster: str | Cluster, unshaped: bool = False):
    """Context manager: the cluster brought up on this machine (``.pool()`` gives its ranks), or, asked
    for, unshaped loopback; emulation errors (no root, no netem for a latency) become one-line user errors."""
    from autosync.executor.emulate import EmulationError, emulate

    cluster = _cluster(cluster)

    class _Guard:
        def __enter__(self):
            try:
                self.inner = emulate(cluster, unshaped=unshaped)
                return self.inner.__enter__()
            except EmulationError as e:
                raise UserError(f"cannot emulate {cluster}: {e}") from None

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

    return _Guard()


def check_faithful(cluster: Cluster, beyond_range: bool, command: str) -> None:
    """UserError when ``command`` would measure ``cluster`` beyond what this machine emulates faithfully."""
    from autosync.executor.emulate import can_emulate
    from autosync.executor.fidelity import beyond

    if beyond_range or not can_emulate()[0]:
        return
    reasons = beyond(cluster)
    if reasons:
        hint = ("predict it instead with --measure 0 (Python: measure=0), or pass --beyond-range"
                if command == "tune" else "pass --beyond-range")
        raise UserError(f"{cluster} is beyond what this machine emulates faithfully ({'; '.join(reasons)}); {hint} "
                        "to measure it anyway (results are labelled emulated-beyond)")


def load_model(path: str | Path | None = None, kind: str = "regressor"):
    from autosync.models.ranker import CostModel
    from autosync.models.train import PRETRAINED

    return CostModel.load(Path(path) if path else PRETRAINED / kind)


def run_tune(workload, cluster: Cluster, measure: int = 8, lossless: bool = False,
             storage: str = DEFAULT_STORAGE, data: str | Path = "autosync-data", batch_size: int | None = None,
             model_path: str | Path | None = None, seed: int = 0, candidates: int = 500,
             settings=None, on_measured=None, status=None, profile_path: str | Path | None = None,
             unshaped: bool = False, objective: str | None = None, confirm_rounds: int = 3, finalists: int = 3,
             pool=None, beyond_range: bool = False, zero_shot: str = "point"):
    """Tune ``workload`` on ``cluster``; ``profile_path`` (from `autosync profile`) replaces profiling.

    ``objective``: ``time-to-loss`` (default; ``lossless`` when ``lossless``), ``throughput`` or ``lossless``
    (see :func:`autosync.search.tuner.tune`). ``pool``: the job's own ranks (:func:`job`, in-job mode; call on
    rank 0): profile, trials and efficiency runs happen there instead of on the emulated ``cluster``, which then
    only names the job's shape and nominal links. Measuring an emulated cluster beyond this machine's faithful
    range (:mod:`autosync.executor.fidelity`) is refused unless ``beyond_range``. With the shipped cost model, its
    calibrated intervals (:mod:`autosync.models.uncertainty`) rank the measured rounds by expected improvement
    and, with ``measure=0``, pick by the ``zero_shot`` rule (``point`` estimate or ``lower`` bound). Returns
    ``(TuneResult, Profile)``.
    """
    from autosync.efficiency.meter import EfficiencyMeter
    from autosync.models.efficiency_model import EfficiencyModel, fit_store
    from autosync.executor.launch import TrialFailure
    from autosync.models import training
    from autosync.profiler.measure import nominal_profile
    from autosync.search.collect import context_profile
    from autosync.search.trials import TrialSettings
    from autosync.search.tuner import check_storage, tune as _tune_loop

    check_storage(storage)
    if measure and pool is None and not unshaped:
        check_faithful(cluster, beyond_range, "tune")
    settings = settings or TrialSettings()
    model = load_model(model_path)
    batch = batch_size or workloads.default_batch_size(workload)
    given = _given_profile(profile_path, Context.of(workload, batch, cluster)) if profile_path else None
    objective = objective or ("lossless" if lossless else "time-to-loss")
    store = DatasetStore(data)
    shipped = DatasetStore(SHIPPED_DATA, create=False) if (SHIPPED_DATA / "profiles").is_dir() else None
    base = training.build(shipped) if shipped else None
    eff_model, meter = None, None
    if objective == "time-to-loss":
        try:
            eff_model = fit_store(shipped) if shipped else EfficiencyModel()
        except ValueError:
            eff_model = EfficiencyModel()
        meter = EfficiencyMeter(store, workload, batch, cluster.world_size, cluster.ranks_per_node,
                                also=[shipped] if shipped else [], progress=status, pool=pool)
    noise = meter.noise_scale() if meter else float("nan")
    from autosync.models import uncertainty

    card = uncertainty.load_card() if model_path is None and base is not None else None
    extra = dict(objective=objective, efficiency_model=eff_model, noise_scale=noise, meter=meter,
                 confirm_rounds=confirm_rounds, finalists=finalists, on_progress=status, intervals_card=card,
                 zero_shot=zero_shot)
    if measure == 0 and pool is None:
        if status and given is None:
            status("profiling the model (nominal network)")
        profile = given or nominal_profile(cluster, workload, batch)
        return _tune_loop(profile, model, 0, store, storage, None, base, lossless, seed, candidates,
                          settings=settings, **extra), profile
    try:
        with _ranks(cluster, unshaped, pool) as ranks:
            profile = given if given is not None else context_profile(store, ranks, cluster, workload, batch, status)
            recovered = _recovered(store, profile, ranks)
            if meter is not None and not unshaped:
                meter.on_cluster(ranks, cluster.spec())     # asp's efficiency depends on the cluster's timing
            if status:
                status(f"tuning: {measure} measured trials")
            result = _tune_loop(profile, model, measure, store, storage, ranks if measure else None, base, lossless,
                                seed, candidates, settings=settings, on_measured=on_measured, workload=workload,
                                recovered=recovered, **extra)
    except TrialFailure as f:
        raise UserError(f"profiling failed ({f.status}): {f.reason}") from None
    finally:
        if meter is not None:
            meter.close()
    return result, profile


def job(timeout: float = 300.0, backend: str | None = None, cluster: str | Cluster | None = None):
    """The ranks of the distributed job this process is part of (in-job mode), as a rank pool.

    Call on every rank of a torchrun (or any env://) job: it joins the job's process group (NCCL on
    GPUs, gloo on CPUs; ``backend`` overrides) with ``timeout`` as its collectives' limit. Rank 0 passes
    the pool to :func:`run_tune`, :func:`profile` or :func:`collect`; every other rank calls
    ``pool.serve()`` and exits with what it returns. Every rank calls ``pool.close()`` when done (or
    uses the pool as a context manager): it takes the job's process groups down. ``cluster``, when
    given, must have the job's shape (hosts x ranks per host). See :mod:`autosync.executor.job`.
    """
    from autosync.executor.job import JobPool

    pool = JobPool(timeout_s=timeout, backend=backend)
    if cluster is not None:
        check_job_cluster(_cluster(cluster), pool)
    return pool


def check_job_cluster(cluster: Cluster, pool) -> None:
    """UserError unless ``cluster`` has the job's shape."""
    if (cluster.nodes, cluster.ranks_per_node) != (pool.hosts, pool.ranks_per_host):
        raise UserError(f"--cluster {cluster} says {cluster.nodes} host(s) x {cluster.ranks_per_node} rank(s), but "
                        f"this job has {pool.hosts} host(s) x {pool.ranks_per_host} rank(s); give the job's shape "
                        f"(its links' speed is nominal: the network is measured in the job)")


def _ranks(cluster: Cluster, unshaped: bool, pool=None):
    """Context manager: the job's ranks when given (in-job), else the emulated cluster's (or loopback's)."""
    from contextlib import contextmanager, nullcontext

    if pool is not None:
        check_job_cluster(cluster, pool)
        return nullcontext(pool)

    @contextmanager
    def emulated_pool():
        with emulated(cluster, unshaped) as emu, emu.pool() as ranks:
            yield ranks
    return emulated_pool()


def _recovered(store: DatasetStore, profile, ranks) -> list:
    """In a job: the trial a previous run of the job died in, now stored as failed ([(source, strategy)])."""
    from autosync.search.trials import Journal

    if not getattr(ranks, "in_job", False):
        return []
    found = Journal(store).recover(profile)
    return [found] if found else []


def _given_profile(path: str | Path, want: Context):
    """A profile file the user gave: readable, of this version, and of this (workload, batch, cluster)."""
    from autosync.profiler.profile import ProfileError, load_profile

    profile = load_profile(path)
    have = profile.context
    if (have.workload, have.batch_size, have.cluster) != (want.workload, want.batch_size, want.cluster):
        raise ProfileError(f"{path}: profile is of {have.id!r}, not of {want.id!r}; "
                           f"profile this workload and cluster again")
    return profile


def profile(workload_or_model, cluster: str | Cluster = "2x1@1gbit", make_batch: Callable | None = None,
            batch_size: int | None = None, nominal: bool = False, unshaped: bool = False,
            out: str | Path | None = None, timeout: float = 900.0, pool=None):
    """Profile a workload and a cluster: measured on the emulated cluster (or, asked for, unshaped
    loopback, or in the job's own ranks with ``pool`` from :func:`job`), or ``nominal`` from the spec;
    ``out`` also saves it as JSON (checked first)."""
    from autosync.executor.launch import TrialFailure
    from autosync.profiler.measure import nominal_profile, run_profile

    cluster = _cluster(cluster)
    if out is not None:
        check_output(out, "profile")
    w = resolve_workload(workload_or_model, make_batch, batch_size)
    batch = batch_size or workloads.default_batch_size(w)
    try:
        if nominal:
            result = nominal_profile(cluster, w, batch)
        else:
            with _ranks(cluster, unshaped, pool) as ranks:
                result = run_profile(ranks, cluster, w, batch, timeout=timeout)
    except TrialFailure as f:
        raise UserError(f"profiling failed ({f.status}): {f.reason}") from None
    if out is not None:
        _write(out, lambda p: result.save(p))
    return result


def _write(path, write) -> None:
    try:
        write(path)
    except OSError as e:
        raise UserError(f"{path}: cannot write ({e.strerror})") from None


def check_strategy(strategy: Strategy, model, world: int, source: str = "strategy") -> None:
    """Raise UserError unless ``strategy`` fits ``model``'s parameters and a world of ``world`` ranks."""
    strategy.check_world(world)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    try:
        strategy.resolve(named, workloads.embedding_parameter_names(model))
    except UserError as e:
        raise UserError(f"{source}: {e}") from None


def run(workload, strategy: Strategy | str | Path | None = None, cluster: str | Cluster | None = None,
        nproc: int | None = None, ranks_per_host: int | None = None, batch_size: int | None = None,
        steps: int = 10, warmup: int = 3, seed: int = 0, timeout: float = 300.0, unshaped: bool = False):
    """Measure one strategy (default: the DDP default) for ``steps`` timed steps.

    On an emulated ``cluster`` (world size from its spec), or on ``nproc`` local ranks
    (default 2, unshaped loopback). Returns ``(TrialResult, where)``; ``where`` names the
    context of the measurement for tables.
    """
    from autosync.executor.launch import START_TIMEOUT_S, RankPool
    from autosync.executor.measure import TrialSpec, measure

    if strategy is None:
        strategy, source = Strategy.default(), "default strategy"
    elif isinstance(strategy, Strategy):
        source = "strategy"
    else:
        strategy, source = load_strategy(strategy), str(strategy)
    w, model = checked_workload(workload, batch_size=batch_size)
    batch = batch_size or workloads.default_batch_size(w)
    cluster = _cluster(cluster) if cluster is not None else None
    if cluster is not None and nproc is not None and nproc != cluster.world_size:
        raise UserError(f"--nproc {nproc} disagrees with --cluster {cluster} ({cluster.world_size} ranks); "
                        f"give one of them")
    if cluster is not None and ranks_per_host is not None:
        raise UserError("--ranks-per-host comes from --cluster; give one of them")
    world = cluster.world_size if cluster is not None else (nproc or 2)
    if ranks_per_host and world % ranks_per_host:
        raise UserError(f"--ranks-per-host {ranks_per_host} does not divide --nproc {world}")
    check_strategy(strategy, model, world, source)
    del model
    spec = TrialSpec(w, strategy.canonical(), batch, warmup, steps, seed)
    start = min(timeout, START_TIMEOUT_S)   # the ranks' start is bounded by the trial's limit too
    if cluster is not None:
        with emulated(cluster, unshaped) as emu, emu.pool(start_timeout=start) as pool:
            result, _ = measure(pool, spec, timeout=timeout)
        where = Context.on(pool, w, batch, cluster).label
    else:
        with RankPool(world, ranks_per_host=ranks_per_host, start_timeout=start) as pool:
            result, _ = measure(pool, spec, timeout=timeout)
        where = f"{world} local ranks (unshaped loopback)"
    return result, where


def collect(workload_names: list[str], clusters: list[str | Cluster], data: str | Path = "autosync-data",
            per_context: int = 20, timeout: float = 90.0, budget: float = 4.0, batch_size: int | None = None,
            seed: int = 0, unshaped: bool = False, progress: bool = True, pool=None,
            beyond_range: bool = False) -> dict[str, int]:
    """Measure every baseline and ``per_context`` random strategies per (workload, cluster) into ``data``.

    With ``pool`` (the job's ranks, from :func:`job`), measured in the job: one cluster, of the job's shape."""
    from autosync.search.collect import collect as _collect
    from autosync.search.trials import TrialSettings

    for name in workload_names:
        resolve_workload(name, batch_size=batch_size)
    clusters = [_cluster(c) for c in clusters]
    if pool is None and not unshaped:
        for c in clusters:
            check_faithful(c, beyond_range, "collect")
    check_output(data, "dataset", directory=True)
    store = DatasetStore(data)
    store.read()  # a damaged dataset is reported before anything is measured
    settings = TrialSettings(timeout_s=timeout, time_budget_s=budget, seed=seed)
    if pool is not None:
        if len(clusters) != 1:
            raise UserError("in a job, collect measures the job's own cluster: give one --clusters spec, its shape")
        check_job_cluster(clusters[0], pool)
    return _collect(workload_names, clusters, store, per_context, settings, batch_size, seed,
                    progress, unshaped=unshaped, ranks=(lambda c: _ranks(c, unshaped, pool)) if pool is not None else None)


def tune(workload_or_model, make_batch: Callable | None = None, cluster: str | Cluster = "2x1@1gbit",
         measure: int = 8, lossless: bool = False, storage: str = DEFAULT_STORAGE, batch_size: int | None = None,
         data: str | Path = "autosync-data", seed: int = 0, out: str | Path | None = None,
         unshaped: bool = False, objective: str | None = None, confirm_rounds: int = 3,
         beyond_range: bool = False) -> Strategy:
    """Find a synchronization strategy for a workload (a name) or a model (with make_batch) on a cluster.

    Measures ``measure`` strategies for real on the emulated ``cluster`` (0 = predict only)
    and returns the recommendation, by ``objective``: ``time-to-loss`` (the default: samples/s x
    statistical efficiency, measured for lossy finalists), ``throughput`` or ``lossless``; ``out`` also writes it as a strategy file (its folder is
    checked first). Without the rights to emulate it refuses, unless ``unshaped=True``.

    Call it under ``if __name__ == "__main__":`` in a script: its rank processes re-import the main
    module (as with torch's ``mp.spawn``); a call at import time makes every rank
    try to start ranks of its own, and the failure says so.
    """
    from autosync.search.tuner import strategy_file_text

    cluster = _cluster(cluster)
    if out:
        check_output(out, "strategy file")
    w = resolve_workload(workload_or_model, make_batch, batch_size)
    result, prof = run_tune(w, cluster, measure, lossless, storage, data, batch_size, seed=seed, unshaped=unshaped,
                            objective=objective, confirm_rounds=confirm_rounds, beyond_range=beyond_range)
    if out:
        _write(out, lambda p: Path(p).write_text(strategy_file_text(result, prof)))
    return result.strategy
