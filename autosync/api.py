"""The Python face of autosync: ``tune``, ``profile``, ``run``, ``collect``. The CLI is a thin layer over it.

Every function takes keyword arguments, checks what the user handed over (workload,
strategy, output paths) before any long work, and raises :class:`UserError` (one line)
for anything the user can fix.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from autosync import workloads
from autosync.cluster import Cluster, parse_cluster
from autosync.context import Context
from autosync.datasets import SHIPPED_DATA
from autosync.datasets.store import DatasetStore
from autosync.errors import UserError
from autosync.outputs import check_output
from autosync.search.config import TuneConfig
from autosync.strategy import Strategy, load_strategy

log = logging.getLogger(__name__)


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


def run_tune(workload, cluster: Cluster | None, config: TuneConfig, on_measured=None, status=None, pool=None):
    """Tune ``workload`` on ``cluster`` by ``config`` (:class:`~autosync.search.config.TuneConfig`); returns
    ``(TuneResult, Profile)``.

    ``pool``: the job's own ranks (:func:`job`, in-job mode; call on rank 0): profile, trials and efficiency runs
    happen there instead of on the emulated ``cluster``, which then only names the job's shape and nominal links;
    without ``cluster`` the job's own shape and its measured links name it (:func:`job_cluster`).
    Measuring an emulated cluster beyond this machine's faithful range (:mod:`autosync.executor.fidelity`) is
    refused unless ``config.beyond_range``. ``status(text)`` hears what is going on; ``on_measured(m)`` each
    measured strategy.
    """
    from autosync.executor.emulate import open_ranks
    from autosync.executor.launch import TrialFailure
    from autosync.search.study import check_storage
    from autosync.search.tuner import tune

    check_storage(config.storage)
    if cluster is None:
        if pool is None:
            raise UserError("tune needs --cluster (or --in-job, which takes the job's own)")
        if status:
            status("measuring the job's links")
        batch = config.batch_size or workloads.default_batch_size(workload)
        store = DatasetStore(config.data)
        cluster = _restarted_job_cluster(store, pool, workload, batch) or \
            job_cluster(pool, _known_job_clusters(store, pool, workload, batch))
        if status:
            status(f"the job's cluster: {cluster}")
    if config.measure and pool is None and not config.unshaped:
        check_faithful(cluster, config.beyond_range, "tune")
    batch = config.batch_size or workloads.default_batch_size(workload)
    given = _given_profile(config.profile, Context.of(workload, batch, cluster)) if config.profile else None
    store = DatasetStore(config.data)
    inputs = _tune_inputs(config, store, workload, batch, cluster, status, pool)
    meter = inputs["meter"]
    if config.measure == 0 and pool is None:
        if status and given is None:
            status("profiling the model (nominal network)")
        from autosync.profiler.measure import nominal_profile

        profile = given or nominal_profile(cluster, workload, batch)
        return tune(profile, inputs.pop("model"), config, store, **inputs), profile
    from autosync.search.collect import context_profile
    try:
        with open_ranks(cluster, config.unshaped, pool) as ranks:
            profile = given if given is not None else context_profile(store, ranks, cluster, workload, batch, status)
            if meter is not None and not config.unshaped:
                meter.on_cluster(ranks, cluster.spec())     # asp's efficiency depends on the cluster's timing
            if status:
                status(f"tuning: {config.measure} measured trials")
            result = tune(profile, inputs.pop("model"), config, store, ranks if config.measure else None,
                          workload=workload, recovered=_recovered(store, profile, ranks), on_measured=on_measured,
                          **inputs)
    except TrialFailure as f:
        raise UserError(f"profiling failed ({f.status}): {f.reason}") from None
    finally:
        if meter is not None:
            meter.close()
    return result, profile


def _tune_inputs(config: TuneConfig, store: DatasetStore, workload, batch: int, cluster: Cluster, status, pool) -> dict:
    """What the tune pipeline starts from: the cost model, the shipped training set and interval card, the
    efficiency model and (time-to-loss) the efficiency meter."""
    from autosync.efficiency.meter import EfficiencyMeter
    from autosync.models import training, uncertainty
    from autosync.models.efficiency_model import EfficiencyModel, fit_store

    model = load_model(config.cost_model)
    shipped = DatasetStore(SHIPPED_DATA, create=False) if (SHIPPED_DATA / "profiles").is_dir() else None
    base = training.build(shipped) if shipped else None
    eff_model, meter = None, None
    if config.objective == "time-to-loss":
        try:
            eff_model = fit_store(shipped) if shipped else EfficiencyModel()
        except ValueError:
            eff_model = EfficiencyModel()
        meter = EfficiencyMeter(store, workload, batch, cluster.world_size, cluster.ranks_per_node,
                                also=[shipped] if shipped else [], progress=status, pool=pool)
    card = uncertainty.load_card() if config.cost_model is None and base is not None else None
    return dict(model=model, base=base, efficiency_model=eff_model, meter=meter, intervals_card=card,
                noise_scale=meter.noise_scale() if meter else float("nan"), on_progress=status)


def job(timeout: float = 300.0, backend: str | None = None, cluster: str | Cluster | None = None):
    """The ranks of the distributed job this process is part of (in-job mode), as a rank pool.

    Call on every rank of a torchrun (or any env://) job: it joins the job's process group (NCCL on
    GPUs, gloo on CPUs; ``backend`` overrides) with ``timeout`` as its collectives' limit. Rank 0 passes
    the pool to :func:`run_tune`, :func:`profile`, :func:`run` or :func:`collect`; every other rank calls
    ``pool.serve()`` and exits with what it returns. Every rank calls ``pool.close()`` when done (or
    uses the pool as a context manager): it takes the job's process groups down. ``cluster``, when
    given, must have the job's shape (hosts x ranks per host). See :mod:`autosync.executor.job`.
    """
    from autosync.executor.job import JobPool, check_shape

    pool = JobPool(timeout_s=timeout, backend=backend)
    if cluster is not None:
        check_shape(_cluster(cluster), pool)
    return pool


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
            from autosync.executor.emulate import open_ranks

            with open_ranks(cluster, unshaped, pool) as ranks:
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
        steps: int = 10, warmup: int = 3, seed: int = 0, timeout: float = 300.0, unshaped: bool = False, pool=None):
    """Measure one strategy (default: the DDP default) for ``steps`` timed steps.

    On an emulated ``cluster`` (world size from its spec), on ``nproc`` local ranks (default 2, unshaped
    loopback), or on the job's own ranks (``pool`` from :func:`job`; call on rank 0). Returns
    ``(TrialResult, where)``; ``where`` names the context of the measurement for tables.
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
    world = _run_world(cluster, nproc, ranks_per_host, pool)
    check_strategy(strategy, model, world, source)
    del model
    spec = TrialSpec(w, strategy.canonical(), batch, warmup, steps, seed)
    start = min(timeout, START_TIMEOUT_S)   # the ranks' start is bounded by the trial's limit too
    if pool is not None:
        result, _ = measure(pool, spec, timeout=timeout)
        where = f"{world} ranks of this job ({pool.backend}/{pool.device})"
    elif cluster is not None:
        from autosync.executor.emulate import open_ranks

        with open_ranks(cluster, unshaped, start_timeout=start) as ranks:
            result, _ = measure(ranks, spec, timeout=timeout)
        where = Context.on(ranks, w, batch, cluster).label
    else:
        with RankPool(world, ranks_per_host=ranks_per_host, start_timeout=start) as ranks:
            result, _ = measure(ranks, spec, timeout=timeout)
        where = f"{world} local ranks (unshaped loopback)"
    return result, where


