"""Wall-clock time to a target loss, measured end to end on the emulated cluster, for four pickers.

Per (workload, cluster) context, on one emulated cluster and one kept-alive rank pool:
  DDP default      the lossless reference
  best baseline    the hand-crafted baseline with the most samples/s measured on this cluster (what a
                   person reading a throughput benchmark would pick)
  tune ttl         `tune --objective time-to-loss`: goodput, lossy finalists' efficiency measured
  tune thr         `tune --objective throughput`: samples/s alone (what autosync did before)
Each pick then *trains* on the emulated cluster with the efficiency protocol (same initial weights,
data order and Adam lr 1e-3 as the efficiency references; see autosync/efficiency/) until the
consensus model's smoothed held-out loss reaches L* (the reference's loss at 3/4 of the efficiency
horizon), timed with the clock paused during evaluations. A pick that has not reached L* after
``--cap`` times the default's time (or twice the horizon in steps) reads "never" with the loss it reached.
The ratio columns are time-to-target speedups over the default measured in the same context.

The cost model is the shipped one (trained on the shipped dataset, which holds the 1 and 10 gbit
contexts but not the slower one); the efficiency model is fitted to the shipped efficiency table.
Resumable: finished contexts are kept in ``--work`` (rows.jsonl) and skipped; efficiency curves
measured by the tunes are stored there and reused across clusters (they do not depend on the network).

    python bench/time_to_loss.py [--workloads ...] [--clusters ...] [--measure 4] [--work DIR]
"""
import argparse
import statistics
import time
from pathlib import Path

from autosync import workloads as W
from autosync.api import load_model
from autosync.context import Context
from autosync.datasets.store import DatasetStore
from autosync.efficiency import CurveSpec, smooth, target
from autosync.efficiency.meter import EfficiencyMeter
from autosync.efficiency.train import measure_curve
from autosync.models import training
from autosync.models.efficiency_model import EfficiencyModel, fit_store
from autosync.datasets import SHIPPED_DATA
from autosync.profiler import Profile
from autosync.search.baselines import baselines
from autosync.search.collect import context_profile
from autosync.executor.launch import TrialFailure
from autosync.search.trials import TrialSettings, measure_strategy
from autosync.search.config import TuneConfig
from autosync.search.tuner import tune
from autosync.strategy import Strategy
from _results import RESULTS, load_rows, run_contexts, speedup_bars, write as write_result

PICKERS = ("DDP default", "best baseline", "tune ttl", "tune thr")


def time_to_target(pool, workload, batch, strategy, goal, meter, max_train_s=None):
    spec = CurveSpec(workload, strategy.canonical(), batch, 2 * meter.horizon, meter.eval_every, 0, meter.lr,
                     meter.optimizer, signals=False, stop_at=goal, max_train_s=max_train_s)
    timeout = 600.0 + 3 * (max_train_s or 600.0)
    try:
        curve = measure_curve(pool, spec, timeout)
    except TrialFailure as f:     # recorded as failed, with its reason; the benchmark goes on
        pool.start()              # fresh ranks: a failed collective leaves the old ones' process group unusable
        return {"time_s": None, "failed": f"{f.status}: {f.reason}"[:300], "reached": float("nan"), "steps": 0,
                "s_per_step": float("nan"), "trained_s": 0.0, "lossy": not strategy.is_lossless,
                "hash": strategy.hash}
    t = curve.time_to(goal)
    steps = curve.steps[-1]
    return {"time_s": t, "reached": min(smooth(curve.eval_loss)), "steps": steps,
            "s_per_step": curve.train_s[-1] / max(steps, 1), "trained_s": curve.train_s[-1],
            "lossy": not strategy.is_lossless, "hash": strategy.hash}


