"""The Python face of tuning: ``autosync.tune(...)`` and what the CLI's tune calls."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from torch import nn

from autosync import workloads
from autosync.cluster import Cluster, parse_cluster
from autosync.datasets.store import DatasetStore
from autosync.errors import UserError
from autosync.executor.emulate import EmulationError, emulate
from autosync.executor.launch import TrialFailure
from autosync.models import training
from autosync.models.ranker import CostModel
from autosync.models.train import PRETRAINED
from autosync.profiler import Profile
from autosync.profiler.profile import ProfileError, load_profile, nominal_profile, run_profile
from autosync.search.trials import TrialSettings
from autosync.search.tuner import TuneResult, tune as _tune_loop
from autosync.strategy import Strategy

log = logging.getLogger(__name__)
DEFAULT_STORAGE = "sqlite:///autosync-tune.db"
SHIPPED_DATA = Path(__file__).parent / "datasets" / "data"


def resolve_workload(workload_or_model, make_batch: Callable | None = None, batch_size: int | None = None):
    """A workload name, or an nn.Module with its make_batch, checked by one forward call."""
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
    return w


def load_model(path: str | Path | None = None, kind: str = "regressor") -> CostModel:
    return CostModel.load(Path(path) if path else PRETRAINED / kind)


def run_tune(workload, cluster: Cluster, measure: int = 8, lossless: bool = False,
             storage: str = DEFAULT_STORAGE, data: str | Path = "autosync-data", batch_size: int | None = None,
             model_path: str | Path | None = None, seed: int = 0, candidates: int = 500,
             settings: TrialSettings = TrialSettings(), on_measured=None, status=None,
             profile_path: str | Path | None = None) -> tuple[TuneResult, Profile]:
    """Tune ``workload`` on ``cluster``; ``profile_path`` (from `autosync profile`) replaces profiling."""
    model = load_model(model_path)
    batch = batch_size or workloads.default_batch_size(workload)
    context_id = f"{workload}|b{batch}|{cluster.spec()}"
    given = _given_profile(profile_path, context_id) if profile_path else None
    store = DatasetStore(data)
    base = training.build(DatasetStore(SHIPPED_DATA, create=False)) if (SHIPPED_DATA / "profiles").is_dir() else None
    if measure == 0:
        if status and given is None:
            status("profiling the model (nominal network)")
        profile = given or nominal_profile(cluster, workload, batch)
        return _tune_loop(profile, model, 0, store, storage, None, base, lossless, seed, candidates,
                          settings=settings), profile
    try:
        with emulate(cluster) as emu, emu.pool() as pool:
            stored = store.load_profile_dict(context_id)
            if given is not None:
                profile = given
            elif stored is not None:
                profile = Profile.from_dict(stored, str(store.profile_path(context_id)))
            else:
                if status:
                    status(f"profiling {workload} on {cluster}")
                profile = run_profile(pool, cluster, workload, batch)
                store.save_profile(profile.context_id, profile.to_dict())
            if status:
                status(f"tuning: {measure} measured trials")
            result = _tune_loop(profile, model, measure, store, storage, pool, base, lossless, seed, candidates,
                                settings=settings, on_measured=on_measured, workload=workload)
    except EmulationError as e:
        raise UserError(f"cannot emulate {cluster}: {e}") from None
    except TrialFailure as f:
        raise UserError(f"profiling failed ({f.status}): {f.reason}") from None
    return result, profile


def _given_profile(path: str | Path, context_id: str) -> Profile:
    """A profile file the user gave: readable, of this version, and of this (workload, batch, cluster)."""
    profile = load_profile(path)
    if profile.context_id != context_id:
        raise ProfileError(f"{path}: profile is of {profile.context_id!r}, not of {context_id!r}; "
                           f"profile this workload and cluster again")
    return profile


def profile(workload_or_model, cluster: str | Cluster = "2x1@1gbit", make_batch: Callable | None = None,
            batch_size: int | None = None, nominal: bool = False) -> Profile:
    """Profile a workload and a cluster: measured on the emulated cluster, or ``nominal`` from the spec."""
    cluster = parse_cluster(cluster) if isinstance(cluster, str) else cluster
    w = resolve_workload(workload_or_model, make_batch, batch_size)
    batch = batch_size or workloads.default_batch_size(w)
    if nominal:
        return nominal_profile(cluster, w, batch)
    with emulate(cluster) as emu, emu.pool() as pool:
        return run_profile(pool, cluster, w, batch)


def tune(workload_or_model, make_batch: Callable | None = None, cluster: str | Cluster = "2x1@1gbit",
         measure: int = 8, lossless: bool = False, storage: str = DEFAULT_STORAGE, batch_size: int | None = None,
         data: str | Path = "autosync-data", seed: int = 0, out: str | Path | None = None) -> Strategy:
    """Find a synchronization strategy for a workload (a name) or a model (with make_batch) on a cluster.

    Measures ``measure`` strategies for real on the emulated ``cluster`` (0 = predict only)
    and returns the recommendation; ``out`` also writes it as a strategy file.
    """
    from autosync.search.tuner import strategy_file_text

    cluster = parse_cluster(cluster) if isinstance(cluster, str) else cluster
    w = resolve_workload(workload_or_model, make_batch, batch_size)
    result, profile = run_tune(w, cluster, measure, lossless, storage, data, batch_size, seed=seed)
    if out:
        Path(out).write_text(strategy_file_text(result, profile))
    return result.strategy
