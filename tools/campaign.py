"""Dataset v2's collection campaign: which contexts, in which order, how many trials. It resumes.

    python tools/campaign.py [--data DIR] [--latency | --diloco] [--stop-after MINUTES] [--passes 1 2 3]
                             [--dry-run | --status]

Contexts: every built-in workload (:data:`autosync.workloads.BUILTINS`) on every cluster of
:data:`CLUSTERS`, less those already in the shipped dataset (v1) and those :func:`too_slow` for this
machine. Each context gets the hand-crafted baselines and then random strategies from the full space
(sync modes, sfb, selective and ZeRO included: :mod:`autosync.search.space`), measured by
:func:`autosync.api.collect` on the emulated cluster.

The campaign runs in *passes* of growing depth (:data:`PASSES`: random strategies per context after the
baselines), every context before any gets deeper, so a campaign stopped early still covers every context.
The random draws of a context are seeded by the context and a deeper pass draws the same first ones, so a
pass skips what an earlier pass (or an interrupted run) stored: the same command always means the same
trials. One line per context goes to ``campaign.jsonl`` in the data folder (start, end, counts): the time
spent, for the datasheet.

Collect alone on the machine: tests or builds beside it skew the timings.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from autosync.cluster import Cluster

V2_DATA = Path(__file__).resolve().parent.parent / "autosync" / "datasets" / "v2"
CLUSTERS = [
    # dataset v1's seven
    "2x1@50mbit", "2x1@100mbit", "2x1@1gbit;node1=100mbit", "4x1@500mbit", "2x1@1gbit", "2x2@1gbit", "2x1@10gbit",
    # v2: three hosts, uneven links, uneven compute, intermittent stragglers, a lossy link, 2 ranks/host slow
    "3x1@200mbit", "3x1@1gbit;node2=100mbit", "2x1@1gbit;node1=cpu:0.5", "4x1@1gbit;stragglers=3x@20%",
    "2x1@500mbit,0ms,loss=1%", "2x2@100mbit", "3x1@10gbit",
]
# The latency subset (``--latency``): wide-area pairs and a 4-host slow link, each the same rates as a cluster above
# with a one-way latency, on four workloads (two vision, two language models). It is emulated by the delay line
# (autosync.executor.delayline) and collected into its own folder (LATENCY_DATA), then merged.
LATENCY_CLUSTERS = ["2x1@1gbit,10ms", "2x1@100mbit,50ms", "4x1@500mbit,25ms"]
LATENCY_WORKLOADS = ["resnet-tiny", "convnext-tiny", "lstm-lm", "t5-tiny"]
LATENCY_DATA = V2_DATA.parent / "latency"
# The low-communication subset (``--diloco``): trials of the ``diloco`` sync mode (DiLoCo, streaming, compressed
# outer gradients; local SGD's averaging is its outer lr 1, momentum 0) in contexts the shipped dataset holds, on the
# slow links where it matters, collected into the shipped dataset itself (its stored profiles: the same features):
# the DDP default (stored already), the mode's two baselines and DILOCO_PER_CONTEXT draws of the mode per context.
DILOCO_CLUSTERS = ["2x1@100mbit", "3x1@200mbit"]
DILOCO_PER_CONTEXT = (6, 12)
PASSES = (4, 10, 20)
MAX_DEFAULT_COMM_S = 6.0


def default_comm_s(n_bytes: int, cluster: Cluster) -> float:
    """Seconds a ring all-reduce of ``n_bytes`` needs over the cluster's slowest host link (bandwidth term only:
    each host sends 2 (N-1)/N of the bytes, N = hosts)."""
    n = cluster.nodes
    return 2 * (n - 1) / n * n_bytes * 8 / cluster.slowest_rate_bps if n > 1 else 0.0


def too_slow(n_bytes: int, cluster: Cluster) -> bool:
    """A context whose DDP default would spend more than MAX_DEFAULT_COMM_S per step on the wire alone: a trial
    (2 warm-up + 3 timed steps at least, every baseline) would not fit its 90 s limit on this machine."""
    return default_comm_s(n_bytes, cluster) > MAX_DEFAULT_COMM_S


def model_bytes() -> dict[str, int]:
    """Gradient bytes (fp32) of every built-in workload's model."""
    from autosync import workloads

    out = {}
    for name in workloads.BUILTINS:
        model, _ = workloads.build(name)
        out[name] = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return out


