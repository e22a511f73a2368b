"""Measuring a profile: the model on every rank (:func:`profile_model`), the network's collectives
(:func:`profile_network`), and both into a :class:`~autosync.profiler.profile.Profile` (:func:`run_profile`,
:func:`nominal_profile`). The data classes live in :mod:`autosync.profiler` and import none of this."""
from __future__ import annotations

import math
import statistics
import time

import torch
from torch import nn

from autosync import workloads
from autosync.cluster import Cluster
from autosync.errors import UserError
from autosync.executor.launch import RankContext, RankPool
from autosync.executor.memory import peak_rss_mb, reset_peak_rss
from autosync.profiler.model import ModelProfile, ParamInfo
from autosync.profiler.network import COLLECTIVES, SIZES, NetworkProfile, Fit
from autosync.profiler.profile import Profile, environment


# --- the model -----------------------------------------------------------------------------------

def _owner_types(model: nn.Module) -> dict[str, str]:
    out = {}
    for mod_name, mod in model.named_modules():
        for p_name, _ in mod.named_parameters(recurse=False):
            out[f"{mod_name}.{p_name}" if mod_name else p_name] = type(mod).__name__
    return out


def profile_model(workload, batch_size: int | None = None, repeats: int = 5, warmup: int = 2,
                  seed: int = 0, device: str = "cpu") -> ModelProfile:
    """Profile ``workload`` in this process (no communication) at ``batch_size`` per rank, on ``device``.

    On CUDA every time is of finished kernels: phases are read after a synchronize, gradient-ready
    times from events recorded in the gradient hooks (:class:`autosync.executor.device.Marks`).
    """
    from torch.utils.flop_counter import FlopCounterMode

    from autosync.executor.device import to_device

    model, make_batch = workloads.build(workload, seed=seed)
    model.to(device)
    batch_size = batch_size or workloads.default_batch_size(workload)
    workloads.check_batch(workload, model, make_batch, batch_size)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    embeddings = workloads.embedding_parameter_names(model)
    optimizer = torch.optim.SGD([p for _, p in named], lr=1e-3, momentum=0.9)
    gen = torch.Generator().manual_seed(seed)
    reset_peak_rss()
    t = _time_steps(workload, model, named, embeddings, optimizer, lambda: to_device(make_batch(batch_size, gen),
                                                                                      device), device, warmup, repeats)
    peak = peak_rss_mb()
    if device.startswith("cuda"):   # what bounds a GPU job is its device memory
        peak = torch.cuda.max_memory_allocated(torch.device(device)) / 2 ** 20
    counter = FlopCounterMode(display=False)
    with counter:
        workloads.loss_of(model(**to_device(make_batch(batch_size, gen), device))).backward()
    optimizer.zero_grad(set_to_none=False)
    owner = _owner_types(model)
    infos = []
    for n, p in named:
        times = t["ready_s"][n]
        infos.append(ParamInfo(
            name=n, shape=tuple(p.shape), numel=p.numel(), dtype=str(p.dtype).removeprefix("torch."),
            module_type=owner.get(n, ""), is_embedding=n in embeddings,
            touched_rows=statistics.fmean(t["touched"][n]) if t["touched"].get(n) else 1.0,
            ready_s=statistics.median(times) if times else statistics.median(t["bwd"]),
            factor_rows=_rows(t["factor_rows"].get(n))))
    infos.sort(key=lambda info: info.ready_s)
    return ModelProfile(str(workload), batch_size, infos, statistics.median(t["fwd"]), statistics.median(t["bwd"]),
                        statistics.median(t["opt"]), float(counter.get_total_flops()), peak, torch.get_num_threads())


def _time_steps(workload, model, named, embeddings, optimizer, next_batch, device, warmup: int, repeats: int) -> dict:
    """``warmup + repeats`` training steps, the last ``repeats`` timed: forward, backward and optimizer times, each
    parameter's gradient-ready times, the rows of each embedding a batch touched, and (sfb) the factor rows of
    each weight whose gradient is an outer product of its layer's factors."""
    from autosync.executor.device import Marks, now
    from autosync.plans.sfb import Factors, _matches, outer_sum

    ready: dict[str, list] = {n: [] for n, _ in named}      # marks, resolved to seconds after each backward
    out = {"fwd": [], "bwd": [], "opt": [], "ready_s": {n: [] for n, _ in named},
           "touched": {n: [] for n in embeddings}}
    marks = Marks(device)

    def hook_for(name: str):
        def hook(param: torch.Tensor) -> None:
            ready[name].append(marks.mark())
        return hook

    handles = [p.register_post_accumulate_grad_hook(hook_for(n)) for n, p in named]
    factors = Factors(model, {id(p) for _, p in named})
    out["factor_rows"] = factor_rows = {n: [] for n, p in named if id(p) in factors.names}
    try:
        for i in range(warmup + repeats):
            batch = next_batch()
            t0 = now(device)
            loss = workloads.loss_of(model(**batch))
            t1 = now(device)
            marks.start()
            loss.backward()
            t2 = now(device)
            for n, v in ready.items():
                if i >= warmup:
                    out["ready_s"][n].extend(marks.seconds(m) for m in v)
                v.clear()
            for n, p in named:
                if n in embeddings and p.grad is not None:
                    out["touched"][n].append((p.grad.abs().sum(1) != 0).float().mean().item())
                if n in factor_rows:     # sfb: rows of its factors, if their product is its gradient
                    got = factors.take(id(p))
                    exact = got is not None and p.grad is not None and _matches(
                        outer_sum(got[1], got[0], factors.transposed[id(p)]), p.grad)
                    factor_rows[n].append(float(got[0].shape[0]) if exact else float("nan"))
            t3 = now(device)
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
            t4 = now(device)
            if i >= warmup:
                out["fwd"].append(t1 - t0)
                out["bwd"].append(t2 - t1)
                out["opt"].append(t4 - t3)
    except UserError:
        raise
    except Exception as e:
        raise workloads.WorkloadError(f"workload {workload!r}: a training step failed: {type(e).__name__}: {e}") \
            from None
    finally:
        for h in handles:
            h.remove()
        factors.close()
    return out