def _auto_task(ctx, workload, batch: int, steps: int, seed: int, spec: str | None, network: str,
               options: dict) -> dict:
    """Rank side of :func:`run_auto`: the workload's training loop, with ``strategy="auto"`` and ``options``
    (:class:`AutoOptions`' fields; ``out`` and ``data`` are rank 0's)."""
    import time

    from autosync.executor import device as dev
    from autosync.executor.recipe import data_generator, make_optimizer

    model, make_batch = workloads.build(workload, seed=seed)
    model.to(ctx.device)
    optimizer = make_optimizer("adam", workloads.lr_of(workload), model.parameters())
    mine = {**options, "out": options["out"] if ctx.rank == 0 else None,
            "data": options["data"] if ctx.rank == 0 else None}
    m, o = auto(model, optimizer, cluster=spec, network=network, ranks_per_host=ctx.ranks_per_host, report=None,
                **mine)
    gen = data_generator(seed, ctx.rank)
    t0 = time.perf_counter()
    try:
        for _ in range(steps):
            workloads.loss_of(m(**dev.to_device(make_batch(batch, gen), ctx.device))).backward()
            o.step()
            o.zero_grad()
        dev.synchronize(ctx.device)
    finally:
        m.release()
    tuner = m.autosync_tuner
    return {"wall_s": time.perf_counter() - t0, "steps": steps, "windows": [w.as_dict() for w in tuner.windows],
            "committed": tuner.committed.summary() if tuner.committed else None,
            "committed_hash": tuner.committed.hash if tuner.committed else None,
            "committed_at": tuner.committed_at if tuner.committed else None,
            "default_step_s": tuner.default_step_s(),
            "exploration_steps": tuner.exploration_steps() if tuner.committed else None,
            "lost_s": tuner.lost_s(), "overhead_s": tuner.overhead_s, "guard": tuner.guard_words(),
            "reverted": tuner.reverted}