def plan(shipped_ids: set[str], clusters: list[str] | None = None, names: list[str] | None = None
         ) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """(cluster, workloads) in campaign order, and the contexts left out with why. ``shipped_ids``: the contexts
    another campaign measured (v1's), which this one leaves alone. ``clusters`` and ``names``: other clusters and
    workloads than the campaign's (the latency subset's)."""
    from autosync import workloads
    from autosync.context import Context

    sizes = model_bytes()
    order, skipped = [], []
    for spec in clusters or CLUSTERS[7:] + CLUSTERS[:7]:      # the new clusters first
        cluster = Cluster.parse(spec)
        names_here = []
        for name in names or workloads.BUILTINS:
            if Context.of(name, workloads.default_batch_size(name), cluster).id in shipped_ids:
                continue
            if too_slow(sizes[name], cluster):
                skipped.append(f"{name} on {spec}: the default's all-reduce alone needs "
                               f"{default_comm_s(sizes[name], cluster):.0f} s per step")
                continue
            names_here.append(name)
        if names_here:
            order.append((spec, names_here))
    return order, skipped


def diloco_plan(shipped) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """(cluster, workloads) of the low-communication subset: every built-in workload on DILOCO_CLUSTERS where
    ``shipped`` (the shipped dataset's trials) holds its context, and a workload that has neither there on its
    len(DILOCO_CLUSTERS) slowest clusters there instead; and what is left out with why."""
    from autosync import workloads

    order: dict[str, list[str]] = {spec: [] for spec in DILOCO_CLUSTERS}
    skipped = []
    for name in workloads.BUILTINS:
        rows = shipped[shipped.workload == name]
        here = [spec for spec in DILOCO_CLUSTERS if spec in set(rows.cluster)]
        if not here:
            slowest = rows.groupby("cluster").bandwidth_bps.first().sort_values(kind="stable")
            here = list(slowest.index[:len(DILOCO_CLUSTERS)])
            skipped.append(f"{name}: not on {' or '.join(DILOCO_CLUSTERS)} in the shipped dataset; on its slowest "
                           f"clusters there instead ({', '.join(here)})")
        for spec in here:
            order.setdefault(spec, []).append(name)
    return [(spec, names) for spec, names in order.items() if names], skipped