def run_context(pool, cluster, spec, wl, args, shipped, base, cost_model, eff_model, work, settings, say):
    batch = W.default_batch_size(wl)
    ctx = Context.on(pool, wl, batch, cluster).id
    raw = shipped.load_profile_dict(ctx)
    profile = Profile.from_dict(raw) if raw else context_profile(DatasetStore(work / "profiles"), pool, cluster, wl,
                                                                 batch, say)
    eff_store = DatasetStore(work / "efficiency")
    row = {"workload": wl, "cluster": spec}
    with EfficiencyMeter(eff_store, wl, batch, cluster.world_size, cluster.ranks_per_node, also=[shipped],
                         progress=say) as meter:
        meter.on_cluster(pool, cluster.spec())      # asp's efficiency is measured on the cluster itself
        goal = target(meter.references(), meter.horizon)
        row["target_loss"] = goal
        hand = baselines(profile)
        thr = {n: measure_strategy(pool, profile, s, settings) for n, s in hand.items()}
        best = max((n for n in hand if n != "ddp_default" and thr[n].ok), key=lambda n: thr[n].samples_per_s)
        picks = {"DDP default": (Strategy.default(), "ddp_default"), "best baseline": (hand[best], best)}
        for name, objective in (("tune ttl", "time-to-loss"), ("tune thr", "throughput")):
            t0 = time.monotonic()
            config = TuneConfig(measure=args.measure, storage=f"sqlite:///{work}/{objective}.db", seed=args.seed,
                                objective=objective, confirm_rounds=args.confirm_rounds)
            result = tune(profile, cost_model, config, DatasetStore(work / f"trials-{objective}"), pool, base,
                          workload=wl,
                          efficiency_model=eff_model if objective == "time-to-loss" else None,
                          noise_scale=meter.noise_scale(), meter=meter if objective == "time-to-loss" else None,
                          on_progress=say)
            picks[name] = (result.strategy, result.source)
            row[f"{name} search_s"] = time.monotonic() - t0
            row[f"{name} why"] = result.why
        timed: dict[str, dict] = {}
        say(f"{wl} {spec}: training the DDP default to L* = {goal:.4f}")
        ref = timed[Strategy.default().hash] = time_to_target(pool, wl, batch, Strategy.default(), goal, meter)
        cap = args.cap * (ref["time_s"] or ref["trained_s"])
        for name in PICKERS:
            strategy, source = picks[name]
            if strategy.hash not in timed:
                say(f"{wl} {spec}: training {name} ({source}) to L*")
                timed[strategy.hash] = time_to_target(pool, wl, batch, strategy, goal, meter, cap)
            row[name] = {"source": source, **timed[strategy.hash]}
    return row


def fmt_time(r):
    if r.get("failed"):
        return f"FAILED ({r['failed'][:80]})"
    return f"{r['time_s']:.1f}" if r["time_s"] is not None else f"never (> {r['trained_s']:.0f}; {r['reached']:.3f})"


def ratio(r, d):
    return d["time_s"] / r["time_s"] if r["time_s"] and d["time_s"] else 0.0


