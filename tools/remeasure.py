"""Measure a workload's stored trials again, after its task changed (its batches, not its model: ncf's Zipf ids).

    python tools/remeasure.py WORKLOAD [--data DIR ...] [--work DIR] [--dry-run]

A workload's batches decide what some plans cost (row_sparse sends the rows a batch touched, and the profile's
``touched_rows`` is a feature of every row of the context), so when they change, every stored row of the workload
describes a task that no longer exists. This measures, for every context of WORKLOAD in the first ``--data``
folder, a new profile and every stored strategy again (same strategy, same source) on the same cluster, into
``--work``; a context whose strategies are all in ``--work`` is skipped, so it resumes. When every context is done
it replaces, in each ``--data`` folder, the workload's trials and profiles of the contexts that folder holds by the
new ones, and removes the workload's efficiency rows (they belong to the old task: measure them again with
``autosync efficiency``). A trial's limits are the campaign's (:class:`TrialSettings` defaults).

Measure alone on the machine: tests or builds beside it skew the timings.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from autosync.datasets import SHIPPED_DATA
from autosync.datasets.store import DatasetStore, safe_name

DEFAULT_WORK = Path("autosync-remeasure")


def plan(store: DatasetStore, workload: str) -> dict[str, dict]:
    """The workload's contexts in ``store``: context id -> cluster spec, batch size and the stored
    (source, strategy JSON) pairs, in storage order."""
    df = store.read(efficiency=False)
    df = df[df.workload == workload]
    out: dict[str, dict] = {}
    for row in df.to_dict("records"):
        c = out.setdefault(row["context_id"], {"cluster": row["cluster"], "batch_size": int(row["batch_size"]),
                                               "unshaped": "|unshaped|" in row["context_id"], "trials": []})
        c["trials"].append((row["source"], row["strategy"]))
    return out


def saved_plan(workload: str, data: list[Path], work: Path) -> tuple[dict[str, dict], dict[str, list[str]]]:
    """The plan and, per ``data`` folder, the contexts it holds, as the first run found them (``work/plan.json``):
    a run that stops while it replaces rows finds them again from there."""
    path = work / "plan.json"
    if path.exists():
        saved = json.loads(path.read_text())
        if saved["workload"] != workload or saved["data"] != [str(d) for d in data]:
            raise SystemExit(f"remeasure: {work} holds the work of another call ({saved['workload']} on "
                             f"{' '.join(saved['data'])}): give another --work")
        return saved["contexts"], saved["holders"]
    contexts = plan(DatasetStore(data[0], create=False), workload)
    holders = {str(d): sorted(plan(DatasetStore(d, create=False), workload)) for d in data}
    work.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name("plan.json.tmp")
    tmp.write_text(json.dumps({"workload": workload, "data": [str(d) for d in data], "contexts": contexts,
                               "holders": holders}))
    os.replace(tmp, path)
    return contexts, holders


def remeasure(workload: str, data: list[Path], work: Path, progress=print) -> dict[str, int]:
    """Measure the contexts of ``plan(data[0], workload)`` into ``work`` (one store per context), then replace
    them in each of ``data``. Returns counts: contexts, trials measured now, trials replaced, efficiency rows
    removed."""
    from autosync.cluster import parse_cluster
    from autosync.context import Context
    from autosync.executor.emulate import open_ranks
    from autosync.profiler import Profile
    from autosync.profiler.measure import run_profile
    from autosync.search.trials import TrialSettings, run_trials
    from autosync.strategy import loads_strategy

    contexts, holders = saved_plan(workload, data, work)
    counts = {"contexts": len(contexts), "measured": 0, "replaced": 0, "efficiency_removed": 0}
    for i, (ctx, c) in enumerate(contexts.items(), 1):
        new = DatasetStore(work / safe_name(ctx))
        have = {h for cid, h in new.keys() if cid == ctx}
        trials = [(source, loads_strategy(text)) for source, text in c["trials"]]
        if new.load_profile_dict(ctx) is not None and all(s.hash in have for _, s in trials):
            progress(f"[{i}/{len(contexts)}] {ctx}: done before, skipped")
            continue
        cluster = parse_cluster(c["cluster"])
        with open_ranks(cluster, c["unshaped"]) as pool:
            got = Context.on(pool, workload, c["batch_size"], cluster).id
            if got != ctx:
                raise SystemExit(f"remeasure: {ctx} cannot be measured here (this machine measures {got})")
            if new.load_profile_dict(ctx) is None:
                progress(f"[{i}/{len(contexts)}] {ctx}: profiling")
                new.save_profile(ctx, run_profile(pool, cluster, workload, c["batch_size"]).to_dict())
            profile = Profile.from_dict(new.load_profile_dict(ctx))
            progress(f"[{i}/{len(contexts)}] {ctx}: {len(trials) - len(have)} of {len(trials)} trials")
            counts["measured"] += len(run_trials(pool, profile, trials, new, TrialSettings()))
        new.compact()
    for root in data:
        store = DatasetStore(root, create=False)
        mine = set(holders[str(root)])
        counts["replaced"] += store.remove({k for k in store.keys() if k[0] in mine})
        for ctx in mine:
            new = DatasetStore(work / safe_name(ctx))
            store.merge(new)        # the old rows are gone, so every new one is added
            store.save_profile(ctx, new.load_profile_dict(ctx))
        eff = store.read_efficiency()
        counts["efficiency_removed"] += store.remove_efficiency(set(eff.efficiency_key[eff.workload == workload]))
        store.compact()
    return counts


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python tools/remeasure.py", description=__doc__.split("\n\n")[0],
                                 epilog="Example: python tools/remeasure.py ncf --data "
                                        "autosync/datasets/data autosync/datasets/v2")
    ap.add_argument("workload", help="the built-in workload whose rows to measure again")
    ap.add_argument("--data", nargs="+", type=Path, default=[SHIPPED_DATA],
                    help="dataset folders to update; the first one's contexts are measured (default: the shipped one)")
    ap.add_argument("--work", type=Path, default=DEFAULT_WORK,
                    help=f"where the new rows are measured first; it resumes from there (default: {DEFAULT_WORK})")
    ap.add_argument("--dry-run", action="store_true", help="print the contexts and trial counts, measure nothing")
    args = ap.parse_args(argv)
    from autosync import workloads

    if args.workload not in workloads.BUILTINS:
        ap.exit(2, f"remeasure: {args.workload!r} is not a built-in workload ({', '.join(workloads.BUILTINS)})\n")
    for d in args.data:
        if not (d / "profiles").is_dir():
            ap.exit(2, f"remeasure: {d}: no dataset here (no profiles folder)\n")
    contexts = plan(DatasetStore(args.data[0], create=False), args.workload)
    if not contexts:
        ap.exit(2, f"remeasure: {args.data[0]} holds no trials of {args.workload!r}\n")
    if args.dry_run:
        for ctx, c in contexts.items():
            print(f"{ctx}: {len(c['trials'])} trials")
        print(f"{sum(len(c['trials']) for c in contexts.values())} trials in {len(contexts)} contexts")
        return
    counts = remeasure(args.workload, args.data, args.work)
    print(" ".join(f"{k} {v}" for k, v in counts.items()))


if __name__ == "__main__":
    main(sys.argv[1:])
