"""The ``autosync`` command: a thin layer over the Python API (:mod:`autosync.api`).

Each command is one handler (:data:`HANDLERS`) that takes the parsed options, calls the API and prints through
:mod:`autosync.present`; what each command says and takes (help, description, options) is declared in
:mod:`autosync.present.commands`, ``autosync tune``'s options by :class:`~autosync.search.config.TuneConfig`'s
fields. Every error a user can cause ends with one line on stderr and exit status 2.
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
def _add_option(p, option) -> None:
    """One option as :mod:`autosync.present.commands` declares it."""
    from autosync.present.commands import SHARED

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

        timeout = args.trial_timeout_s if hasattr(args, "trial_timeout_s") else args.timeout   # tune's --timeout
        return api.in_job(lambda pool: cmd(argparse.Namespace(**{**vars(args), "pool": pool})),
                          timeout=timeout, backend=getattr(args, "backend", None))
    return wrapped


# --- measuring ------------------------------------------------------------------------------------

def _cmd_run(args) -> int:
    from autosync import api
    from autosync.present.tables import print_trial

    if args.strategy == "auto":
        from autosync.present.tables import print_auto

        summary, where = api.run_auto(args.workload, cluster=args.cluster, nproc=args.nproc,
                                      ranks_per_host=args.ranks_per_host, batch_size=args.batch_size,
                                      steps=args.steps, seed=args.seed, timeout=args.timeout,
                                      unshaped=args.unshaped, pool=args.pool, out=args.out,
                                      budget=args.explore_budget, objective=args.objective,
                                      lossy_after=args.lossy_after, guard=not args.no_guard)
        print_auto(summary, args.json, f"{args.workload} on {where}, strategy auto")
        return 0 if summary["committed"] else 1

    result, where = api.run(args.workload, strategy=args.strategy, cluster=args.cluster, nproc=args.nproc,
                            ranks_per_host=args.ranks_per_host, batch_size=args.batch_size, steps=args.steps,
                            warmup=args.warmup, seed=args.seed, timeout=args.timeout, unshaped=args.unshaped,
                            pool=args.pool)
    print_trial(result, args.json, f"{args.workload} on {where}, strategy {result.strategy_hash}", where)
    return 0 if result.ok else 1


def _cmd_workloads(args) -> int:
    from autosync.workloads import BUILTINS

    for name, info in BUILTINS.items():
        print(f"{name:<14} batch {info.batch_size:<5} {' '.join(info.description.split())}")
    return 0


def _cmd_cluster_check(args) -> int:
    import json

    from autosync import api
    from autosync.present.tables import print_cluster_check

    check = api.check_cluster(args.spec, seconds=args.seconds, compute_seconds=args.compute_seconds)
    print(json.dumps(check.to_dict())) if args.json else print_cluster_check(check)
    return 0


def _cmd_cluster_sweep(args) -> int:
    from autosync import api

    removed = api.sweep(everything=args.all)
    print(f"removed {len(removed)} namespace(s) and cgroup(s)" + (": " + ", ".join(removed) if removed else ""))
    return 0


def _cmd_profile(args) -> int:
    from autosync import api
    from autosync.present.tables import console, print_profile

    with console(stderr=True).status(f"profiling {args.workload} and {args.cluster}"):
        profile = api.profile(args.workload, args.cluster, batch_size=args.batch_size, nominal=args.nominal,
                              unshaped=args.unshaped, out=args.out, timeout=args.timeout, pool=args.pool)
    print_profile(profile, args.workload, args.out)
    return 0


def _cmd_collect(args) -> int:
    from autosync import api

    counts = api.collect(args.workloads, args.clusters, data=args.data, per_context=args.per_context,
                         timeout=args.timeout, budget=args.budget, batch_size=args.batch_size, seed=args.seed,
                         unshaped=args.unshaped, pool=args.pool, beyond_range=args.beyond_range,
                         modes=args.modes)
    print(f"collect: {counts['ok']} ok, {counts['failed']} failed, {counts['timeout']} timed out, "
          f"{counts['skipped']} already stored -> {args.data}")
    return 0


def _cmd_efficiency(args) -> int:
    from autosync import api

    counts, root = api.efficiency(args.data, args.workloads, args.worlds, args.per_group, args.seed, args.timeout,
                                  args.again, progress=lambda text: print(text, file=sys.stderr, flush=True),
                                  modes=args.modes)
    print(f"efficiency: {counts['ok']} measured, {counts['failed'] + counts['timeout']} failed, {counts['flat']} with "
          f"a reference too flat to measure, {counts['stored']} already stored"
          + (f", {counts['rekeyed']} stored under an older key format replaced by the current row"
             if counts["rekeyed"] else "") + f" -> {root}")
    return 0


# --- data and models ------------------------------------------------------------------------------

def _cmd_merge(args) -> int:
    from autosync import api

    for name, n in zip(args.sources, api.merge(args.sources, args.data)):
        kept = f", {n['profiles_kept']} profiles differ (this dataset's kept)" if n["profiles_kept"] else ""
        print(f"merge: {name}: {n['trials']} trials, {n['efficiency']} efficiency rows, {n['profiles']} profiles "
              f"added{kept} -> {args.data}")
    return 0


def _cmd_train(args) -> int:
    from autosync import api

    card = api.train(args.data, args.out, args.kind, args.evaluate, args.seed)
    print(f"trained {card['kind']} on {card['rows']} trials of {card['contexts']} contexts -> {args.out}")
    for split, figures in card.get("held_out", {}).items():
        print(f"  leave-one-{split}-out: pairwise {figures['pairwise']:.3f}, top-1 regret {figures['regret']:.1%}")
    return 0


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

def _cmd_tune(args) -> int:
    from pathlib import Path

    from autosync.outputs import check_output

    if args.cluster is None and not args.in_job:
        raise UserError("tune needs --cluster (or --in-job, which takes the job's own shape and measures its links)")
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


HANDLERS = {"run": _cmd_run, "workloads": _cmd_workloads, "cluster check": _cmd_cluster_check,
            "cluster sweep": _cmd_cluster_sweep, "profile": _cmd_profile, "collect": _cmd_collect,
            "efficiency": _cmd_efficiency, "merge": _cmd_merge, "train": _cmd_train, "evaluate": _cmd_evaluate,
            "tune": _cmd_tune, "bench": _cmd_bench}
JOB_AWARE = {"run": True, "profile": False, "collect": False, "tune": False}   # True: also whenever under torchrun


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="autosync", description="Learn how to synchronize gradients in data-parallel PyTorch "
                                                   "training: profile, propose, predict, measure, recommend.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    groups = {"cluster": ("emulated clusters: check links, sweep leftovers",
                          "Emulated clusters on this machine (network namespaces + tc; needs root).")}
    from autosync.present.commands import COMMANDS

    for name, (help_, description, epilog, *options) in COMMANDS.items():
        func = HANDLERS[name]
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