def table(rows, args):
    lines = ["# Time to a target loss: DDP default, best baseline, tune by time-to-loss, tune by throughput", "",
             "Wall-clock seconds of training (evaluations excluded) until the consensus model's smoothed held-out "
             "loss reaches L*, measured on the emulated cluster; x = the default's time / the pick's time. "
             "LOSSY picks change the math (compression, local SGD); 'never' = L* not reached within "
             f"{args.cap:g}x the default's time or {2}x the efficiency horizon in steps (the loss it reached in "
             "brackets). Pickers: see the script's docstring.", "",
             "| workload | cluster | L* | default s | best baseline | s | x | tune time-to-loss pick | s | x | "
             "tune throughput pick | s | x | ttl / thr |", "|---|---|---:|---:|---|---:|---:|---|---:|---:|---|---:|---:|"
             "---:|"]
    for r in rows:
        d, b, t, h = (r[p] for p in PICKERS)
        tag = lambda x: f"{x['source']} ({'LOSSY' if x['lossy'] else 'lossless'})"  # noqa: E731
        both = ratio(t, d) / ratio(h, d) if ratio(h, d) else float("inf") if ratio(t, d) else float("nan")
        lines.append(f"| {r['workload']} | {r['cluster']} | {r['target_loss']:.3f} | {fmt_time(d)} | {tag(b)} | "
                     f"{fmt_time(b)} | {ratio(b, d):.2f} | {tag(t)} | {fmt_time(t)} | {ratio(t, d):.2f} | {tag(h)} | "
                     f"{fmt_time(h)} | {ratio(h, d):.2f} | {both:.2f} |")
    med = lambda p: statistics.median(ratio(r[p], r["DDP default"]) for r in rows)  # noqa: E731
    lines += ["", "| picker | median x over default | contexts where L* was never reached |", "|---|---:|---:|"]
    lines += [f"| {p} | {med(p):.2f} | {sum(r[p]['time_s'] is None for r in rows)} of {len(rows)} |"
              for p in PICKERS[1:]]
    lose = [f"{r['workload']} {r['cluster']}" for r in rows
            if ratio(r["tune thr"], r["DDP default"]) < 0.95 * ratio(r["tune ttl"], r["DDP default"])]
    win = [f"{r['workload']} {r['cluster']}" for r in rows
           if ratio(r["tune thr"], r["DDP default"]) > 1.05 * ratio(r["tune ttl"], r["DDP default"])]
    lines += ["", f"The throughput objective reached L* more than 5% later than the time-to-loss objective in "
              f"{len(lose)} of {len(rows)} contexts ({', '.join(lose) or 'none'}); sooner in {len(win)} "
              f"({', '.join(win) or 'none'}). One timed run per pick: differences within ~10% are noise on these "
              "2 cores.", ""]
    why = [f"- {r['workload']} {r['cluster']}: {r['tune ttl why']}" for r in rows if r.get("tune ttl why")]
    if why:
        lines += ["Why the time-to-loss tune did not take the fastest-per-step strategy:", "", *why, ""]
    lines += ["Search seconds (median): time-to-loss "
              f"{statistics.median(r['tune ttl search_s'] for r in rows):.0f}, throughput "
              f"{statistics.median(r['tune thr search_s'] for r in rows):.0f} (the first tune of a workload pays "
              "for its efficiency measurements; later clusters reuse them)."]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", nargs="+", default=["mlp", "resnet-tiny", "gpt2-tiny", "vit-tiny"])
    ap.add_argument("--clusters", nargs="+", default=["2x1@200mbit", "2x1@1gbit", "2x1@10gbit"])
    ap.add_argument("--measure", type=int, default=4, help="measured trials per tune (default 4)")
    ap.add_argument("--confirm-rounds", type=int, default=2)
    ap.add_argument("--cap", type=float, default=2.0, help="give up on a pick after this many times the default's "
                                                           "time to target (default 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default="/tmp/autosync-time-to-loss", help="resumable work directory")
    ap.add_argument("--out", default=str(RESULTS / "time_to_loss.md"))
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    done = set(load_rows(work))
    shipped = DatasetStore(SHIPPED_DATA, create=False)
    base = training.build(shipped)
    cost_model = load_model(None)
    try:
        eff_model = fit_store(shipped)
    except ValueError:
        eff_model = EfficiencyModel()
    settings = TrialSettings()

    def say(msg):
        print(f"  {msg}", flush=True)

    def measure_one(pool, cluster, spec, wl, prior):
        return run_context(pool, cluster, spec, wl, args, shipped, base, cost_model, eff_model, work, settings, say)

    rows = run_contexts(args, work, done, measure_one,
                        lambda row: f"{row['workload']} {row['cluster']}: "
                        + "  ".join(f"{p} {fmt_time(row[p])}" for p in PICKERS) + f"  ({row['bench_s']:.0f} s)")
    lines = table(rows, args)
    write_result(args.out, lines)
    print("\n".join(lines))
    _plot(rows, Path(args.out).with_suffix(".png"))


def _plot(rows, path):
    speedup_bars([f"{r['workload']}\n{r['cluster']}" for r in rows],
                 {p: [ratio(r[p], r["DDP default"]) for r in rows] for p in PICKERS[1:]},
                 "time-to-target speedup over DDP default\n(0 = never reached)", path)


if __name__ == "__main__":
    main()