def run_auto(workload, cluster: str | Cluster | None = None, nproc: int | None = None,
             ranks_per_host: int | None = None, batch_size: int | None = None, steps: int = 200, seed: int = 0,
             timeout: float = 900.0, unshaped: bool = False, pool=None, out: str | Path | None = None,
             data: str | Path | None = None, window: int = 8, settle: int = 3, candidates: int = 4,
             budget: float = 0.05, objective: str = "time-to-loss", lossy_after: int = 0, guard: bool = True):
    """Train ``workload`` ``steps`` steps with ``strategy="auto"`` (:func:`auto`; ``out`` ... ``guard`` as
    :class:`AutoOptions`') on the ranks :func:`run` would use; returns (rank 0's summary: windows, commit, wall
    time, exploration, the loss guard's state; where)."""
    from autosync.executor.launch import START_TIMEOUT_S, RankPool

    w, model = checked_workload(workload, batch_size=batch_size)
    del model
    if not isinstance(w, str):
        raise UserError("--strategy auto trains a built-in workload or one given as 'module:function'")
    batch = batch_size or workloads.default_batch_size(w)
    cluster = _cluster(cluster) if cluster is not None else None
    world = _run_world(cluster, nproc, ranks_per_host, pool)
    if out is not None:
        check_output(out, "strategy file")
    start = min(timeout, START_TIMEOUT_S)
    args = (w, batch, steps, seed)
    if not 0 < budget <= 1:
        raise UserError(f"the exploration budget is a share of the training time in (0, 1], not {budget:g}")
    options = dict(out=str(out) if out else None, data=str(data) if data else None, window=window, settle=settle,
                   candidates=candidates, budget=budget, objective=objective, lossy_after=lossy_after, guard=guard)
    AutoOptions.build(**options)         # checked here, before any rank starts
    if pool is not None:
        return pool.run(_auto_task, *args, None, "real", options, timeout=timeout)[0], \
            f"{world} ranks of this job ({pool.backend}/{pool.device})"
    if cluster is not None:
        from autosync.executor.emulate import open_ranks

        with open_ranks(cluster, unshaped, start_timeout=start) as ranks:
            summary = ranks.run(_auto_task, *args, cluster.spec(), ranks.network, options, timeout=timeout)[0]
            return summary, Context.on(ranks, w, batch, cluster).label
    with RankPool(world, ranks_per_host=ranks_per_host, start_timeout=start) as ranks:
        summary = ranks.run(_auto_task, *args, None, "unshaped", options, timeout=timeout)[0]
    return summary, f"{world} local ranks (unshaped loopback)"


def _run_world(cluster: Cluster | None, nproc: int | None, ranks_per_host: int | None, pool) -> int:
    """The world size of :func:`run`, from the one of ``cluster``, ``nproc`` and ``pool`` that gives it."""
    if pool is not None:
        if cluster is not None or nproc is not None or ranks_per_host is not None:
            raise UserError("in a job the ranks are the job's own: --cluster, --nproc and --ranks-per-host do not apply")
        return pool.world_size
    if cluster is not None and nproc is not None and nproc != cluster.world_size:
        raise UserError(f"--nproc {nproc} disagrees with --cluster {cluster} ({cluster.world_size} ranks); "
                        f"give one of them")
    if cluster is not None and ranks_per_host is not None:
        raise UserError("--ranks-per-host comes from --cluster; give one of them")
    world = cluster.world_size if cluster is not None else (nproc or 2)
    if ranks_per_host and world % ranks_per_host:
        raise UserError(f"--ranks-per-host {ranks_per_host} does not divide --nproc {world}")
    return world


@dataclass
class ClusterCheck:
    """What :func:`check_cluster` measured: each host link, each host-to-host path (3 hosts or more: bit/s,
    ``paths[a][b]``), each host's compute speed, and the islands sync mode ``selective`` would choose from."""

    cluster: Cluster
    links: list
    paths: list[list[float]] | None
    compute: list
    islands: list[dict]

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return {"links": [asdict(r) for r in self.links], "paths_bps": self.paths,
                "compute": [asdict(r) for r in self.compute]}


def check_cluster(cluster: str | Cluster, seconds: float = 0.5, compute_seconds: float = 2.0) -> ClusterCheck:
    """Bring ``cluster`` up on this machine, measure every host link (point-to-point transfers and a ping-pong),
    every path between hosts (3 hosts or more) and each host's compute speed, and take it down."""
    from autosync.executor.emulate import can_emulate, open_cluster
    from autosync.executor.linkcheck import check_compute, check_links, check_paths
    from autosync.plans.selective import frontier

    cluster = _cluster(cluster)
    ok, why = can_emulate()
    if not ok:
        raise UserError(f"cannot emulate {cluster}: {why}")
    if cluster.nodes < 2:
        raise UserError(f"{cluster} has one host: there is no host link to measure")
    with open_cluster(cluster) as emu:
        with emu.pool(threads_per_rank=1) as pool:
            links = check_links(pool, cluster, seconds=seconds)
            paths = check_paths(pool, cluster, seconds=seconds / 2) if cluster.nodes >= 3 else None
        with emu.pool() as pool:
            speeds = check_compute(pool, cluster, emu.limits, seconds=compute_seconds)
    return ClusterCheck(cluster, links, paths, speeds, frontier(paths, 1.0) if paths else [])