def status(store, log: Path, planned: int) -> list[str]:
    """The campaign's progress for the datasheet: contexts, trials by outcome, time spent (``campaign.jsonl``),
    rows by sync mode, within-trial noise (CV) by cluster, and how far the best strategy of a context is from the
    DDP default."""
    import statistics

    from autosync.strategy import loads_strategy

    df = store.read(efficiency=False)
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.strip()] if log.exists() else []
    hours = sum(x["end"] - x["start"] for x in lines) / 3600
    by_status = df.status.value_counts().to_dict()
    ok = df[df.status == "ok"]
    strategies = [loads_strategy(x) for x in ok.strategy]
    modes: dict[str, int] = {}
    plans: dict[str, int] = {}     # rows with at least one group of the plan
    for st in strategies:
        modes[st.sync.mode] = modes.get(st.sync.mode, 0) + 1
        for name in {g.plan for g in st.groups}:
            plans[name] = plans.get(name, 0) + 1
    passes = {}
    for x in lines:
        passes.setdefault(x["pass"], set()).add((x["workload"], x["cluster"]))
    out = [f"{df.context_id.nunique()} of {planned} contexts measured "
           f"({', '.join(f'pass {p}: {len(c)}' for p, c in sorted(passes.items()))}); "
           f"{len(df)} trials: " + ", ".join(f"{n} {k}" for k, n in sorted(by_status.items()))
           + f"; {hours:.2f} h of collection (campaign.jsonl)",
           "ok rows by sync mode: " + ", ".join(f"{k} {n}" for k, n in sorted(modes.items(), key=lambda t: -t[1])),
           "ok rows with a group of each plan: " + ", ".join(f"{k} {n}" for k, n in sorted(plans.items(),
                                                                                         key=lambda t: -t[1]))]
    if len(ok):
        cv = ok.groupby("cluster").cv.median().sort_values()
        out.append(f"median within-trial CV {ok.cv.median():.1%}; by cluster: "
                   + ", ".join(f"{c} {v:.1%}" for c, v in cv.items()))
        ratios, slower, n = [], 0, 0
        for _, g in ok.groupby("context_id"):
            d = g[g.source == "ddp_default"].samples_per_s
            if len(d):
                ratios.append(g.samples_per_s.max() / d.iloc[0])
                slower += int((g.samples_per_s < d.iloc[0]).sum())
                n += len(g)
        if ratios:
            out.append(f"best strategy of a context over its DDP default: median {statistics.median(ratios):.2f}x "
                       f"(range {min(ratios):.2f}-{max(ratios):.2f}x); {slower / max(n, 1):.0%} of the strategies "
                       f"are slower than the default")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/campaign.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None,
                    help="dataset folder (default: autosync/datasets/v2; with --latency, autosync/datasets/latency)")
    ap.add_argument("--latency", action="store_true",
                    help=f"the latency subset: {', '.join(LATENCY_WORKLOADS)} on {', '.join(LATENCY_CLUSTERS)}")
    ap.add_argument("--diloco", action="store_true",
                    help=f"the low-communication subset: draws of the diloco sync mode on {', '.join(DILOCO_CLUSTERS)} "
                    "for every workload the shipped dataset holds there, into the shipped dataset (default --data)")
    ap.add_argument("--passes", type=int, nargs="+", default=None, choices=range(1, len(PASSES) + 1), metavar="N",
                    help=f"which passes to run (random strategies per context: {PASSES}; with --diloco "
                    f"{DILOCO_PER_CONTEXT}; default all)")
    ap.add_argument("--stop-after", type=float, default=None, metavar="MINUTES",
                    help="start no new context after this many minutes (a running one finishes)")
    ap.add_argument("--dry-run", action="store_true", help="print the contexts and what is left out, measure nothing")
    ap.add_argument("--status", action="store_true",
                    help="print what the dataset holds so far (for the datasheet), measure nothing")
    args = ap.parse_args(argv)
    if args.latency and args.diloco:
        ap.error("--latency and --diloco are two campaigns: give one")
    from autosync import api
    args.data = args.data or str(LATENCY_DATA if args.latency else api.SHIPPED_DATA if args.diloco else V2_DATA)
    passes = DILOCO_PER_CONTEXT if args.diloco else PASSES
    if any(p > len(passes) for p in args.passes or ()):
        ap.error(f"--passes: this campaign has {len(passes)} pass(es)")
    from autosync.datasets.store import DatasetStore
    from autosync.executor.emulate import open_ranks
    from autosync.search.collect import collect
    from autosync.search.trials import TrialSettings

    # v1's contexts are left alone; the shipped dataset also holds this campaign's own once merged, and those go on
    shipped_rows = DatasetStore(api.SHIPPED_DATA, create=False).read(efficiency=False)
    shipped = set(shipped_rows["context_id"])
    own = Path(args.data)
    if (own / "profiles").is_dir() and not args.diloco:
        shipped -= set(DatasetStore(own, create=False).read(efficiency=False)["context_id"])
    if args.diloco:
        order, skipped = diloco_plan(shipped_rows)
    else:
        order, skipped = plan(shipped, *((LATENCY_CLUSTERS, LATENCY_WORKLOADS) if args.latency else ()))
    n = sum(len(w) for _, w in order)
    print(f"campaign: {n} contexts on {len(order)} clusters; {len(skipped)} left out or moved:", *skipped, sep="\n  ")
    if args.dry_run:
        for spec, names in order:
            print(f"{spec}: {' '.join(names)}")
        return 0
    if args.status:
        print(*status(DatasetStore(args.data, create=False), Path(args.data) / "campaign.jsonl", n), sep="\n")
        return 0
    for spec, _ in order:
        api.check_faithful(Cluster.parse(spec), False, "collect")
    store = DatasetStore(args.data)
    log = Path(args.data) / "campaign.jsonl"
    settings = TrialSettings()
    t_start = time.monotonic()
    for p in args.passes or range(1, len(passes) + 1):
        per_context = passes[p - 1]
        for spec, names in order:
            cluster = Cluster.parse(spec)
            with open_ranks(cluster) as pool:
                for name in names:
                    if args.stop_after is not None and time.monotonic() - t_start > args.stop_after * 60:
                        print("campaign: --stop-after reached; the same command goes on from here", flush=True)
                        return 0
                    t0 = time.time()
                    try:
                        counts = collect([name], [cluster], store, per_context, settings, progress=False,
                                         pool=pool, modes=("diloco",) if args.diloco else None)
                    except Exception as e:   # a context that cannot be profiled: say so, go on with fresh ranks
                        counts = {"error": f"{type(e).__name__}: {e}"[:500]}
                        pool.start()
                    line = {"pass": p, "per_context": per_context, "workload": name, "cluster": spec,
                            **({"modes": ["diloco"]} if args.diloco else {}),
                            "start": t0, "end": time.time(), **counts}
                    if not _resumed_only(counts):
                        with log.open("a") as f:     # a context a resumed run only skipped is not logged again
                            f.write(json.dumps(line) + "\n")
                    print(f"pass {p} {name} on {spec}: {counts} in {line['end'] - t0:.0f} s", flush=True)
    return 0


def _resumed_only(counts: dict) -> bool:
    """True when a context measured nothing new: every trial it wanted was stored already."""
    return counts.get("skipped", 0) > 0 and not any(v for k, v in counts.items() if k != "skipped")


if __name__ == "__main__":
    import signal

    from autosync.errors import UserError, sigterm_as_interrupt

    signal.signal(signal.SIGTERM, sigterm_as_interrupt)   # cleans up like Ctrl-C: the cluster's context managers run
    try:
        sys.exit(main())
    except UserError as e:
        print(f"campaign: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("campaign: interrupted; the same command goes on from here (the trial it was in is measured again)",
              file=sys.stderr)
        sys.exit(130)