def _rows(seen: list[float] | None) -> float:
    """A weight's factor rows per step: their mean when every step's factors gave its gradient, else 0."""
    if not seen or any(math.isnan(r) for r in seen):
        return 0.0
    return statistics.fmean(seen)


# --- the network ---------------------------------------------------------------------------------

def _run_op(op: str, nbytes: int, group, group_ranks: list[int], me: int, peer: int | None, device: str = "cpu"):
    import functools

    import torch
    import torch.distributed as dist

    numel = max(1, nbytes // 4)
    p = len(group_ranks)
    ones = functools.partial(torch.ones, device=device)    # every buffer on the rank's device
    empty = functools.partial(torch.empty, device=device)
    if op == "all_reduce":
        t = ones(numel)
        return lambda: dist.all_reduce(t, group=group)
    if op == "reduce":
        t = ones(numel)
        return lambda: dist.reduce(t, dst=group_ranks[0], group=group)
    if op == "broadcast":
        t = ones(numel)
        return lambda: dist.broadcast(t, src=group_ranks[0], group=group)
    if op == "all_gather":
        out = empty(numel // p * p)
        inp = ones(numel // p)
        gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
        return lambda: gather(out, inp, group=group)
    if op == "reduce_scatter":
        inp = ones(numel // p * p)
        out = empty(numel // p)
        scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
        return lambda: scatter(out, inp, group=group)
    if op == "send_recv":
        from autosync.executor.device import p2p_device

        t = torch.ones(numel, device=p2p_device(dist.get_backend(group), device))
        if peer is None:
            return lambda: None
        first = me < peer

        def ping_pong() -> None:  # n bytes each way; half of it is one transfer
            if first:
                dist.send(t, peer)
                dist.recv(t, peer)
            else:
                dist.recv(t, peer)
                dist.send(t, peer)
        return ping_pong
    raise ValueError(op)


def _sweep(group, group_ranks: list[int], me: int, peer: int | None, sizes, max_op_s: float | dict[str, float],
           reps: int, device: str = "cpu", ahead: bool = False) -> dict[str, list[tuple[int, float]]]:
    """Each collective over growing ``sizes`` until one is slower than ``max_op_s`` (one limit, or one per
    collective); with ``ahead``, until the next size would be (the last time scaled by the sizes' ratio), once three
    sizes are in: the live bench's rule, which keeps a slow link from paying for its largest size four times
    (warm-up and repetitions)."""
    import torch.distributed as dist

    from autosync.executor.device import now, reduce_values

    out: dict[str, list[tuple[int, float]]] = {}
    for op in COLLECTIVES:
        limit = max_op_s[op] if isinstance(max_op_s, dict) else max_op_s
        points = []
        for i, nbytes in enumerate(sizes):
            fn = _run_op(op, nbytes, group, group_ranks, me, peer, device)
            fn()  # warm-up (connections, allocations, TCP window)
            times = []
            for _ in range(reps):
                dist.barrier(group=group)
                t0 = now(device)
                fn()
                times.append(now(device) - t0)   # synchronized: the collective's kernels are done
            worst = reduce_values([statistics.median(times)], "max", device, group=group)[0]
            seconds = worst / (2 if op == "send_recv" else 1)
            points.append((nbytes, seconds))
            if worst > limit:
                break
            if ahead and len(points) >= 3 and i + 1 < len(sizes) and worst * sizes[i + 1] / nbytes > limit:
                break
        out[op] = points
    return out


def _bench_task(ctx: RankContext, sizes, max_op_s: float | dict[str, float], reps: int, ahead: bool = False) -> dict:
    import torch.distributed as dist

    rph, world = ctx.ranks_per_host, ctx.world_size
    nodes = world // rph
    results: dict[str, dict] = {}
    peer_world = rph if nodes > 1 else (1 if world > 1 else None)   # first rank of another host
    results["world"] = _sweep(dist.group.WORLD, list(range(world)), ctx.rank,
                              peer_world if ctx.rank == 0 else (0 if ctx.rank == peer_world else None),
                              sizes, max_op_s, reps, ctx.device, ahead)
    if nodes > 1 and rph > 1:
        intra = None
        for h in range(nodes):  # every rank creates every subgroup, in the same order
            g = dist.new_group(list(range(h * rph, (h + 1) * rph)))
            if h == ctx.rank // rph:
                intra = g
        leaders = dist.new_group(list(range(0, world, rph)))
        host0 = ctx.rank - ctx.rank % rph
        local = ctx.rank % rph
        peer = (host0 + 1 if local == 0 else host0) if local in (0, 1) else None
        results["intra"] = _sweep(intra, list(range(host0, host0 + rph)), ctx.rank, peer, sizes, max_op_s, reps,
                                  ctx.device, ahead)
        if local == 0:
            lead_peer = rph if ctx.rank == 0 else (0 if ctx.rank == rph else None)
            results["inter"] = _sweep(leaders, list(range(0, world, rph)), ctx.rank, lead_peer, sizes,
                                      max_op_s, reps, ctx.device, ahead)
        dist.barrier()
    return results


def all_reduce_seconds(ctx: RankContext, nbytes: int, reps: int) -> float:
    """A rank task: one all-reduce of ``nbytes`` on the default group, timed ``reps`` times after a warm-up; the
    slowest rank's median (what a fit of the network is checked against)."""
    import torch.distributed as dist

    t = torch.ones(nbytes // 4)
    dist.all_reduce(t)
    times = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        times.append(time.perf_counter() - t0)
    worst = torch.tensor([statistics.median(times)])
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return worst.item()


def profile_network(pool: RankPool, sizes=SIZES, max_op_s: float | dict[str, float] = 0.3, reps: int = 3,
                    timeout: float = 600.0, ahead: bool = False) -> NetworkProfile:
    """Benchmark the pool's process group and fit alpha/beta per scope and collective.

    Each point is the median of ``reps`` timed runs (the slowest rank's): 3, so that one slow run on a busy host
    does not set the point (a median of 2 is their mean; a CI run once fitted 0.43 s for a 0.32 s all-reduce)."""
    per_rank = pool.run(_bench_task, tuple(sizes), max_op_s, reps, ahead, timeout=timeout)
    raw = dict(per_rank[0])
    fits = {scope: {op: Fit.from_points(points) for op, points in ops.items()} for scope, ops in raw.items()}
    return NetworkProfile(pool.world_size, pool.ranks_per_host, fits, measured=True)


# --- both ----------------------------------------------------------------------------------------

def _model_task(ctx: RankContext, workload: str, batch_size: int | None) -> dict:
    """Every rank profiles its own copy at once, on its own device, so compute shares what it shares in training."""
    return profile_model(workload, batch_size, device=ctx.device).to_dict()


def run_profile(pool: RankPool, cluster: Cluster, workload: str, batch_size: int | None = None,
                measure_network: bool = True, timeout: float = 600.0) -> Profile:
    """Profile ``workload`` and the network of ``pool`` (or the spec's nominal numbers).

    The profile's context takes the pool's ``network`` label (emulated, unshaped, real). On a
    cluster of uneven compute the model profile is the fastest rank's (a full-speed host) and
    the environment records ``host_speeds``: per host, the median over its ranks of the fastest
    rank's compute time over theirs (measured while every rank profiles at once). With three hosts or
    more it records ``path_bps``, the bandwidth of every host-to-host path (:meth:`Profile.path_bps`).
    """
    models = [ModelProfile.from_dict(d) for d in pool.run(_model_task, workload, batch_size, timeout=timeout)]
    extra = dict(getattr(pool, "facts", {}))
    model = models[0]
    if cluster.uneven_compute:
        model = min(models, key=lambda mp: mp.compute_s)
        rph = cluster.ranks_per_node
        extra["host_speeds"] = [round(statistics.median(model.compute_s / mp.compute_s
                                                        for mp in models[h * rph:(h + 1) * rph]), 4)
                                for h in range(cluster.nodes)]
    if measure_network and cluster.nodes >= 3:   # islands of selective receivers need per-path numbers
        from autosync.executor.linkcheck import check_paths

        extra["path_bps"] = check_paths(pool, cluster, timeout=timeout)
    network = profile_network(pool, timeout=timeout) if measure_network else NetworkProfile.nominal(cluster)
    env = environment(pool.network if measure_network else "nominal", pool.backend, pool.device, **extra)
    return Profile(model, network, cluster, env)


def nominal_profile(cluster: Cluster, workload: str, batch_size: int | None = None) -> Profile:
    """Prediction-only profile: the model profiled here, the network from the spec's numbers."""
    return Profile(profile_model(workload, batch_size), NetworkProfile.nominal(cluster), cluster, environment("nominal"))