def collect(workload_names: list[str], clusters: list[str | Cluster], data: str | Path = "autosync-data",
            per_context: int = 20, timeout: float = 90.0, budget: float = 4.0, batch_size: int | None = None,
            seed: int = 0, unshaped: bool = False, progress: bool = True, pool=None,
            beyond_range: bool = False, modes: list[str] | None = None) -> dict[str, int]:
    """Measure every baseline and ``per_context`` random strategies per (workload, cluster) into ``data``.

    ``modes`` (sync mode names, e.g. ``["diloco"]``) measures only the DDP default, these modes' baselines and
    draws of these modes: to add a new mode's trials to the contexts of an existing dataset (stored rows are
    skipped).
    With ``pool`` (the job's ranks, from :func:`job`), measured in the job: one cluster, of the job's shape."""
    from autosync.search.collect import collect as _collect
    from autosync.search.trials import TrialSettings

    for name in workload_names:
        resolve_workload(name, batch_size=batch_size)
    _check_modes(modes)
    clusters = [_cluster(c) for c in clusters]
    if pool is None and not unshaped:
        for c in clusters:
            check_faithful(c, beyond_range, "collect")
    check_output(data, "dataset", directory=True)
    store = DatasetStore(data)
    store.read()  # a damaged dataset is reported before anything is measured
    settings = TrialSettings(timeout_s=timeout, time_budget_s=budget, seed=seed)
    if pool is not None and len(clusters) != 1:
        raise UserError("in a job, collect measures the job's own cluster: give one --clusters spec, its shape")
    return _collect(workload_names, clusters, store, per_context, settings, batch_size, seed, progress,
                    unshaped=unshaped, pool=pool, modes=tuple(modes) if modes else None)


def tune(workload_or_model, make_batch: Callable | None = None, cluster: str | Cluster = "2x1@1gbit",
         out: str | Path | None = None, config: TuneConfig | None = None, lossless: bool = False,
         **options) -> Strategy:
    """Find a synchronization strategy for a workload (a name) or a model (with make_batch) on a cluster.

    The choices are a :class:`~autosync.search.config.TuneConfig`, given whole (``config``) or as keyword
    ``options`` of its fields, e.g. ``measure=8`` (strategies measured for real on the emulated ``cluster``;
    0 = predict only), ``objective`` (``time-to-loss``, the default: samples/s x statistical efficiency,
    measured for lossy finalists; ``throughput``; ``lossless``), ``data`` (the folder measurements are
    appended to), ``seed``, ``unshaped``. ``out`` also writes the
    recommendation as a strategy file (its folder is checked first). Without the rights to emulate it refuses,
    unless ``unshaped=True``.

    Call it under ``if __name__ == "__main__":`` in a script: its rank processes re-import the main
    module (as with torch's ``mp.spawn``); a call at import time makes every rank
    try to start ranks of its own, and the failure says so.
    """
    from autosync.present.text import strategy_file_text

    if config is not None and (options or lossless):
        raise UserError("give either a TuneConfig (config=) or its options as keywords, not both")
    config = config or TuneConfig.build(lossless=lossless, **options)
    cluster = _cluster(cluster)
    if out:
        check_output(out, "strategy file")
    w = resolve_workload(workload_or_model, make_batch, config.batch_size)
    result, prof = run_tune(w, cluster, config)
    if out:
        _write(out, lambda p: Path(p).write_text(strategy_file_text(result, prof)))
    return result.strategy


def _check_modes(modes: list[str] | None) -> None:
    if modes:
        from autosync import plans

        unknown = [m for m in modes if m not in plans.SYNC_MODES]
        if unknown:
            raise UserError(f"--modes: unknown sync mode(s) {', '.join(map(repr, unknown))}; known: "
                            f"{', '.join(plans.SYNC_MODES)}")


def efficiency(data: str | Path = "autosync-data", workload_names: list[str] | None = None,
               worlds: list[int] | None = None, per_group: int = 10, seed: int = 0, timeout: float = 1800.0,
               again: bool = False, progress=None, modes: list[str] | None = None) -> tuple[dict[str, int], Path]:
    """Measure the statistical efficiency of the lossy strategies the dataset ``data`` holds (see
    :func:`autosync.efficiency.collect.collect`), of the sync ``modes`` only when given; returns the counts and the
    dataset's folder."""
    from autosync.efficiency.collect import collect as _collect

    _check_modes(modes)
    store = DatasetStore(data, create=False)
    store.read()  # a damaged dataset is reported before anything runs
    return _collect(store, workload_names, worlds, per_group, seed, timeout, progress=progress, again=again,
                    modes=tuple(modes) if modes else None), store.root


def merge(sources: list[str | Path], data: str | Path) -> list[dict[str, int]]:
    """Add every trial, efficiency row and profile of the ``sources`` datasets to ``data`` (created if missing);
    rows stored there already are kept. Returns what each source added."""
    stores = [DatasetStore(s, create=False) for s in sources]
    for s in stores:
        s.read()   # a damaged source is reported before anything is written
    check_output(data, "dataset", directory=True)
    into = DatasetStore(data)
    into.read()
    return [into.merge(s) for s in stores]


