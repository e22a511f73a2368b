"""Wall-clock time to a target loss on clusters with uneven hosts and stragglers, per sync mode.

Per (workload, cluster) context, on one emulated cluster (CPU limits on the ranks of the slow host,
or a thread that slows one random rank at a time; see autosync/executor/emulate.py) and one kept-alive
rank pool, each arm *trains* with the efficiency protocol (same initial weights, data order and Adam
lr 1e-3 as the efficiency references; autosync/efficiency/) until the consensus model's smoothed
held-out loss reaches L* (the reference's loss at 3/4 of the efficiency horizon), timed with the
clock paused during evaluations:

  DDP default          bsp, lossless
  local_sgd_4          post-local SGD, period 4
  ssp_1                stale synchronous, staleness 1
  adaptive_local_sgd   averaging when the ranks' models diverge (threshold 0.005, at most every 8 steps)
  asp                  asynchronous parameter server, when the registry has it (else "not built")
  autosync             `tune --objective time-to-loss` on this cluster (the shipped cost model; the
                       efficiency of lossy finalists measured on loopback)

An arm that has not reached L* after ``--cap`` times the default's time reads "never" with the loss it
reached. x = the default's time / the arm's. One timed run per arm: differences within ~10% are noise
on these 2 cores. Resumable: finished contexts are kept in ``--work`` (rows.jsonl) and skipped.

    python bench/stragglers.py [--workloads ...] [--clusters ...] [--measure 3] [--work DIR]
"""
import argparse
import statistics
import time
from pathlib import Path

from autosync import plans
from autosync import workloads as W
from autosync.api import load_model
from autosync.context import Context
from autosync.datasets.store import DatasetStore
from autosync.efficiency import target
from autosync.efficiency.meter import EfficiencyMeter
from autosync.models import training
from autosync.models.efficiency_model import EfficiencyModel, fit_store
from autosync.datasets import SHIPPED_DATA
from autosync.profiler import Profile
from autosync.search.baselines import baselines
from autosync.search.collect import context_profile
from autosync.search.trials import TrialSettings
from autosync.search.config import TuneConfig
from autosync.search.tuner import tune
from autosync.strategy import Strategy
from _results import RESULTS, load_rows, run_contexts, speedup_bars, write as write_result
from time_to_loss import fmt_time, ratio, time_to_target

ARMS = ("DDP default", "local_sgd_4", "ssp_1", "adaptive_local_sgd", "asp", "autosync")


def run_context(pool, cluster, spec, wl, args, shipped, base, cost_model, eff_model, work, settings, say, prior=None):
    batch = W.default_batch_size(wl)
    ctx = Context.on(pool, wl, batch, cluster).id
    raw = shipped.load_profile_dict(ctx)
    profile = Profile.from_dict(raw) if raw else context_profile(DatasetStore(work / "profiles"), pool, cluster, wl,
                                                                 batch, say)
    row = {"workload": wl, "cluster": spec, "host_speeds": profile.env.get("host_speeds")}
    with EfficiencyMeter(DatasetStore(work / "efficiency"), wl, batch, cluster.world_size, cluster.ranks_per_node,
                         also=[shipped], progress=say) as meter:
        meter.on_cluster(pool, cluster.spec())      # asp's efficiency is measured on the cluster itself
        goal = target(meter.references(), meter.horizon)
        row["target_loss"] = goal
        hand = baselines(profile)
        picks = {arm: (hand[arm], arm) for arm in ARMS if arm in hand}
        picks["DDP default"] = (Strategy.default(), "ddp_default")
        t0 = time.monotonic()
        config = TuneConfig(measure=args.measure, storage=f"sqlite:///{work}/tune.db", seed=args.seed,
                            objective="time-to-loss", confirm_rounds=args.confirm_rounds)
        result = tune(profile, cost_model, config, DatasetStore(work / "trials"), pool, base, workload=wl,
                      efficiency_model=eff_model, noise_scale=meter.noise_scale(), meter=meter, on_progress=say)
        picks["autosync"] = (result.strategy, result.source)
        row["search_s"], row["why"] = time.monotonic() - t0, result.why
        row["pick"] = result.strategy.canonical()
        # an earlier run of this context that lacked an arm (a mode built since): keep what it measured
        timed: dict[str, dict] = {x["hash"]: x for x in (prior or {}).values() if isinstance(x, dict) and "hash" in x}
        if Strategy.default().hash not in timed:
            say(f"{wl} {spec}: training the DDP default to L* = {goal:.4f}")
            timed[Strategy.default().hash] = time_to_target(pool, wl, batch, Strategy.default(), goal, meter)
        ref = timed[Strategy.default().hash]
        cap = args.cap * (ref["time_s"] or ref["trained_s"])
        for arm in ARMS:
            if arm not in picks:
                row[arm] = None
                continue
            strategy, source = picks[arm]
            if strategy.hash not in timed:
                say(f"{wl} {spec}: training {arm} ({source}) to L*")
                timed[strategy.hash] = time_to_target(pool, wl, batch, strategy, goal, meter, cap)
            row[arm] = {"source": source, "mode": strategy.sync.mode, **timed[strategy.hash]}
    return row


