"""The ``autosync`` command: a thin layer over the Python API (:mod:`autosync.api`).

Each command is one function that takes the parsed options, calls the API and prints through
:mod:`autosync.present`; :func:`command` declares its options beside it (shared ones by name from
:data:`SHARED`, ``autosync tune``'s from :class:`~autosync.search.config.TuneConfig`'s fields). Every
error a user can cause ends with one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import functools
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


def _checked(check):
    """An argparse type from a check that raises UserError (its message becomes argparse's)."""
    def parse(text: str):
        try:
            return check(text) or text
        except UserError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse


def _cluster(text: str):
    from autosync.cluster import parse_cluster

    return parse_cluster(text)


def _storage(text: str):
    from autosync.search.config import check_storage_url

    check_storage_url(text)


TYPES = {"positive_int": _number(int, 0, True, "a positive integer"),
         "nonneg_int": _number(int, 0, False, "an integer >= 0"),
         "positive_float": _number(float, 0.0, True, "a positive number"),
         "cluster": _checked(_cluster), "storage": _checked(_storage), "path": None, "dir": None, "str": None}
UNSHAPED = ("measure on this host's loopback without shaping the links (no root needed); the results are labelled "
            "unshaped and never mixed with shaped data")
BEYOND = ("measure even a cluster beyond what this machine emulates faithfully (more than 2 ranks per core, or links "
          "faster than it carries); results are labelled emulated-beyond")
IN_JOB = ("run inside the distributed job this command was started in (torchrun --nnodes N --nproc-per-node G -m "
          "autosync.cli ... --in-job): measure on the job's own ranks, devices and network instead of an emulated "
          "cluster; rank 0 writes every file, the other ranks serve it; --cluster gives the job's shape (hosts x "
          "ranks). ")
#: options several commands share, by name: (flags, type, default, help); a command may give its own help
SHARED = {
    "workload": (("--workload", "--model"), "str", None, "built-in workload (list: autosync workloads) or "
                 "'pkg.module:function' / 'path/file.py:function'", {"dest": "workload", "required": True,
                                                                       "metavar": "W"}),
    "cluster": (("--cluster",), "cluster", None, "cluster spec, e.g. 2x1@1gbit", {"required": True}),
    "batch-size": (("--batch-size",), "positive_int", None, "per-rank batch size (default: the workload's)"),
    "seed": (("--seed",), "nonneg_int", 0, "seed (default 0)"),
    "data": (("--data",), "dir", "autosync-data", "dataset directory (default ./autosync-data)"),
    "unshaped": (("--unshaped",), "flag", False, UNSHAPED),
    "beyond-range": (("--beyond-range",), "flag", False, BEYOND),
    "json": (("--json",), "flag", False, "print the measurements as JSON"),
    "backend": (("--backend",), ("nccl", "gloo"), None, "with --in-job: the process group's backend (default: nccl "
                "on GPUs, gloo on CPUs)"),
}
COMMANDS: list[tuple[str, object, str, str, str | None, tuple]] = []


def command(name: str, help: str, description: str, epilog: str | None = None, *options):
    """Declare a command. ``options``: a SHARED name (``"seed"``, or ``("seed", "its own help")``), or
    ``(flags, type, default, help[, extra argparse keywords])`` with type a TYPES name, ``"flag"`` or choices."""
    def declare(func):
        COMMANDS.append((name, func, help, description, epilog, options))
        return func
    return declare


def _add_option(p, option) -> None:
    if isinstance(option, str) or (isinstance(option, tuple) and len(option) <= 3 and option[0] in SHARED):
        name, own, more = (option, None, {}) if isinstance(option, str) else (*option, {})[:3]
        flags, kind, default, help_, *extra = SHARED[name]
        option = (flags, kind, default, own or help_, {**(extra[0] if extra else {}), **more})
    flags, kind, default, help_, *extra = option
    flags = (flags,) if isinstance(flags, str) else flags
    kw = dict(help=help_, **(extra[0] if extra else {}))
    if kind == "flag":
        kw.update(action="store_true")
    elif isinstance(kind, tuple):
        kw.update(choices=kind, default=default)
    else:
        kw.update(type=TYPES[kind], default=default)
        if flags[0].startswith("--") and "metavar" not in kw:
            kw["metavar"] = {"cluster": "SPEC", "path": "FILE", "dir": "DIR", "storage": "URL"}.get(
                kind, flags[0][2:].upper().replace("-", "_"))
    p.add_argument(*flags, **kw)


def _job_aware(cmd, always_in_torchrun: bool = False):
    """With --in-job (or, ``always_in_torchrun``, whenever started by torchrun), join the job: rank 0 runs ``cmd``
    with ``args.pool`` (the job's ranks); the others serve it (:func:`autosync.api.in_job`)."""
    @functools.wraps(cmd)
    def wrapped(args) -> int:
        from autosync.executor.launch import in_torchrun

        args.pool = None
        if not (getattr(args, "in_job", False) or (always_in_torchrun and in_torchrun())):
            if getattr(args, "backend", None):
                raise UserError("--backend applies only with --in-job (emulated clusters run gloo on CPUs)")
            return cmd(args)
        for flag in ("unshaped", "nominal"):
            if getattr(args, flag, False):
                raise UserError(f"--in-job measures the job's own network; --{flag} does not apply")
        from autosync import api

        return api.in_job(lambda pool: cmd(argparse.Namespace(**{**vars(args), "pool": pool})),
                          timeout=args.timeout, backend=getattr(args, "backend", None))
    return wrapped


# --- measuring ------------------------------------------------------------------------------------

@command("run", "measure one strategy on real ranks",
         "Train a workload for a few steps with a strategy (default: PyTorch DDP's default) on N local gloo ranks, "
         "and report throughput, median step time, its coefficient of variation and peak memory. Under torchrun it "
         "runs on the job's ranks instead of spawning its own.",
         "example: autosync run --workload bert-mini --nproc 2 --strategy strategy.yaml",
         ("workload", None), ("--strategy", "path", None, "strategy YAML or JSON (default: the DDP default)"),
         ("--nproc", "positive_int", None, "number of local ranks (default 2)"),
         ("cluster", "run on an emulated cluster, e.g. 2x1@100mbit (world size from the spec; needs root)",
          {"required": False}),
         ("--ranks-per-host", "positive_int", None, "ranks that share a host, for hierarchical plans and local SGD "
          "(default: all)"), "batch-size", ("--steps", "positive_int", 10, "timed steps (default 10)"),
         ("--warmup", "nonneg_int", 3, "untimed warm-up steps (default 3)"), ("seed", "model and data seed (default 0)"),
         ("--timeout", "positive_float", 300.0, "time limit in seconds of the trial, and of its ranks' start (which has "
          "at most 120 s); all ranks are killed when it runs out (default 300)"),
         ("json", "print the TrialResult as JSON instead of a table"), "unshaped")
def _cmd_run(args) -> int:
    from autosync import api
    from autosync.present.tables import print_trial

    result, where = api.run(args.workload, strategy=args.strategy, cluster=args.cluster, nproc=args.nproc,
                            ranks_per_host=args.ranks_per_host, batch_size=args.batch_size, steps=args.steps,
                            warmup=args.warmup, seed=args.seed, timeout=args.timeout, unshaped=args.unshaped,
                            pool=args.pool)
    print_trial(result, args.json, f"{args.workload} on {where}, strategy {result.strategy_hash}", where)
    return 0 if result.ok else 1


@command("workloads", "list the built-in workloads",
         "List the built-in workloads: name, default batch size per rank and what each trains (architectures built "
         "from configs, learnable synthetic tasks). Any command's --workload also takes 'pkg.module:function' or "
         "'path/file.py:function' returning (model, make_batch).", "example: autosync workloads")
def _cmd_workloads(args) -> int:
    from autosync.workloads import BUILTINS

    for name, info in BUILTINS.items():
        print(f"{name:<14} batch {info.batch_size:<5} {' '.join(info.description.split())}")
    return 0


@command("cluster check", "bring a cluster up, measure every host link and host speed, tear it down",
         "Bring SPEC up, measure each host link with torch.distributed point-to-point transfers and a ping-pong, "
         "print configured vs measured bandwidth and latency; then measure each host's compute speed (matrix "
         "products on all ranks at once, with the CPU limits lifted and applied).",
         "example: autosync cluster check '2x1@1gbit;node1=100mbit;node1=cpu:0.5'",
         ("spec", "cluster", None, "NODESxRANKS@BANDWIDTH[,LATENCY][;nodeK=...]", {"metavar": "SPEC"}),
         ("--seconds", "positive_float", 0.5, "length of each transfer (default 0.5 s)"),
         ("--compute-seconds", "positive_float", 2.0, "length of each compute measurement (default 2 s; give "
          "stragglers several slices)"), "json")
def _cmd_cluster_check(args) -> int:
    import json

    from autosync import api
    from autosync.present.tables import print_cluster_check

    check = api.check_cluster(args.spec, seconds=args.seconds, compute_seconds=args.compute_seconds)
    print(json.dumps(check.to_dict())) if args.json else print_cluster_check(check)
    return 0


@command("cluster sweep", "remove namespaces left by dead autosync runs",
         "Delete the network namespaces (and their veths) of autosync runs whose process is gone. --all deletes "
         "those of live runs too.", None,
         ("--all", "flag", False, "also remove the namespaces of running autosync processes"))
def _cmd_cluster_sweep(args) -> int:
    from autosync import api

    removed = api.sweep(everything=args.all)
    print(f"removed {len(removed)} namespace(s) and cgroup(s)" + (": " + ", ".join(removed) if removed else ""))
    return 0


@command("profile", "profile a workload and a cluster into profile.json",
         "Profile a workload (per-parameter sizes, bucket layout, forward/backward/optimizer times, gradient-ready "
         "times, FLOPs, peak memory) and a cluster (collective micro-benchmarks fitted to alpha + bytes*beta) on an "
         "emulated cluster, or with --nominal from the spec's numbers alone.",
         "example: autosync profile --workload bert-mini --cluster 2x1@1gbit --out profile.json",
         ("workload", "workload, as for run"), "cluster", "batch-size",
         ("--nominal", "flag", False, "do not measure the network: take the spec's bandwidth and latency (a cluster "
          "you lack)"), ("--out", "path", "profile.json", "where to write the profile (default profile.json)"),
         ("--timeout", "positive_float", 900.0, "time limit in seconds (default 900)"), "unshaped",
         ("--in-job", "flag", False, IN_JOB + "--timeout is then also the limit of each collective."), "backend")
def _cmd_profile(args) -> int:
    from autosync import api
    from autosync.present.tables import console, print_profile

    with console(stderr=True).status(f"profiling {args.workload} and {args.cluster}"):
        profile = api.profile(args.workload, args.cluster, batch_size=args.batch_size, nominal=args.nominal,
                              unshaped=args.unshaped, out=args.out, timeout=args.timeout, pool=args.pool)
    print_profile(profile, args.workload, args.out)
    return 0


@command("collect", "measure baselines and random strategies into a dataset",
         "Build the runtime dataset: for every (workload, cluster) context, profile once, then measure every "
         "hand-crafted baseline and N random strategies on the emulated cluster, keeping the rank processes alive "
         "across trials. Each result is appended at once; run the same command again after an interruption and it "
         "skips what is stored.",
         "example: autosync collect --workloads mlp ncf --clusters 2x1@100mbit 2x2@1gbit --per-context 20",
         ("--workloads", "str", None, "workloads, as for run", {"nargs": "+", "required": True, "metavar": "W"}),
         ("--clusters", "cluster", None, "cluster specs", {"nargs": "+", "required": True}),
         ("--per-context", "nonneg_int", 20, "random strategies per context, besides the baselines (default 20)"),
         "data", "batch-size", ("--timeout", "positive_float", 90.0, "time limit of each trial (default 90 s)"),
         ("--budget", "positive_float", 4.0, "about how long the timed steps of one trial may take (default 4 s; at "
          "least 3 steps)"), ("seed", "seed of the random draws (default 0)"), "unshaped", "beyond-range",
         ("--in-job", "flag", False, IN_JOB + "Give one --clusters spec; --timeout is then also the limit of each "
          "collective."), "backend")
def _cmd_collect(args) -> int:
    from autosync import api

    counts = api.collect(args.workloads, args.clusters, data=args.data, per_context=args.per_context,
                         timeout=args.timeout, budget=args.budget, batch_size=args.batch_size, seed=args.seed,
                         unshaped=args.unshaped, pool=args.pool, beyond_range=args.beyond_range)
    print(f"collect: {counts['ok']} ok, {counts['failed']} failed, {counts['timeout']} timed out, "
          f"{counts['skipped']} already stored -> {args.data}")
    return 0


@command("efficiency", "measure what lossy strategies cost in convergence (statistical efficiency)",
         "For the lossy strategies a dataset's trials hold, train each against the lossless DDP default (paired: "
         "same initial weights, data order and learning rate) on loopback ranks, and store its statistical "
         "efficiency (samples the default needs to reach a target evaluation loss / samples it needs) in the "
         "dataset's efficiency table. The math does not depend on the network, so one measurement serves every "
         "cluster with the same world size. Resumes: stored keys are skipped.",
         "example: autosync efficiency --data autosync-data --workloads mlp --per-group 10",
         "data", ("--workloads", "str", None, "only these workloads (default: all)", {"nargs": "+", "metavar": "W"}),
         ("--worlds", "positive_int", None, "only these world sizes (default: all)", {"nargs": "+", "metavar": "N"}),
         ("--per-group", "positive_int", 10, "lossy keys per (workload, batch, world) group (default 10)"),
         ("seed", "seed of the order of the keys (default 0)"),
         ("--timeout", "positive_float", 1800.0, "time limit of one training run (s)"),
         ("--again", "flag", False, "instead, measure again every stored row an older protocol measured differently "
          "(censored at the horizon: it read 0 and is not reused), with its own strategy; --workloads and --worlds "
          "still select, --per-group and --seed do not apply"))
def _cmd_efficiency(args) -> int:
    from autosync import api

    counts, root = api.efficiency(args.data, args.workloads, args.worlds, args.per_group, args.seed, args.timeout,
                                  args.again, progress=lambda text: print(text, file=sys.stderr, flush=True))
    print(f"efficiency: {counts['ok']} measured, {counts['failed'] + counts['timeout']} failed, {counts['flat']} with "
          f"a reference too flat to measure, {counts['stored']} already stored -> {root}")
    return 0


# --- data and models ------------------------------------------------------------------------------

@command("merge", "add the trials of other datasets to one",
         "Add every trial, efficiency measurement and profile of the SOURCE datasets to --data (created if missing). "
         "A row whose (context, strategy) is stored there already is kept as it is, so merging the same source twice "
         "adds nothing. Use it to pool datasets collected on several machines, or your own with the shipped one, "
         "before `autosync train`.", "example: autosync merge shipped my-cluster-data --data pooled",
         ("sources", "str", None, "dataset directories to read ('shipped': the dataset shipped with autosync)",
          {"nargs": "+", "metavar": "SOURCE"}),
         ("--data", "str", None, "the dataset to add them to (created if missing)", {"required": True, "metavar": "DIR"}))
def _cmd_merge(args) -> int:
    from autosync import api

    for name, n in zip(args.sources, api.merge(args.sources, args.data)):
        kept = f", {n['profiles_kept']} profiles differ (this dataset's kept)" if n["profiles_kept"] else ""
        print(f"merge: {name}: {n['trials']} trials, {n['efficiency']} efficiency rows, {n['profiles']} profiles "
              f"added{kept} -> {args.data}")
    return 0


@command("train", "train the LightGBM cost model on a dataset",
         "Fit the cost model (LightGBM ranker or regressor on the speedup over the DDP default) to a dataset and save "
         "it as LightGBM text plus a JSON card. With --evaluate, the card carries its leave-one-workload/cluster-out "
         "metrics.", None,
         ("--data", "str", "shipped", "dataset directory (default: the dataset shipped with autosync)"),
         ("--out", "str", "autosync-model", "output directory (default ./autosync-model)", {"metavar": "DIR"}),
         ("--kind", ("ranker", "regressor"), "ranker", "model kind (default ranker)"),
         ("--evaluate", "flag", False, "also run the held-out evaluation and store it in the card"), "seed")
def _cmd_train(args) -> int:
    from autosync import api

    card = api.train(args.data, args.out, args.kind, args.evaluate, args.seed)
    print(f"trained {card['kind']} on {card['rows']} trials of {card['contexts']} contexts -> {args.out}")
    for split, figures in card.get("held_out", {}).items():
        print(f"  leave-one-{split}-out: pairwise {figures['pairwise']:.3f}, top-1 regret {figures['regret']:.1%}")
    return 0


@command("evaluate", "held-out transfer evaluation of the cost model",
         "Leave-one-workload-out and leave-one-cluster-out evaluation: pairwise ranking accuracy, Kendall tau, top-1 "
         "regret and top-5 hit, for the LightGBM ranker, the regressor, the simulator alone and the ranker without "
         "simulator features.", None,
         ("--data", "str", "shipped", "dataset directory (default: shipped)"),
         ("--split", ("workload", "cluster", "both"), "both", "which groups to hold out (default both)"),
         ("--plot", "str", "transfer.png", "where to write the plot (default transfer.png)", {"metavar": "PNG"}),
         ("--markdown", "path", None, "also write the summary table as Markdown"), "seed")
def _cmd_evaluate(args) -> int:
    from autosync import api
    from autosync.present.tables import console, print_transfer

    with console(stderr=True).status("training and scoring held-out groups"):
        report, data = api.evaluate(args.data, ("workload", "cluster") if args.split == "both" else (args.split,),
                                    args.seed, plot=args.plot, markdown=args.markdown)
    print_transfer(report, data)
    print(f"plot -> {args.plot}")
    return 0


# --- tune, bench ----------------------------------------------------------------------------------

def _tune_options() -> list:
    """``autosync tune``'s options: the TuneConfig's fields (their defaults and help are written there), and the
    command's own."""
    from dataclasses import fields

    from autosync.search.config import TuneConfig

    out = []
    for f in fields(TuneConfig):
        if f.metadata:   # the objective defaults to None here, so that --lossless can tell it was not given
            out.append((f.metadata["flag"], f.metadata["kind"], None if f.name == "objective" else f.default,
                        f.metadata["help"], {"dest": f.name}))
    return out + [("--lossless", "flag", False, "the same as --objective lossless"),
                  ("--out", "path", "strategy.yaml", "recommended strategy (default strategy.yaml)"),
                  ("--plot", "str", None, "predicted vs measured plot (default: next to --out)", {"metavar": "PNG"}),
                  ("--report", "str", None, "self-contained report of the tune: context, pick, every measured strategy, "
                   "plots (default: next to --out, e.g. strategy.html)", {"metavar": "HTML"}),
                  ("--in-job", "flag", False, IN_JOB + "A trial that fails ends the job so that torchrun "
                   "--max-restarts starts it again with a fresh process group; the search resumes from the dataset "
                   "and the study, the failed trial stored with its reason. --timeout is then also the limit of each "
                   "collective."), "backend"]


@command("tune", "find the best synchronization strategy (the main job)",
         "Profile the workload and the cluster, let Optuna propose strategies scored by the LightGBM cost model, "
         "measure the most promising ones for real on the emulated cluster (plus the DDP default and the "
         "best-predicted hand-crafted baseline), and write the fastest measured strategy. It never recommends "
         "something slower than the measured DDP default.",
         "example: autosync tune --workload bert-mini --cluster 2x1@100mbit --measure 8 --out strategy.yaml",
         "cluster", _tune_options)
def _cmd_tune(args) -> int:
    from pathlib import Path

    from autosync.outputs import check_output

    check_output(args.out, "strategy file")     # before the imports of torch and the rest (seconds)
    plot_path = args.plot or str(Path(args.out).with_suffix(".png"))
    report_path = args.report or str(Path(args.out).with_suffix(".html"))
    check_output(plot_path, "plot")
    check_output(report_path, "report")
    from autosync import api
    from autosync.present.tables import console, print_tune
    from autosync.search.config import TuneConfig

    config = TuneConfig.build(lossless=args.lossless, **{name: getattr(args, name) for name, _ in TuneConfig.options()})
    workload = api.resolve_workload(args.workload or args.model, batch_size=args.batch_size)
    err = console(stderr=True)
    with err.status("starting") as status:
        def on_measured(m):
            err.print(f"  measured {m.source:<18} {m.strategy.hash}  {m.status:<7} {m.samples_per_s:10,.1f} samples/s"
                      + (f"  ({m.reason})" if m.reason else ""), markup=False, highlight=False)

        result, profile = api.run_tune(workload, args.cluster, config, on_measured=on_measured,
                                       status=lambda text: status.update(text), pool=args.pool)
    print_tune(result, profile, workload, args.out, plot_path, report_path, args.data)
    return 0


@command("bench", "run one of the benchmarks of a source checkout (bench/*.py)",
         "Run a benchmark script from the source checkout's bench/ folder; it prints its table and writes it to "
         "bench/results/. Arguments after the name go to the script (try NAME --help).",
         "example: autosync bench hook_overhead   |   autosync bench --list",
         ("name", "str", None, "benchmark name (a bench/NAME.py)", {"nargs": "?", "metavar": "NAME"}),
         ("args", "str", None, "arguments for the benchmark", {"nargs": argparse.REMAINDER}),
         ("--list", "flag", False, "list the benchmarks and what they measure"))
def _cmd_bench(args) -> int:
    import subprocess

    from autosync import api

    scripts = api.benchmarks()
    if args.list or not args.name:
        for name, (_, doc) in scripts.items():
            print(f"{name:<22} {doc}")
        return 0
    if args.name not in scripts:
        raise UserError(f"unknown benchmark {args.name!r}; choose from {', '.join(scripts)}")
    return subprocess.call([sys.executable, str(scripts[args.name][0]), *args.args])


JOB_AWARE = {"run": True, "profile": False, "collect": False, "tune": False}   # True: also whenever under torchrun


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="autosync", description="Learn how to synchronize gradients in data-parallel PyTorch "
                                                   "training: profile, propose, predict, measure, recommend.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    groups = {"cluster": ("emulated clusters: check links, sweep leftovers",
                          "Emulated clusters on this machine (network namespaces + tc; needs root).")}
    for name, func, help_, description, epilog, options in COMMANDS:
        where, _, action = name.rpartition(" ")
        if where and isinstance(groups[where], tuple):
            g = sub.add_parser(where, help=groups[where][0], description=groups[where][1])
            groups[where] = g.add_subparsers(dest=f"{where}_command", metavar="ACTION", parser_class=_Parser)
            groups[where].required = True
        p = (groups[where] if where else sub).add_parser(action, help=help_, description=description, epilog=epilog)
        if name == "tune":   # a built-in workload or the user's own: one of them
            which = p.add_mutually_exclusive_group(required=True)
            which.add_argument("--workload", metavar="W", help="a built-in workload, or 'pkg.module:function'")
            which.add_argument("--model", metavar="FN", help="your own workload: 'pkg.module:function' or "
                               "'file.py:function'")
        for option in options:
            for o in option() if callable(option) else [option]:
                _add_option(p, o)
        p.set_defaults(func=_job_aware(func, JOB_AWARE[name]) if name in JOB_AWARE else func)
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