def train(data: str | Path = "shipped", out: str | Path = "autosync-model", kind: str = "ranker",
          evaluate: bool = False, seed: int = 0) -> dict:
    """Fit the cost model to the dataset ``data`` and save it in ``out`` (LightGBM text + a JSON card); returns
    the card."""
    from autosync.models.train import train_and_save

    check_output(out, "model", directory=True)
    return train_and_save(DatasetStore(data, create=False), out, kind, evaluate, seed)


def evaluate(data: str | Path = "shipped", splits=("workload", "cluster"), seed: int = 0,
             plot: str | Path | None = None, markdown: str | Path | None = None):
    """Held-out transfer of the cost models on ``data`` (:func:`autosync.models.transfer.evaluate`), its plot
    written to ``plot`` and its table to ``markdown`` when given (both checked first); returns (report, training
    set)."""
    from autosync.models import training, transfer

    for path, what in ((plot, "plot"), (markdown, "Markdown table")):
        if path is not None:
            check_output(path, what)
    training_set = training.build(DatasetStore(data, create=False))
    report = transfer.evaluate(training_set, splits, seed=seed)
    if plot is not None:
        transfer.plot(report, plot)
    if markdown is not None:
        _write(markdown, lambda p: Path(p).write_text(report.to_markdown() + "\n"))
    return report, training_set


def in_job(fn, timeout: float = 300.0, backend: str | None = None):
    """Run ``fn(pool)`` on the ranks of the distributed job this process is part of: rank 0 calls it with the job's
    pool (:func:`job`) and returns what it returns; every other rank serves rank 0's tasks and returns the status
    :meth:`~autosync.executor.job.JobPool.serve` gives. The pool is closed on every rank at the end."""
    pool = job(timeout=timeout, backend=backend)
    try:
        return fn(pool) if pool.rank == 0 else pool.serve()
    finally:
        pool.close()      # releases the others (rank 0) and takes the job's groups down on every rank


def apply(model, optimizer, strategy, process_group=None, ranks_per_host: int | None = None, **options):
    """``autosync.apply``: train ``model`` by ``strategy`` (a Strategy, a strategy file, or ``"auto"``); returns
    ``(model, optimizer)`` to train with.

    A strategy or file: :func:`autosync.executor.apply.apply`. ``"auto"``: :func:`auto` (``options`` are its
    keywords)."""
    if isinstance(strategy, str) and strategy == "auto":
        return auto(model, optimizer, process_group=process_group, ranks_per_host=ranks_per_host, **options)
    from autosync.executor.apply import apply as _apply

    return _apply(model, optimizer, strategy, process_group, ranks_per_host, **options)