def table(rows, args):
    lines = ["# Time to a target loss on uneven clusters: BSP, local SGD, SSP, adaptive, ASP, autosync's pick", "",
             "Wall-clock seconds of training (evaluations excluded) until the consensus model's smoothed held-out "
             "loss reaches L*, measured on the emulated cluster (host speeds by CPU limits, stragglers by a thread "
             f"that slows one random rank at a time); x = the default's time / the arm's; 'never' = not within "
             f"{args.cap:g}x the default's time (the loss reached in brackets); 'not built' = the mode is not in "
             "the registry. Every arm but the default is LOSSY. host speeds = measured by the profile (fastest rank's "
             "compute time / each host's).", "",
             "| workload | cluster | host speeds | L* | " + " | ".join(f"{a} s | x" for a in ARMS) + " | autosync pick |",
             "|---|---|---|---:|" + "---:|---:|" * len(ARMS) + "---|"]
    for r in rows:
        d = r["DDP default"]
        cells = []
        for a in ARMS:
            x = r.get(a)
            cells += ["not built", ""] if x is None else [fmt_time(x), f"{ratio(x, d):.2f}"]
        speeds = "/".join(f"{s:.2f}" for s in r["host_speeds"]) if r.get("host_speeds") else "-"
        pick = r["autosync"]
        lines.append(f"| {r['workload']} | {r['cluster']} | {speeds} | {r['target_loss']:.3f} | " + " | ".join(cells)
                     + f" | {pick['source']} ({pick['mode']}) |")
    lines += ["", "| arm | median x over default | best arm in | never reached L* |", "|---|---:|---:|---:|"]
    for a in ARMS[1:]:
        xs = [ratio(r[a], r["DDP default"]) for r in rows if r.get(a)]
        if not xs:
            lines.append(f"| {a} | not built | | |")
            continue
        best = sum(1 for r in rows if r.get(a) and ratio(r[a], r["DDP default"]) >= max(
            ratio(r[b], r["DDP default"]) for b in ARMS if r.get(b)))
        lines.append(f"| {a} | {statistics.median(xs):.2f} | {best} of {len(rows)} | "
                     f"{sum(r[a]['time_s'] is None for r in rows if r.get(a))} |")
    why = [f"- {r['workload']} {r['cluster']}: {r['why']}" for r in rows if r.get("why")]
    if why:
        lines += ["", "Why autosync's tune did not take the fastest-per-step strategy:", "", *why]
    lines += ["", f"Search seconds (median): {statistics.median(r['search_s'] for r in rows):.0f}."]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", nargs="+", default=["mlp", "resnet-tiny", "vit-tiny"])
    ap.add_argument("--clusters", nargs="+", default=["2x1@1gbit;node1=cpu:0.5", "2x1@1gbit;stragglers=3x@30%",
                                                      "2x1@200mbit;node1=cpu:0.5"])
    ap.add_argument("--measure", type=int, default=3, help="measured trials per tune (default 3)")
    ap.add_argument("--confirm-rounds", type=int, default=1)
    ap.add_argument("--cap", type=float, default=2.0, help="give up on an arm after this many times the default's "
                                                           "time to target (default 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default="/tmp/autosync-stragglers", help="resumable work directory")
    ap.add_argument("--out", default=str(RESULTS / "stragglers.md"))
    ap.add_argument("--report-only", action="store_true", help="write the table from the finished contexts in --work")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    by_key = load_rows(work)
    # a context is done when no arm the registry can run now is missing from its row
    done = {k for k, r in by_key.items()
            if all(r.get(a) is not None for a in ARMS if a != "asp" or "asp" in plans.SYNC_MODES)}
    shipped = DatasetStore(SHIPPED_DATA, create=False)
    base = None if args.report_only else training.build(shipped)
    cost_model = load_model(None)
    try:
        eff_model = fit_store(shipped)
    except ValueError:
        eff_model = EfficiencyModel()
    settings = TrialSettings()
    print(f"sync modes in the registry: {', '.join(plans.SYNC_MODES)}", flush=True)

    def say(msg):
        print(f"  {msg}", flush=True)

    def measure_one(pool, cluster, spec, wl, prior):
        return run_context(pool, cluster, spec, wl, args, shipped, base, cost_model, eff_model, work, settings, say,
                           prior=prior)

    if args.report_only:   # nothing is measured: every context counts as done
        done = {(w, c) for c in args.clusters for w in args.workloads}
    rows = run_contexts(args, work, done, measure_one,
                        lambda row: f"{row['workload']} {row['cluster']}: " + "  ".join(
                            f"{a} {fmt_time(row[a]) if row[a] else '-'}" for a in ARMS) + f"  ({row['bench_s']:.0f} s)")
    lines = table(rows, args)
    write_result(args.out, lines)
    print("\n".join(lines))
    speedup_bars([f"{r['workload']}\n{r['cluster']}" for r in rows],
                 {a: [ratio(r[a], r["DDP default"]) if r.get(a) else 0.0 for r in rows] for a in ARMS[1:]},
                 "time-to-target speedup over DDP default\n(0 = never reached or not built)",
                 Path(args.out).with_suffix(".png"))


if __name__ == "__main__":
    main()
