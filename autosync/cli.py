"""The ``autosync`` command: a thin layer over the Python API.

Every error a user can cause ends with one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from typing import Sequence

from autosync.errors import UserError, sigterm_as_interrupt

log = logging.getLogger("autosync")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (no usage dump) and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{self.prog}: {message} (see --help)")


def _console():
    """A rich console; 120 columns when stdout is not a terminal (rich would assume 80)."""
    import sys as _sys

    from rich.console import Console

    return Console() if _sys.stdout.isatty() else Console(width=120)


def _number(cast, lowest, strict: bool, what: str):
    """An argparse type: ``cast(text)`` that must be > lowest (strict) or >= lowest."""
    def parse(text: str):
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < lowest or (strict and value == lowest) or value != value:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value
    return parse


_positive_int = _number(int, 0, True, "a positive integer")
_non_negative_int = _number(int, 0, False, "an integer >= 0")
_positive_float = _number(float, 0.0, True, "a positive number")


def _cluster_spec(text: str):
    from autosync.cluster import parse_cluster

    try:
        return parse_cluster(text)
    except UserError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _add_in_job(p, timeout_note: str) -> None:
    p.add_argument("--in-job", action="store_true",
                   help="run inside the distributed job this command was started in (torchrun --nnodes N "
                        "--nproc-per-node G -m autosync.cli ... --in-job): measure on the job's own ranks, devices "
                        "and network instead of an emulated cluster; rank 0 writes every file, the other ranks "
                        f"serve it; --cluster gives the job's shape (hosts x ranks). {timeout_note}")
    p.add_argument("--backend", choices=["nccl", "gloo"], default=None,
                   help="with --in-job: the process group's backend (default: nccl on GPUs, gloo on CPUs)")


def _job_aware(cmd):
    """With --in-job, join the job: rank 0 runs ``cmd`` with ``args.pool`` (the job's ranks); the others serve."""
    import functools

    @functools.wraps(cmd)
    def wrapped(args) -> int:
        args.pool = None
        if not getattr(args, "in_job", False):
            if getattr(args, "backend", None):
                raise UserError("--backend applies only with --in-job (emulated clusters run gloo on CPUs)")
            return cmd(args)
        for flag in ("unshaped", "nominal"):
            if getattr(args, flag, False):
                raise UserError(f"--in-job measures the job's own network; --{flag} does not apply")
        from autosync import api

        pool = api.job(timeout=args.timeout, backend=args.backend)
        try:
            if pool.rank != 0:
                return pool.serve()
            args.pool = pool
            return cmd(args)
        finally:
            args.pool = None
            pool.close()      # releases the others (rank 0) and takes the job's groups down on every rank
    return wrapped


def _add_run(sub) -> None:
    p = sub.add_parser(
        "run", help="measure one strategy on real ranks",
        description="Train a workload for a few steps with a strategy (default: PyTorch DDP's default) on N local "
                    "gloo ranks, and report throughput, median step time, its coefficient of variation and peak "
                    "memory. Under torchrun it runs on the job's ranks instead of spawning its own.",
        epilog="example: autosync run --workload bert-mini --nproc 2 --strategy strategy.yaml")
    p.add_argument("--workload", "--model", dest="workload", required=True, metavar="W",
                   help="built-in workload (list: autosync workloads) or "
                        "'pkg.module:function' / 'path/file.py:function'")
    p.add_argument("--strategy", metavar="FILE", help="strategy YAML or JSON (default: the DDP default)")
    p.add_argument("--nproc", type=_positive_int, default=None, help="number of local ranks (default 2)")
    p.add_argument("--cluster", type=_cluster_spec, metavar="SPEC",
                   help="run on an emulated cluster, e.g. 2x1@100mbit (world size from the spec; needs root)")
    p.add_argument("--ranks-per-host", type=_positive_int, default=None,
                   help="ranks that share a host, for hierarchical plans and local SGD (default: all)")
    p.add_argument("--batch-size", type=_positive_int, default=None, help="per-rank batch size (default: the workload's)")
    p.add_argument("--steps", type=_positive_int, default=10, help="timed steps (default 10)")
    p.add_argument("--warmup", type=_non_negative_int, default=3, help="untimed warm-up steps (default 3)")
    p.add_argument("--seed", type=_non_negative_int, default=0, help="model and data seed (default 0)")
    p.add_argument("--timeout", type=_positive_float, default=300.0,
                   help="time limit in seconds of the trial, and of its ranks' start (which has at most 120 s); "
                        "all ranks are killed when it runs out (default 300)")
    p.add_argument("--json", action="store_true", help="print the TrialResult as JSON instead of a table")
    p.add_argument("--unshaped", action="store_true",
                   help="measure on this host's loopback without shaping the links (no root needed); the results "
                        "are labelled unshaped and never mixed with shaped data")
    p.set_defaults(func=_cmd_run)


def _validate_run(args) -> tuple[object, object]:
    """Under torchrun: check the strategy and workload before joining the job; returns (strategy, batch size)."""
    import os

    from autosync import workloads
    from autosync.api import checked_workload, check_strategy
    from autosync.strategy import Strategy, load_strategy

    strategy = load_strategy(args.strategy) if args.strategy else Strategy.default()
    _, model = checked_workload(args.workload, batch_size=args.batch_size)
    check_strategy(strategy, model, int(os.environ["WORLD_SIZE"]), args.strategy or "default strategy")
    return strategy, args.batch_size or workloads.default_batch_size(args.workload)


def _print_result(result, as_json: bool, title: str, where: str | None = None) -> None:
    if as_json:
        if where is None:
            print(result.to_json())
        else:   # where the numbers come from (emulated, unshaped, beyond the faithful range) travels with them
            print(json.dumps({**json.loads(result.to_json()), "measured_on": where}))
        return
    from rich.table import Table

    table = Table(title=title)
    for col in ("status", "samples/s", f"step ({result.step_stat})", "CV", "peak mem", "ranks", "batch/rank"):
        table.add_column(col, justify="right")
    table.add_row(result.status, f"{result.samples_per_s:,.1f}", f"{result.step_s * 1e3:.1f} ms",
                  f"{result.cv:.1%}", f"{result.peak_mem_mb:,.0f} MB", str(result.world_size), str(result.batch_size))
    console = _console()
    console.print(table)
    if result.reason:
        console.print(f"reason: {result.reason}", markup=False)


def _cmd_run(args) -> int:
    from autosync import api
    from autosync.executor.launch import in_torchrun

    if in_torchrun():
        return _run_under_torchrun(args)
    result, where = api.run(args.workload, strategy=args.strategy, cluster=args.cluster, nproc=args.nproc,
                            ranks_per_host=args.ranks_per_host, batch_size=args.batch_size, steps=args.steps,
                            warmup=args.warmup, seed=args.seed, timeout=args.timeout, unshaped=args.unshaped)
    _print_result(result, args.json, f"{args.workload} on {where}, strategy {result.strategy_hash}", where)
    return 0 if result.ok else 1


def _add_cluster(sub) -> None:
    p = sub.add_parser("cluster", help="emulated clusters: check links, sweep leftovers",
                       description="Emulated clusters on this machine (network namespaces + tc; needs root).")
    csub = p.add_subparsers(dest="cluster_command", metavar="ACTION", parser_class=_Parser)
    csub.required = True
    c = csub.add_parser("check", help="bring a cluster up, measure every host link and host speed, tear it down",
                        description="Bring SPEC up, measure each host link with torch.distributed point-to-point "
                                    "transfers and a ping-pong, print configured vs measured bandwidth and latency; "
                                    "then measure each host's compute speed (matrix products on all ranks at once, "
                                    "with the CPU limits lifted and applied).",
                        epilog="example: autosync cluster check '2x1@1gbit;node1=100mbit;node1=cpu:0.5'")
    c.add_argument("spec", type=_cluster_spec, metavar="SPEC", help="NODESxRANKS@BANDWIDTH[,LATENCY][;nodeK=...]")
    c.add_argument("--seconds", type=_positive_float, default=0.5, help="length of each transfer (default 0.5 s)")
    c.add_argument("--compute-seconds", type=_positive_float, default=2.0,
                   help="length of each compute measurement (default 2 s; give stragglers several slices)")
    c.add_argument("--json", action="store_true", help="print the measurements as JSON")
    c.set_defaults(func=_cmd_cluster_check)
    s = csub.add_parser("sweep", help="remove namespaces left by dead autosync runs",
                        description="Delete the network namespaces (and their veths) of autosync runs whose process "
                                    "is gone. --all deletes those of live runs too.")
    s.add_argument("--all", action="store_true", help="also remove the namespaces of running autosync processes")
    s.set_defaults(func=_cmd_cluster_sweep)


def _cmd_cluster_check(args) -> int:
    import dataclasses
    import json

    from rich.table import Table

    from autosync.api import emulated
    from autosync.executor.emulate import can_emulate
    from autosync.executor.linkcheck import check_compute, check_links, check_paths
    from autosync.plans.selective import frontier

    ok, why = can_emulate()
    if not ok:
        raise UserError(f"cannot emulate {args.spec}: {why}")
    if args.spec.nodes < 2:
        raise UserError(f"{args.spec} has one host: there is no host link to measure")
    with emulated(args.spec) as cluster:
        with cluster.pool(threads_per_rank=1) as pool:
            rows = check_links(pool, args.spec, seconds=args.seconds)
            paths = check_paths(pool, args.spec, seconds=args.seconds / 2) if args.spec.nodes >= 3 else None
        with cluster.pool() as pool:
            speeds = check_compute(pool, args.spec, cluster.limits, seconds=args.compute_seconds)
    if args.json:
        print(json.dumps({"links": [dataclasses.asdict(r) for r in rows], "paths_bps": paths,
                          "compute": [dataclasses.asdict(r) for r in speeds]}))
        return 0
    table = Table(title=f"cluster {args.spec}: host links (each to its peer host)")
    for col in ("host", "peer", "configured", "measured", "ratio", "configured latency", "measured latency"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(f"node{r.host}", f"node{r.peer}", f"{r.configured_bps / 1e6:,.0f} Mbit/s",
                      f"{r.measured_bps / 1e6:,.1f} Mbit/s", f"{r.measured_bps / r.configured_bps:.2f}",
                      f"{r.configured_latency_s * 1e3:.3f} ms", f"{r.measured_latency_s * 1e3:.3f} ms")
    _console().print(table)
    if paths:
        n = args.spec.nodes
        table = Table(title="host-to-host paths, measured Mbit/s (what selective receivers choose islands by)")
        table.add_column("")
        for b in range(n):
            table.add_column(f"node{b}", justify="right")
        for a in range(n):
            table.add_row(f"node{a}", *("-" if a == b else f"{paths[a][b] / 1e6:,.0f}" for b in range(n)))
        _console().print(table)
        islands = frontier(paths, 1.0)
        print("islands for sync mode selective (fastest first): "
              + (", ".join(f"{p['text']} (reach {p['reach']:.0%})" for p in islands) if islands
                 else "none (the paths are even: bsp or local SGD)"))
    st = args.spec.stragglers
    table = Table(title="compute speed per host (1 = a full share of this machine)"
                  + (f"; stragglers {st.slowdown:g}x for {st.fraction:.0%} of the time" if st else ""))
    for col in ("host", "configured", "measured", "matmuls/s"):
        table.add_column(col, justify="right")
    for r in speeds:
        table.add_row(f"node{r.host}", f"{r.configured_speed:.2f}", f"{r.measured_speed:.2f}", f"{r.rate:,.0f}")
    _console().print(table)
    return 0


def _cmd_cluster_sweep(args) -> int:
    from autosync.executor.emulate import can_emulate, sweep

    ok, why = can_emulate()
    if not ok:
        raise UserError(f"cannot sweep: {why}")
    removed = sweep(everything=args.all)
    print(f"removed {len(removed)} namespace(s) and cgroup(s)" + (": " + ", ".join(removed) if removed else ""))
    return 0


def _run_under_torchrun(args) -> int:
    """Inside torchrun: join the job's process group (env://) and run the trial here."""
    import os
    import time

    import torch.distributed as dist

    from autosync.executor.launch import RankContext
    from autosync.executor.measure import TrialSpec, run_trial, summarize

    from autosync.executor import device as dev

    strategy, batch_size = _validate_run(args)
    device = dev.default_device()
    dev.set_device(device)
    backend = dev.backend_for(device)
    dist.init_process_group(backend)
    ctx = RankContext(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
                      device=device, backend=backend)
    spec = TrialSpec(args.workload, strategy.canonical(), batch_size, args.warmup, args.steps, args.seed)
    t0 = time.monotonic()
    raw = run_trial(ctx, spec)
    if ctx.rank == 0:
        _print_result(summarize(spec, ctx.world_size, raw, time.monotonic() - t0), args.json,
                      f"{args.workload} x {ctx.world_size} ranks (torchrun, {backend}/{device}), strategy {strategy.hash}")
    dist.destroy_process_group()
    return 0


def _add_profile(sub) -> None:
    p = sub.add_parser(
        "profile", help="profile a workload and a cluster into profile.json",
        description="Profile a workload (per-parameter sizes, bucket layout, forward/backward/optimizer times, "
                    "gradient-ready times, FLOPs, peak memory) and a cluster (collective micro-benchmarks fitted "
                    "to alpha + bytes*beta) on an emulated cluster, or with --nominal from the spec's numbers alone.",
        epilog="example: autosync profile --workload bert-mini --cluster 2x1@1gbit --out profile.json")
    p.add_argument("--workload", "--model", dest="workload", required=True, metavar="W", help="workload, as for run")
    p.add_argument("--cluster", type=_cluster_spec, required=True, metavar="SPEC", help="cluster spec, e.g. 2x1@1gbit")
    p.add_argument("--batch-size", type=_positive_int, default=None, help="per-rank batch size (default: the workload's)")
    p.add_argument("--nominal", action="store_true",
                   help="do not measure the network: take the spec's bandwidth and latency (a cluster you lack)")
    p.add_argument("--out", default="profile.json", metavar="FILE", help="where to write the profile (default profile.json)")
    p.add_argument("--timeout", type=_positive_float, default=900.0, help="time limit in seconds (default 900)")
    p.add_argument("--unshaped", action="store_true",
                   help="measure on this host's loopback without shaping the links (no root needed); the results "
                        "are labelled unshaped and never mixed with shaped data")
    _add_in_job(p, "--timeout is then also the limit of each collective.")
    p.set_defaults(func=_job_aware(_cmd_profile))


def _cmd_profile(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from autosync import api

    with Console(stderr=True).status(f"profiling {args.workload} and {args.cluster}"):
        profile = api.profile(args.workload, args.cluster, batch_size=args.batch_size, nominal=args.nominal,
                              unshaped=args.unshaped, out=args.out, timeout=args.timeout, pool=args.pool)
    m = profile.model
    table = Table(title=f"profile of {args.workload} on {profile.context.label} -> {args.out}")
    table.add_column("what")
    table.add_column("value", justify="right")
    for what, value in [("parameters", f"{sum(p.numel for p in m.params) / 1e6:.2f} M in {len(m.params)} tensors"),
                        ("buckets at 25 MB", str(len(m.buckets(25)))),
                        ("forward / backward / optimizer", f"{m.forward_s * 1e3:.1f} / {m.backward_s * 1e3:.1f} / "
                                                           f"{m.optimizer_s * 1e3:.1f} ms"),
                        ("FLOPs per step", f"{m.flops_per_step / 1e9:.2f} G"),
                        ("peak memory", f"{m.peak_mem_mb:,.0f} MB")]:
        table.add_row(what, value)
    for scope, fits in profile.network.fits.items():
        f = fits["all_reduce"]
        table.add_row(f"all_reduce ({scope})", f"alpha {f.alpha_s * 1e6:,.0f} us, "
                                               f"{_bandwidth_text(f.bandwidth_bps, profile.network.world_size)}")
    _console().print(table)
    return 0


def _bandwidth_text(bps: float, world_size: int) -> str:
    """A fit with no time per byte has infinite bandwidth; at one rank that is because nothing is sent."""
    if bps != float("inf"):
        return f"{bps / 1e6:,.0f} Mbit/s"
    return "nothing sent (1 rank)" if world_size == 1 else "no time per byte measured"


def _add_collect(sub) -> None:
    p = sub.add_parser(
        "collect", help="measure baselines and random strategies into a dataset",
        description="Build the runtime dataset: for every (workload, cluster) context, profile once, then measure "
                    "every hand-crafted baseline and N random strategies on the emulated cluster, keeping the rank "
                    "processes alive across trials. Each result is appended at once; run the same command again "
                    "after an interruption and it skips what is stored.",
        epilog="example: autosync collect --workloads mlp ncf --clusters 2x1@100mbit 2x2@1gbit --per-context 20")
    p.add_argument("--workloads", nargs="+", required=True, metavar="W", help="workloads, as for run")
    p.add_argument("--clusters", nargs="+", required=True, type=_cluster_spec, metavar="SPEC", help="cluster specs")
    p.add_argument("--per-context", type=_non_negative_int, default=20,
                   help="random strategies per context, besides the baselines (default 20)")
    p.add_argument("--data", default="autosync-data", metavar="DIR", help="dataset directory (default ./autosync-data)")
    p.add_argument("--batch-size", type=_positive_int, default=None, help="per-rank batch size (default: the workload's)")
    p.add_argument("--timeout", type=_positive_float, default=90.0, help="time limit of each trial (default 90 s)")
    p.add_argument("--budget", type=_positive_float, default=4.0,
                   help="about how long the timed steps of one trial may take (default 4 s; at least 3 steps)")
    p.add_argument("--seed", type=_non_negative_int, default=0, help="seed of the random draws (default 0)")
    p.add_argument("--unshaped", action="store_true",
                   help="measure on this host's loopback without shaping the links (no root needed); the results "
                        "are labelled unshaped and never mixed with shaped data")
    p.add_argument("--beyond-range", action="store_true",
                   help="measure even a cluster beyond what this machine emulates faithfully (more than 2 ranks per "
                        "core, or links faster than it carries); results are labelled emulated-beyond")
    _add_in_job(p, "Give one --clusters spec; --timeout is then also the limit of each collective.")
    p.set_defaults(func=_job_aware(_cmd_collect))


def _cmd_collect(args) -> int:
    from autosync import api

    counts = api.collect(args.workloads, args.clusters, data=args.data, per_context=args.per_context,
                         timeout=args.timeout, budget=args.budget, batch_size=args.batch_size, seed=args.seed,
                         unshaped=args.unshaped, pool=args.pool, beyond_range=args.beyond_range)
    print(f"collect: {counts['ok']} ok, {counts['failed']} failed, {counts['timeout']} timed out, "
          f"{counts['skipped']} already stored -> {args.data}")
    return 0


def _add_efficiency(sub) -> None:
    p = sub.add_parser(
        "efficiency", help="measure what lossy strategies cost in convergence (statistical efficiency)",
        description="For the lossy strategies a dataset's trials hold, train each against the lossless DDP default "
                    "(paired: same initial weights, data order and learning rate) on loopback ranks, and store its "
                    "statistical efficiency (samples the default needs to reach a target evaluation loss / samples "
                    "it needs) in the dataset's efficiency table. The math does not depend on the network, so one "
                    "measurement serves every cluster with the same world size. Resumes: stored keys are skipped.",
        epilog="example: autosync efficiency --data autosync-data --workloads mlp --per-group 10")
    p.add_argument("--data", default="autosync-data", metavar="DIR", help="dataset directory (default ./autosync-data)")
    p.add_argument("--workloads", nargs="+", default=None, metavar="W", help="only these workloads (default: all)")
    p.add_argument("--worlds", nargs="+", type=_positive_int, default=None, metavar="N",
                   help="only these world sizes (default: all)")
    p.add_argument("--per-group", type=_positive_int, default=10,
                   help="lossy keys per (workload, batch, world) group (default 10)")
    p.add_argument("--seed", type=_non_negative_int, default=0, help="seed of the order of the keys (default 0)")
    p.add_argument("--timeout", type=_positive_float, default=1800.0, help="time limit of one training run (s)")
    p.add_argument("--again", action="store_true",
                   help="instead, measure again every stored row an older protocol measured differently (censored "
                        "at the horizon: it read 0 and is not reused), with its own strategy; --workloads and "
                        "--worlds still select, --per-group and --seed do not apply")
    p.set_defaults(func=_cmd_efficiency)


def _cmd_efficiency(args) -> int:
    from autosync.efficiency.collect import collect

    store = _data_store(args.data)
    store.read()  # a damaged dataset is reported before anything runs
    counts = collect(store, args.workloads, args.worlds, args.per_group, args.seed, args.timeout,
                                progress=lambda text: print(text, file=sys.stderr, flush=True),
                                again=args.again)
    print(f"efficiency: {counts['ok']} measured, {counts['failed'] + counts['timeout']} failed, {counts['flat']} with a "
          f"reference too flat to measure, {counts['stored']} already stored "
          f"-> {store.root}")
    return 0


SHIPPED_DATA = "shipped"


def _data_store(path: str):
    from autosync import datasets
    from autosync.datasets.store import DatasetStore

    if path == SHIPPED_DATA:
        path = str(datasets.SHIPPED_DATA)
    store = DatasetStore(path, create=False)
    return store


def _add_merge(sub) -> None:
    p = sub.add_parser(
        "merge", help="add the trials of other datasets to one",
        description="Add every trial, efficiency measurement and profile of the SOURCE datasets to --data (created "
                    "if missing). A row whose (context, strategy) is stored there already is kept as it is, so "
                    "merging the same source twice adds nothing. Use it to pool datasets collected on several "
                    "machines, or your own with the shipped one, before `autosync train`.",
        epilog="example: autosync merge shipped my-cluster-data --data pooled")
    p.add_argument("sources", nargs="+", metavar="SOURCE",
                   help="dataset directories to read ('shipped': the dataset shipped with autosync)")
    p.add_argument("--data", required=True, metavar="DIR", help="the dataset to add them to (created if missing)")
    p.set_defaults(func=_cmd_merge)


def _cmd_merge(args) -> int:
    from autosync.datasets.store import DatasetStore
    from autosync.outputs import check_output

    sources = [_data_store(s) for s in args.sources]
    for s in sources:
        s.read()   # a damaged source is reported before anything is written
    check_output(args.data, "dataset", directory=True)
    into = DatasetStore(args.data)
    into.read()
    for source, name in zip(sources, args.sources):
        n = into.merge(source)
        kept = f", {n['profiles_kept']} profiles differ (this dataset's kept)" if n["profiles_kept"] else ""
        print(f"merge: {name}: {n['trials']} trials, {n['efficiency']} efficiency rows, {n['profiles']} profiles "
              f"added{kept} -> {into.root}")
    return 0


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train the LightGBM cost model on a dataset",
                       description="Fit the cost model (LightGBM ranker or regressor on the speedup over the DDP "
                                   "default) to a dataset and save it as LightGBM text plus a JSON card. With "
                                   "--evaluate, the card carries its leave-one-workload/cluster-out metrics.")
    p.add_argument("--data", default=SHIPPED_DATA, metavar="DIR",
                   help="dataset directory (default: the dataset shipped with autosync)")
    p.add_argument("--out", default="autosync-model", metavar="DIR", help="output directory (default ./autosync-model)")
    p.add_argument("--kind", choices=["ranker", "regressor"], default="ranker", help="model kind (default ranker)")
    p.add_argument("--evaluate", action="store_true", help="also run the held-out evaluation and store it in the card")
    p.add_argument("--seed", type=_non_negative_int, default=0)
    p.set_defaults(func=_cmd_train)


def _cmd_train(args) -> int:
    from autosync.models.train import train_and_save
    from autosync.outputs import check_output

    check_output(args.out, "model", directory=True)
    store = _data_store(args.data)
    card = train_and_save(store, args.out, args.kind, args.evaluate, args.seed)
    print(f"trained {card['kind']} on {card['rows']} trials of {card['contexts']} contexts -> {args.out}")
    if "held_out" in card:
        for split, figures in card["held_out"].items():
            print(f"  leave-one-{split}-out: pairwise {figures['pairwise']:.3f}, top-1 regret {figures['regret']:.1%}")
    return 0


def _add_evaluate(sub) -> None:
    p = sub.add_parser("evaluate", help="held-out transfer evaluation of the cost model",
                       description="Leave-one-workload-out and leave-one-cluster-out evaluation: pairwise ranking "
                                   "accuracy, Kendall tau, top-1 regret and top-5 hit, for the LightGBM ranker, the "
                                   "regressor, the simulator alone and the ranker without simulator features.")
    p.add_argument("--data", default=SHIPPED_DATA, metavar="DIR", help="dataset directory (default: shipped)")
    p.add_argument("--split", choices=["workload", "cluster", "both"], default="both")
    p.add_argument("--plot", default="transfer.png", metavar="PNG", help="where to write the plot (default transfer.png)")
    p.add_argument("--markdown", metavar="FILE", help="also write the summary table as Markdown")
    p.add_argument("--seed", type=_non_negative_int, default=0)
    p.set_defaults(func=_cmd_evaluate)


def _cmd_evaluate(args) -> int:
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table

    from autosync.models import training, transfer
    from autosync.outputs import check_output

    check_output(args.plot, "plot")
    if args.markdown:
        check_output(args.markdown, "Markdown table")
    data = training.build(_data_store(args.data))
    splits = ("workload", "cluster") if args.split == "both" else (args.split,)
    with Console(stderr=True).status("training and scoring held-out groups"):
        report = transfer.evaluate(data, splits, seed=args.seed)
    table = Table(title=f"transfer to held-out groups ({len(data.frame)} trials, "
                        f"{data.frame.context_id.nunique()} contexts)")
    for col in ("split", "method", "pairwise acc.", "Kendall tau", "top-1 regret", "best in top 5"):
        table.add_column(col, justify="right")
    for _, r in report.summary.iterrows():
        table.add_row(f"leave-one-{r.split}-out", str(r.method), f"{r.pairwise:.3f}", f"{r.kendall_tau:.3f}",
                      f"{r.regret:.1%}", f"{r.top5_hit:.0%}")
    _console().print(table)
    transfer.plot(report, args.plot)
    if args.markdown:
        Path(args.markdown).write_text(report.to_markdown() + "\n")
    print(f"plot -> {args.plot}")
    return 0


def _storage_url(text: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        make_url(text)
    except Exception:  # noqa: BLE001 - sqlalchemy's ArgumentError and friends
        raise argparse.ArgumentTypeError(f"{text!r} is not a database URL (e.g. sqlite:///tune.db, "
                                         "postgresql://user@host:5432/db)") from None
    return text


def _add_tune(sub) -> None:
    p = sub.add_parser(
        "tune", help="find the best synchronization strategy (the main job)",
        description="Profile the workload and the cluster, let Optuna propose strategies scored by the LightGBM cost "
                    "model, measure the most promising ones for real on the emulated cluster (plus the DDP default and "
                    "the best-predicted hand-crafted baseline), and write the fastest measured strategy. It never "
                    "recommends something slower than the measured DDP default.",
        epilog="example: autosync tune --workload bert-mini --cluster 2x1@100mbit --measure 8 --out strategy.yaml")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--workload", metavar="W", help="a built-in workload, or 'pkg.module:function'")
    which.add_argument("--model", metavar="FN", help="your own workload: 'pkg.module:function' or 'file.py:function'")
    p.add_argument("--cluster", type=_cluster_spec, required=True, metavar="SPEC", help="cluster spec, e.g. 2x1@1gbit")
    p.add_argument("--measure", type=_non_negative_int, default=8,
                   help="strategies to measure for real, references included (default 8; 0 = predict only, "
                        "for a cluster you do not have)")
    p.add_argument("--objective", choices=["time-to-loss", "throughput", "lossless"], default=None,
                   help="what to optimize: time-to-loss (default) = samples/s x statistical efficiency, with the "
                        "efficiency of lossy finalists measured against the DDP default before they can be picked; "
                        "throughput = samples/s, blind to what lossy strategies cost in convergence; lossless = "
                        "samples/s among strategies that keep DDP's math")
    p.add_argument("--lossless", action="store_true", help="the same as --objective lossless")
    p.add_argument("--confirm-rounds", type=_non_negative_int, default=3,
                   help="re-measure the two best and the DDP default interleaved this many rounds and pick by "
                        "medians; a winner must beat the runner-up beyond the spread, else the simpler wins "
                        "(default 3; 0 = off)")
    p.add_argument("--storage", type=_storage_url, default="sqlite:///autosync-tune.db", metavar="URL",
                   help="Optuna storage; share a PostgreSQL URL between workers (default sqlite:///autosync-tune.db)")
    p.add_argument("--out", default="strategy.yaml", metavar="FILE", help="recommended strategy (default strategy.yaml)")
    p.add_argument("--plot", default=None, metavar="PNG", help="predicted vs measured plot (default: next to --out)")
    p.add_argument("--report", default=None, metavar="HTML",
                   help="self-contained report of the tune: context, pick, every measured strategy, plots "
                        "(default: next to --out, e.g. strategy.html)")
    p.add_argument("--data", default="autosync-data", metavar="DIR",
                   help="where measurements are appended (default ./autosync-data)")
    p.add_argument("--batch-size", type=_positive_int, default=None, help="per-rank batch size (default: the workload's)")
    p.add_argument("--candidates", type=_positive_int, default=500, help="candidates scored in the first round (default 500)")
    p.add_argument("--cost-model", metavar="DIR", default=None,
                   help="a model from `autosync train` (default: the shipped one, with calibrated 80%% intervals)")
    p.add_argument("--zero-shot", choices=["point", "lower"], default="point",
                   help="with --measure 0, pick by the point estimate (default) or by the lower bound of the "
                        "predicted 80%% interval (conservative; held out it reached a median 0.73 of a measured tune's "
                        "pick against the point's 0.98: bench/results/zero_shot.md); the output shows the other rule's "
                        "pick and every pick's interval")
    p.add_argument("--timeout", type=_positive_float, default=90.0,
                   help="time limit of each measured trial; all its ranks are killed past it (default 90 s)")
    p.add_argument("--profile", metavar="FILE", default=None,
                   help="a profile from `autosync profile` of this workload and cluster, used instead of profiling "
                        "(e.g. one measured in the real job by `autosync profile --in-job`, with --measure 0)")
    p.add_argument("--seed", type=_non_negative_int, default=0)
    p.add_argument("--unshaped", action="store_true",
                   help="measure on this host's loopback without shaping the links (no root needed); the results "
                        "are labelled unshaped and never mixed with shaped data")
    p.add_argument("--beyond-range", action="store_true",
                   help="measure even a cluster beyond what this machine emulates faithfully (more than 2 ranks per "
                        "core, or links faster than it carries); results are labelled emulated-beyond")
    _add_in_job(p, "A trial that fails ends the job so that torchrun --max-restarts starts it again with a fresh "
                   "process group; the search resumes from the dataset and the study, the failed trial stored "
                   "with its reason. --timeout is then also the limit of each collective.")
    p.set_defaults(func=_job_aware(_cmd_tune))


def _cmd_tune(args) -> int:
    import math
    from pathlib import Path

    from autosync.outputs import check_output

    check_output(args.out, "strategy file")     # before the imports of torch and the rest (seconds)
    plot_path = args.plot or str(Path(args.out).with_suffix(".png"))
    check_output(plot_path, "plot")
    report_path = args.report or str(Path(args.out).with_suffix(".html"))
    check_output(report_path, "report")
    if args.lossless and args.objective not in (None, "lossless"):
        raise UserError(f"--lossless contradicts --objective {args.objective}")

    from rich.console import Console
    from rich.table import Table

    from autosync.api import resolve_workload, run_tune
    from autosync.search.trials import TrialSettings
    from autosync.search.tuner import measured_rows, plot_predicted_vs_measured, strategy_file_text, uncertainty_lines

    objective = "lossless" if args.lossless else (args.objective or "time-to-loss")
    workload = resolve_workload(args.workload or args.model, batch_size=args.batch_size)
    err = Console(stderr=True)
    with err.status("starting") as status:
        def on_measured(m):
            err.print(f"  measured {m.source:<18} {m.strategy.hash}  {m.status:<7} {m.samples_per_s:10,.1f} samples/s"
                      + (f"  ({m.reason})" if m.reason else ""), markup=False, highlight=False)

        result, profile = run_tune(workload, args.cluster, args.measure, objective == "lossless", args.storage,
                                   args.data, args.batch_size, args.cost_model, args.seed, args.candidates,
                                   on_measured=on_measured, status=lambda text: status.update(text),
                                   profile_path=args.profile, settings=TrialSettings(timeout_s=args.timeout),
                                   unshaped=args.unshaped, objective=objective, confirm_rounds=args.confirm_rounds,
                                   pool=args.pool, beyond_range=args.beyond_range, zero_shot=args.zero_shot)
    Path(args.out).write_text(strategy_file_text(result, profile))
    console = _console()
    if result.measured:
        table = Table(title=f"measured on {profile.context.label} ({workload}, batch {profile.model.batch_size}/rank; "
                            f"objective {result.objective})")
        rows = measured_rows(result)
        peers = any(r["worker"] for r in rows)
        cols = ["source", "strategy", "lossy", "predicted", "status", "samples/s", "+-spread", "speedup",
                "efficiency", "time to target"] + (["by"] if peers else [])
        for col in cols:
            table.add_column(col, justify="right")
        for r in rows:
            pred = "-" if math.isnan(r["predicted_speedup"]) else f"{r['predicted_speedup']:.2f}x"
            if r["predicted_interval"] and pred != "-":
                pred += " [{:.2f}-{:.2f}]".format(*r["predicted_interval"])
            tt = ("-" if r["time_speedup"] is None else "never" if r["time_speedup"] == 0 else
                  f"{r['time_speedup']:.2f}x" + (" pred." if r["time_speedup_predicted"] else ""))
            cells = [r["source"], r["hash"][:8], "yes" if r["lossy"] == "lossy" else "no", pred, r["status"],
                     f"{r['samples_per_s']:,.1f}" if r["samples_per_s"] else "-",
                     f"{r['spread'] / 2:.0%} ({r['rounds']})" if r["spread"] is not None else "-",
                     f"{r['speedup']:.2f}x" if r["speedup"] else "-", r["efficiency_short"], tt]
            table.add_row(*cells, *([r["worker"] or "this run"] if peers else []))
        console.print(table)
        plot_predicted_vs_measured(result, plot_path)
        console.print(f"plot -> {plot_path}")
    from autosync.datasets.store import DatasetStore
    from autosync.present.report import write_report

    data = DatasetStore(args.data, create=False) if Path(args.data).is_dir() else None
    write_report(result, profile, report_path, data)
    console.print(f"report -> {report_path}")
    summary = f"recommended: {result.source} ({result.strategy.hash}, {'lossless' if result.strategy.is_lossless else 'LOSSY'})"
    if result.speedup_over_default:
        summary += f", {result.speedup_over_default:.2f}x the DDP default per step"
        tt = result.time_speedup(result.pick) if result.pick else None
        if result.pick and result.pick.lossy and tt:
            summary += f", {tt:.2f}x to the target loss (efficiency {result.pick.efficiency:.2f})"
    if result.speedup_over_best_baseline:
        summary += f", {result.speedup_over_best_baseline:.2f}x the best baseline ({result.best_baseline[0]})"
    if not math.isnan(result.predicted_speedup):
        summary += f"; predicted {result.predicted_speedup:.2f}x"
    console.print(summary, markup=False)
    for line in uncertainty_lines(result):
        console.print(line, markup=False)
    if result.why:
        console.print(f"why not the fastest per step: {result.why}", markup=False)
    if result.note:
        console.print(f"note: {result.note}", markup=False)
    if result.peer_measurements_seen:
        console.print(f"shared study: proposals learned from {result.peer_measurements_seen} measurement(s) of other "
                      f"workers", markup=False)
    console.print(f"search overhead {result.search_seconds:.1f} s for {result.candidates_scored} candidates; "
                  f"strategy -> {args.out}", markup=False)
    return 0


def _bench_dir():
    from pathlib import Path

    return Path(__file__).resolve().parent.parent / "bench"


def _add_bench(sub) -> None:
    p = sub.add_parser(
        "bench", help="run one of the benchmarks of a source checkout (bench/*.py)",
        description="Run a benchmark script from the source checkout's bench/ folder; it prints its table and "
                    "writes it to bench/results/. Arguments after the name go to the script (try NAME --help).",
        epilog="example: autosync bench hook_overhead   |   autosync bench --list")
    p.add_argument("name", nargs="?", metavar="NAME", help="benchmark name (a bench/NAME.py)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark")
    p.add_argument("--list", action="store_true", help="list the benchmarks and what they measure")
    p.set_defaults(func=_cmd_bench)


def _cmd_bench(args) -> int:
    import ast
    import subprocess

    folder = _bench_dir()
    if not folder.is_dir():
        raise UserError("the benchmarks live in bench/ of a source checkout, which this installation does not have")
    scripts = {p.stem: p for p in sorted(folder.glob("*.py")) if not p.name.startswith("_")}  # _*.py: helpers
    if args.list or not args.name:
        for name, path in scripts.items():
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            print(f"{name:<22} {doc.splitlines()[0] if doc else ''}")
        return 0
    if args.name not in scripts:
        raise UserError(f"unknown benchmark {args.name!r}; choose from {', '.join(scripts)}")
    return subprocess.call([sys.executable, str(scripts[args.name]), *args.args])


def _add_workloads(sub) -> None:
    p = sub.add_parser("workloads", help="list the built-in workloads",
                       description="List the built-in workloads: name, default batch size per rank and what each "
                                   "trains (architectures built from configs, learnable synthetic tasks). "
                                   "Any command's --workload also takes 'pkg.module:function' or "
                                   "'path/file.py:function' returning (model, make_batch).",
                       epilog="example: autosync workloads")
    p.set_defaults(func=_cmd_workloads)


def _cmd_workloads(args) -> int:
    from autosync.workloads import BUILTINS

    for name, info in BUILTINS.items():
        print(f"{name:<14} batch {info.batch_size:<5} {' '.join(info.description.split())}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="autosync", description="Learn how to synchronize gradients in data-parallel PyTorch "
                                                   "training: profile, propose, predict, measure, recommend.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    _add_run(sub)
    _add_workloads(sub)
    _add_cluster(sub)
    _add_profile(sub)
    _add_collect(sub)
    _add_efficiency(sub)
    _add_merge(sub)
    _add_train(sub)
    _add_evaluate(sub)
    _add_tune(sub)
    _add_bench(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, sigterm_as_interrupt)  # SIGTERM cleans up like Ctrl-C: context managers run
    try:
        args = build_parser().parse_args(argv)
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                            format="%(levelname)s %(name)s: %(message)s")
        return args.func(args)
    except UserError as e:
        print(f"autosync: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a file that could not be read or written, found late: still one line
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        print(f"autosync: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("autosync: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