@dataclass(frozen=True)
class AutoOptions:
    """The choices of ``strategy="auto"`` (:func:`auto`), shared by the plain loop, :func:`register` and the
    framework integrations."""

    out: str | Path | None = "autosync-strategy.yaml"
    cluster: str | Cluster | None = None
    network: str = "real"
    window: int = 8
    settle: int = 3
    candidates: int = 4
    budget: float = 0.05
    lossy_after: int = 0
    guard: bool = True
    objective: str = "time-to-loss"
    zero_shot: str = "point"
    data: str | Path | None = "autosync-data"
    report: Callable | None = print
    predict: Callable | None = None

    @classmethod
    def build(cls, **options) -> "AutoOptions":
        import dataclasses

        unknown = sorted(set(options) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise UserError(f'unknown option(s) of strategy="auto": {", ".join(unknown)}')
        objectives = ("time-to-loss", "throughput", "lossless")
        if options.get("objective", cls.objective) not in objectives:
            raise UserError(f'strategy="auto": objective must be one of {", ".join(objectives)}, '
                            f'not {options["objective"]!r}')
        if options.get("zero_shot", cls.zero_shot) not in ("lower", "point"):
            raise UserError(f'strategy="auto": zero_shot must be lower or point, not {options["zero_shot"]!r}')
        if not 0 < options.get("budget", cls.budget) <= 1:
            raise UserError(f'strategy="auto": budget is a share of the training time in (0, 1], '
                            f'not {options["budget"]!r}')
        lossy_after = options.get("lossy_after", cls.lossy_after)
        if isinstance(lossy_after, bool) or not isinstance(lossy_after, int) or lossy_after < 0:
            raise UserError(f'strategy="auto": lossy_after is a step count (an integer >= 0), not {lossy_after!r}')
        if not isinstance(options.get("guard", cls.guard), bool):
            raise UserError(f'strategy="auto": guard is True or False, not {options["guard"]!r}')
        return cls(**options)


def auto_tuner(switcher, optimizer, options: AutoOptions, ranks_per_host: int | None = None):
    """The :class:`~autosync.search.online.OnlineTuner` of ``strategy="auto"`` on ``switcher`` (a switchable
    model or hook), observing ``optimizer``; the caller calls its ``after_step`` after each optimizer step."""
    import torch.distributed as dist

    from autosync.executor.apply import _ranks_per_host
    from autosync.profiler.profile import environment
    from autosync.search.online import OnlineTuner

    world = dist.get_world_size()
    rph = _ranks_per_host(ranks_per_host) or world
    spec = _cluster(options.cluster) if options.cluster is not None else None
    if spec is not None and spec.world_size != world:
        raise UserError(f"cluster {spec} has {spec.world_size} ranks; this job has {world}")
    if options.out is not None and dist.get_rank() == 0:
        check_output(options.out, "strategy file")
        check_output(Path(options.out).with_suffix(".html"), "report")
    device = str(next(switcher.module.parameters()).device)
    env = environment(options.network, dist.get_backend(), device)

    def commit(strategy, tuner):
        if options.out is not None:
            from autosync.present.report import write_report
            from autosync.present.text import online_file_text
            from autosync.search.online import tune_result

            _write(options.out, lambda p: Path(p).write_text(online_file_text(strategy, tuner)))
            if tuner.profile is not None:      # the report beside the file, as tune's; never at the training's cost
                try:
                    write_report(tune_result(tuner), tuner.profile, Path(options.out).with_suffix(".html"),
                                 during_training=True)
                except Exception as e:  # noqa: BLE001
                    logging.getLogger("autosync").warning("autosync auto: the report was not written: %s: %s",
                                                          type(e).__name__, e)
        back = tuner.reverted is not None and tuner.reverted["step"] == tuner.committed_at
        if options.data is not None and tuner.profile is not None and not back:    # the guard's: recorded before
            _record_windows(tuner, DatasetStore(options.data))

    import functools

    predict = options.predict or functools.partial(_predict, objective=options.objective, rule=options.zero_shot)
    return OnlineTuner(switcher, optimizer, lambda profile: predict(profile, options.candidates, switcher.adapt),
                       window=options.window, settle=options.settle, max_candidates=options.candidates,
                       budget=options.budget,
                       ranks_per_host=rph, cluster=spec or (lambda net: _job_cluster(net, world, rph)), env=env,
                       name=type(switcher.module).__name__, on_commit=commit, report=options.report,
                       efficiency_rule=options.zero_shot, lossy_after=options.lossy_after, guard=options.guard)


def auto(model, optimizer, process_group=None, ranks_per_host: int | None = None, **options):
    """``strategy="auto"``: tune while training. Returns ``(model, optimizer)`` that the training loop uses as it
    would DDP's; the search runs in windows of its own steps (:mod:`autosync.search.online`).

    The training starts on the DDP default; after one window rank 0 profiles the model from those steps and the
    network from a few seconds of collectives, the cost model predicts ``candidates`` diverse strategies
    (as ``tune --measure 0`` would; lossy ones, compressors and local modes such as local SGD and DiLoCo, judged
    at their predicted efficiency), each trains a window, and the fastest measured one (the default unless
    something beat it) trains the rest. ``options`` (:class:`AutoOptions`): ``out``, the strategy file rank 0
    writes at the commit (checked first; None: none), which :func:`autosync.load_strategy` loads; ``data``, the
    dataset folder rank 0 appends the windows to (one row per strategy, source ``auto``, as ``tune`` stores its
    trials) with the profile (None: none); ``cluster``, the job's shape and links as a spec when known (an
    emulated cluster: with ``network="emulated"``), by default the shape from the job (``$LOCAL_WORLD_SIZE`` ranks
    per host) and the links from the measured network; ``window`` and ``settle``, timed and untimed steps of a
    window; ``candidates``; ``budget``, the share of the training time candidates may lose against the best so
    far (:mod:`autosync.search.online`); ``lossy_after``, the first step at which a lossy candidate may train
    a window (default 0; a lossy stretch early in a training can cost far more than its window,
    bench/results/lossy_window_early.md, but waiting costs more on most workloads, bench/results/online_tuning.md's
    arm "auto late"); ``guard`` (default True), the loss guard: after a lossy commit, a training loss that makes no
    progress over two blocks of 16 steps, in two checks in a row, sends the training back to the best lossless
    strategy measured (it reads the loss the model's forward returns; :mod:`autosync.search.online`);
    ``objective``, as ``tune``'s: ``"time-to-loss"`` (default: lossy candidates admitted by their goodput at their
    predicted efficiency), ``"throughput"`` or ``"lossless"``;
    ``zero_shot``, ``"point"`` (default, as ``tune``'s) or ``"lower"``: a lossy candidate judged at its predicted
    efficiency's point estimate or at its interval's lower bound (as ``tune --measure 0 --zero-shot``;
    ``bench/online_tuning.py`` compares the two rules end to end, arms "auto point" and "auto");
    ``report``, where rank 0's progress lines go (None: only the log);
    ``predict``, ``(profile, k, adapt) -> [(strategy, predicted speedup)]`` on rank 0 (default: the shipped cost
    model, :func:`autosync.search.online.predict_candidates`; a benchmark passes models fitted without the
    workload under test)."""
    import torch.distributed as dist

    from autosync.executor.apply import _ranks_per_host
    from autosync.executor.switch import SwitchableModel, SwitchableOptimizer

    opts = AutoOptions.build(**options)
    if process_group is not None:
        raise UserError('strategy="auto" runs on the default process group; leave process_group out')
    if not dist.is_initialized():
        raise UserError('strategy="auto" needs torch.distributed initialized (init_process_group) first')
    sw_model = SwitchableModel(model, Strategy.default(), ranks_per_host=_ranks_per_host(ranks_per_host))
    sw_opt = SwitchableOptimizer(optimizer)
    sw_model.bind(sw_opt)                  # the local modes (local SGD, DiLoCo) step it through their averager
    tuner = auto_tuner(sw_model, optimizer, opts, ranks_per_host)
    sw_opt.on_step.append(tuner.after_step)
    object.__setattr__(sw_model, "autosync_tuner", tuner)    # its windows and commit, for whoever wants to look
    return sw_model, sw_opt


def register(ddp_model, strategy, optimizer=None, process_group=None, ranks_per_host: int | None = None,
             module=None, **options):
    """``autosync.register``: a strategy (or file) on a model some framework already wrapped in DDP
    (:func:`autosync.executor.apply.register`); or ``"auto"``: tune while training on that DDP. With ``"auto"``
    the comm hook is switched among candidates that keep the DDP's bucket layout, and the returned optimizer
    (``optimizer``, whose ``step`` the training must call) ends each step with the tuner's decision."""
    if not (isinstance(strategy, str) and strategy == "auto"):
        from autosync.executor.apply import register as _register

        return _register(ddp_model, strategy, optimizer, process_group, ranks_per_host, module, **options)
    from autosync.executor.switch import SwitchableHook, SwitchableOptimizer

    opts = AutoOptions.build(**options)
    if optimizer is None:
        raise UserError('register(model, "auto", optimizer): the optimizer is needed (its steps end the windows)')
    hook = SwitchableHook(ddp_model, process_group, ranks_per_host, module)
    inner = getattr(optimizer, "optimizer", optimizer)        # Accelerate's AcceleratedOptimizer wraps the torch one
    tuner = auto_tuner(hook, inner, opts, ranks_per_host)
    wrapped = SwitchableOptimizer(optimizer)
    wrapped.on_step.append(tuner.after_step)
    ddp_model.autosync_tuner = tuner
    return wrapped


def _record_windows(tuner, store: DatasetStore) -> int:
    """Append what ``strategy="auto"`` measured to ``store``: per strategy its windows' steps (the default's without
    those measured while rank 0 predicted), as a trial row of source ``auto``; a candidate that failed to start
    as failed, with its reason. The profile goes beside them. The store keeps the first row of a (context,
    strategy): a commit after a drift adds the rows of strategies new to the context."""
    import statistics

    from autosync.executor.measure import TrialResult
    from autosync.search.online import round_of
    from autosync.search.trials import trial_row

    profile = tuner.profile
    m = profile.model
    world = profile.cluster.world_size
    by_hash: dict[str, list] = {}
    for w in tuner.windows:
        if w.sibling:         # not trained: its figure is its sibling's row
            continue
        if not w.busy or w.strategy.hash != tuner.default_hash:
            by_hash.setdefault(w.strategy.hash, []).append(w)
    rows = []
    for windows in by_hash.values():
        strategy = windows[0].strategy
        steps = [s for w in windows for s in w.steps_s]
        if not steps:
            failed = windows[0]
            result = TrialResult(m.workload, strategy.hash, world, m.batch_size, "failed",
                                 failed.outcome.removeprefix("failed: "))
        else:
            step = statistics.median(w.median_s for w in windows)
            result = TrialResult(m.workload, strategy.hash, world, m.batch_size, "ok",
                                 samples_per_s=m.batch_size * world / step, step_s=step,
                                 step_stat="mean" if round_of(strategy) > 1 else "median",
                                 cv=statistics.pstdev(steps) / statistics.fmean(steps), peak_mem_mb=m.peak_mem_mb,
                                 step_times=steps)
        rows.append(trial_row(profile, strategy, "auto", result))
    store.save_profile(profile.context_id, profile.to_dict())
    return store.append(rows)


#: link rates a measured job is labelled with (Mbit/s): a job's context key must not change with each measurement;
#: up to the fastest link a cluster spec names (100 gbit: a faster one, NVLink inside a host, is labelled that)
RATE_LADDER_MBIT = (10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 25_000, 40_000, 50_000, 100_000)


def _job_cluster(network, world: int, rph: int, known: list[Cluster] = ()) -> Cluster:
    """The cluster a job's measured network describes: its shape, and the link of its first two hosts (one-way
    point-to-point bandwidth from the fit's slope), on :data:`RATE_LADDER_MBIT` (the nearest rung by ratio), so
    that every run of the same job gets the same context key; the latency is left out of the label (it is in the
    measured profile). ``known``: the labels earlier runs of the job gave it (their profiles are stored); the one
    of the same shape nearest the measured rate, within a factor of 2, is kept, so that a restart that measures a
    link a little slower (a rate near the middle of two rungs, a busy host) does not start a new context."""
    import math

    nodes = world // rph
    if nodes < 2:
        return Cluster.parse(f"1x{rph}@100gbit")
    fit = network.fits.get("inter", network.fits["world"])["send_recv"]
    mbit = max(fit.bandwidth_bps, 1e6) / 1e6
    same = [c for c in known if (c.nodes, c.ranks_per_node) == (nodes, rph)
            and abs(math.log(c.slowest_rate_bps / 1e6 / mbit)) <= math.log(2)]
    if same:
        return min(same, key=lambda c: abs(math.log(c.slowest_rate_bps / 1e6 / mbit)))
    rung = min(RATE_LADDER_MBIT, key=lambda r: abs(math.log(r / mbit)))
    return Cluster.parse(f"{nodes}x{rph}@{rung}mbit")


def _known_job_clusters(store: DatasetStore, pool, workload, batch: int) -> list[Cluster]:
    """The labels of the job's shape whose context (this workload and batch, on the job's network) has a stored
    profile: what earlier runs of the job called it."""
    nodes = max(pool.world_size // pool.ranks_per_host, 1)
    out = []
    for rung in RATE_LADDER_MBIT:
        cluster = Cluster.parse(f"{nodes}x{pool.ranks_per_host}@{rung}mbit")
        if store.load_profile_dict(Context.on(pool, workload, batch, cluster).id) is not None:
            out.append(cluster)
    return out


def _restarted_job_cluster(store: DatasetStore, pool, workload, batch: int) -> Cluster | None:
    """The label of the run this one restarts: a trial an earlier run of the job started in this workload's context
    on the job's network and shape, and never finished (:class:`~autosync.search.trials.Journal`), names it; the
    restart resumes that context whatever its links measure now (a busy host read a 1 gbit link at 0.4 gbit once).
    None where there is no such trial."""
    import json

    from autosync.search.trials import Journal

    try:
        context_id = json.loads(Journal(store).path.read_text())["context_id"]
        cluster = Cluster.parse(context_id.split("|")[2])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    if (cluster.nodes, cluster.ranks_per_node) != (max(pool.world_size // pool.ranks_per_host, 1),
                                                   pool.ranks_per_host):
        return None                       # the job came back in another shape: another cluster
    try:
        same = Context.on(pool, workload, batch, cluster).id == context_id
    except (UserError, ValueError):
        return None
    return cluster if same else None


def job_cluster(pool, known: list[Cluster] = ()) -> Cluster:
    """The cluster of the job ``pool`` holds (:func:`job`): its hosts x ranks per host, and its links measured
    (:func:`autosync.profiler.measure.profile_network`, a few seconds) and labelled as :func:`_job_cluster` says
    (``known``: the labels earlier runs of the job used)."""
    from autosync.profiler.measure import profile_network
    from autosync.profiler.observe import LIVE_MAX_OP_S, LIVE_SIZES

    # the short sweep strategy="auto" runs live: only the link's rung on the ladder is read from it
    network = profile_network(pool, sizes=LIVE_SIZES, max_op_s=LIVE_MAX_OP_S, ahead=True)
    return _job_cluster(network, pool.world_size, pool.ranks_per_host, known)


def _predict(profile, k: int, adapt=None, objective: str = "time-to-loss", rule: str = "lower") -> list:
    """:func:`autosync.search.online.predict_candidates` with the shipped models (regressor, intervals, and for
    time to loss the efficiency model)."""
    from autosync.models import training
    from autosync.models.efficiency_model import EfficiencyModel, fit_store
    from autosync.search.online import predict_candidates

    from autosync.search.online import PROPOSALS

    config = TuneConfig.build(measure=0, objective=objective, candidates=PROPOSALS, zero_shot=rule)
    shipped = DatasetStore(SHIPPED_DATA, create=False) if (SHIPPED_DATA / "profiles").is_dir() else None
    base = training.build(shipped) if shipped else None
    eff_model = None          # no interval card: the choice reads the point predictions (fitting the intervals'
    if objective == "time-to-loss":      # fold models would take the 2 cores from the training for seconds)
        try:
            eff_model = fit_store(shipped) if shipped else EfficiencyModel()
        except ValueError:
            eff_model = EfficiencyModel()
    return predict_candidates(profile, load_model(), base, None, config, k, adapt, eff_model)


def sweep(everything: bool = False) -> list[str]:
    """Remove the namespaces and cgroups of autosync runs whose process is gone (``everything``: of live ones too)."""
    from autosync.executor.emulate import can_emulate
    from autosync.executor.emulate import sweep as _sweep

    ok, why = can_emulate()
    if not ok:
        raise UserError(f"cannot sweep: {why}")
    return _sweep(everything=everything)


def benchmarks() -> dict[str, tuple[Path, str]]:
    """The benchmarks of a source checkout's ``bench/`` folder: name -> (script, its docstring's first line)."""
    import ast

    folder = Path(__file__).resolve().parent.parent / "bench"
    if not folder.is_dir():
        raise UserError("the benchmarks live in bench/ of a source checkout, which this installation does not have")
    out = {}
    for path in sorted(folder.glob("*.py")):
        if not path.name.startswith("_"):   # _*.py: helpers
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            out[path.stem] = (path, doc.splitlines()[0] if doc else "")
    return out
