"""Time to quality, end to end: `tune` (measure 8 and measure 0) against the DDP default, the best hand-crafted
baseline and Optuna alone, with both models and the interval card retrained *without the workload under test*
(:func:`autosync.models.uncertainty.card_without`; results stored before 2026-12-07 read the shipped card).

Per (workload, cluster) context, on one emulated cluster and one kept-alive rank pool:
  DDP default     the lossless reference, trained to the target twice (first and last: its spread is the
                  measured noise of a time to target)
  best baseline   every hand-crafted baseline measured (samples/s); the fastest is trained (what a person reading
                  a throughput benchmark of the baselines would pick)
  Optuna alone    Optuna TPE over the same space, ``--measure`` real trials with the measured samples/s as
                  objective, then what tune does with its finalists (the efficiency of the lossy ones among the
                  ``--finalists`` best measured, ``--confirm-rounds`` interleaved re-measurements) and the pick by
                  goodput: tune's pipeline without the cost model
  tune m0         `tune --measure 0`: the cost model and the efficiency model alone (prediction-only profile)
  tune m8         `tune --measure 8` (the CLI's defaults: time-to-loss objective, 3 confirmation rounds)
The cost model (regressor) and the efficiency model are fitted to ``--data`` less every row of the workload under
test; the tunes' efficiency measurements start from nothing but the DDP default's reference curves, each arm in its
own store (reused across clusters, as a user's would be: asp's are per cluster).

Each pick then trains on the emulated cluster with the efficiency protocol (bench/time_to_loss.py's
``time_to_target``: same initial weights, data order and Adam learning rate as the references) until the consensus
model's smoothed held-out loss reaches L* (the references' loss at 3/4 of the efficiency horizon). The table gives
the training time to L* ("train x": the default's median time / the pick's) and end to end ("e2e x": search time
plus training time, against the default's training time; the reference curves are not counted, every arm needs
them). A context whose DDP default would spend more than the campaign's limit per step on the wire is left out
(tools/campaign.py: too_slow), and so is one whose references are flat (their loss falls less than
``FLAT_DROP`` by L*); the table says which and why.

Resumable: finished contexts are kept in ``--work`` (rows.jsonl, committed) and skipped; a context takes 5-50 min
here at 2 hosts, 11-92 min at 3 (200 mbit) and 40-130 min at 4, so the 48 default contexts span sessions (47
measured: wide-recsys is too slow for 3x1@200mbit, so its 4th cluster is ``2x1@500mbit,0ms,loss=1%``). The
arms' efficiency stores are committed too (.gitignore), so a later session's contexts reuse what earlier ones
measured, as one user's store would. A context stopped midway resumes after its last finished step (each arm's
search and pick, each timed training: ``contexts/<context>.steps.json``, bench/_results.Journal); an unfinished
step starts over, and the row names the steps it took from the stopped run (``resumed_after``; ``resumed_by``:
the commit and date of each, which the table names too; its ``bench_s`` counts only the resumed run). A stopped
context's journal is committed (.gitignore), so it resumes in the next session too.

    python bench/time_to_quality.py [--workloads ...] [--clusters ...] [--measure 8] [--work DIR]
    python bench/time_to_quality.py --table-only      # the table of every finished context, measuring nothing
    python bench/time_to_quality.py --retrain-failed --workloads moe-tiny --clusters 3x1@200mbit
                                    # train a finished context's FAILED picks again (after a fix), keeping the rest
"""
import argparse
import collections
import json
import math
import shutil
import statistics
import sys
import time
from pathlib import Path

import optuna

from autosync import workloads as W
from autosync.cluster import Cluster
from autosync.context import Context
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from campaign import model_bytes, too_slow  # noqa: E402
from autosync.datasets.store import DatasetStore, safe_name
from autosync.efficiency import REFERENCE_SEEDS, is_flat, reference_key, target
from autosync.efficiency.meter import EfficiencyMeter
from autosync.models import training
from autosync.models.efficiency_model import EfficiencyModel, fit_store
from autosync.models.ranker import CostModel
from autosync.models import uncertainty
from autosync.datasets import SHIPPED_DATA
from autosync.profiler import Profile
from autosync.profiler.measure import nominal_profile
from autosync.search.baselines import baselines
from autosync.search.collect import context_profile
from autosync.search.space import suggest
from autosync.search.trials import TrialSettings, measure_strategy
from autosync.search.config import TuneConfig
from autosync.search.decide import confirm, settle_efficiency
from autosync.search.result import Measured
from autosync.search.tuner import tune
from autosync.strategy import Strategy
from _results import (RESULTS, check_inputs, Journal, _now, commit, load_rows, measured_by, run_contexts, speedup_bars,
                      write as write_result)
from time_to_loss import fmt_time, time_to_target

ARMS = ("DDP default", "best baseline", "Optuna alone", "tune m0", "tune m8")
CLUSTERS = ["2x1@1gbit", "2x1@1gbit;node1=cpu:0.5", "4x1@1gbit;stragglers=3x@20%", "3x1@200mbit"]


class _References:
    """A read-only view of stores holding only the DDP default's reference rows of one (workload, batch, world):
    what every arm's meter may reuse without seeing any measured efficiency of the workload under test."""

    def __init__(self, stores, keys):
        self.stores, self.keys = stores, set(keys)

    def efficiency_rows(self):
        return {k: r for s in self.stores for k, r in s.efficiency_rows().items() if k in self.keys}


def optuna_alone(pool, profile, n, settings, seed, meter, confirm_rounds, finalists, say) -> tuple[Strategy, str]:
    """TPE on ``n`` measured trials (samples/s), then tune's finalist steps; the pick by measured goodput."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
    measured = []
    for i in range(n):
        trial = study.ask()
        strategy = suggest(trial, profile)
        say(f"Optuna alone: trial {i + 1}/{n} {strategy.hash}")
        r = measure_strategy(pool, profile, strategy, settings)
        study.tell(trial, r.samples_per_s if r.ok else 0.0)
        measured.append(Measured(f"optuna_{i}", strategy, float("nan"), r.status, r.samples_per_s, r.reason,
                                 efficiency_source="lossless" if strategy.is_lossless else "predicted"))
    settle_efficiency(measured, meter, finalists, say)
    confirm(measured, "time-to-loss", confirm_rounds, lambda s: measure_strategy(pool, profile, s, settings), say)
    best = max((m for m in measured if m.value("time-to-loss", True) > 0), key=lambda m: m.value("time-to-loss", True),
               default=None)
    return (best.strategy, best.source) if best else (Strategy.default(), "ddp_default (every trial failed)")


def lowo_models(full, data, wl, seed):
    """The cost model and efficiency model fitted without any row of workload ``wl``."""
    loo = full.subset((full.frame.workload != wl).to_numpy())
    cost = CostModel("regressor").fit(loo.X, loo.log_speedup, loo.relevance, loo.groups(), seed)
    try:
        eff = fit_store(data, seed, without_workload=wl)
    except ValueError:
        eff = EfficiencyModel()
    return loo, cost, eff


def _profile(pool, cluster, ctx, wl, batch, data, work, say) -> Profile:
    """The context's profile: the dataset's, else one profiled here (kept in ``work``)."""
    raw = data.load_profile_dict(ctx)
    return Profile.from_dict(raw) if raw else context_profile(DatasetStore(work / "profiles"), pool, cluster, wl,
                                                              batch, say)


def run_context(pool, cluster, spec, wl, args, data, full, work, settings, say):
    batch = W.default_batch_size(wl)
    row = {"workload": wl, "cluster": spec}
    ctx = Context.on(pool, wl, batch, cluster).id
    profile = _profile(pool, cluster, ctx, wl, batch, data, work, say)
    base, cost_model, eff_model = lowo_models(full, data, wl, args.seed)
    scratch = work / "contexts" / safe_name(ctx)
    shutil.rmtree(scratch, ignore_errors=True)     # an unfinished arm's trials start over; finished steps are kept
    scratch.mkdir(parents=True)
    card = uncertainty.card_without(full, wl)     # the shipped card's calibration and reference saw ``wl``
    refs_store = DatasetStore(work / "references")
    world, rph = cluster.world_size, cluster.ranks_per_node
    with EfficiencyMeter(refs_store, wl, batch, world, rph, also=[data], progress=say) as ref_meter:
        goal = target(ref_meter.references(), ref_meter.horizon)
        start = statistics.fmean(c.eval_loss[0] for c in ref_meter.references())
        keys = [reference_key(str(wl), batch, world, s) for s in range(REFERENCE_SEEDS)]
        refs = _References([refs_store, data], keys)
        noise = ref_meter.noise_scale()
    if is_flat(start, goal):      # the efficiency meter's rule: no time to L* to speak of
        return dict(row, left_out=f"flat: the DDP default's held-out loss falls only {start:.4g} -> {goal:.4g} by L*")
    row["target_loss"] = goal
    journal = Journal(work / "contexts" / f"{safe_name(ctx)}.steps.json",
                      {"goal": goal, "data": str(args.data), "measure": args.measure, "seed": args.seed,
                       "confirm_rounds": args.confirm_rounds, "finalists": args.finalists, "cap": args.cap})
    if journal.resumed:
        say(f"{wl} {spec}: resuming after {', '.join(journal.resumed)} (kept from a stopped run)")

    def meter(arm):
        m = EfficiencyMeter(DatasetStore(work / f"efficiency-{arm.replace(' ', '-')}"), wl, batch, world, rph,
                            also=[refs], progress=say)
        m.on_cluster(pool, cluster.spec())
        return m

    def searched(fn):
        """fn() -> (strategy, source[, why]), timed: what the journal keeps of an arm's search."""
        t0 = time.monotonic()
        strategy, source, *why = fn()
        return {"strategy": strategy.canonical(), "source": source, "search_s": time.monotonic() - t0,
                "why": why[0] if why else None}

    def best_baseline():
        hand = baselines(profile)
        thr = {n: measure_strategy(pool, profile, s, settings) for n, s in hand.items()}
        best = max((n for n in hand if n != "ddp_default" and thr[n].ok), key=lambda n: thr[n].samples_per_s,
                   default="ddp_default")
        return hand[best], best

    def optuna_arm():
        with meter("optuna") as m:
            return optuna_alone(pool, profile, args.measure, settings, args.seed, m, args.confirm_rounds,
                                args.finalists, say)

    def tune_arm(arm, n):
        with meter("tune") as m:
            prof = profile if n else nominal_profile(cluster, wl, batch)
            config = TuneConfig(measure=n, storage=f"sqlite:///{scratch}/{arm.replace(' ', '-')}.db", seed=args.seed,
                                objective="time-to-loss", confirm_rounds=args.confirm_rounds, finalists=args.finalists)
            result = tune(prof, cost_model, config, DatasetStore(scratch / f"trials-{arm.replace(' ', '-')}"),
                          pool if n else None, base, workload=wl, efficiency_model=eff_model, noise_scale=noise,
                          meter=m if n else None, on_progress=say, intervals_card=card)
            return result.strategy, result.source, result.why

    picks = {"DDP default": (Strategy.default(), "ddp_default")}
    search = {"DDP default": 0.0}
    for arm, fn in (("best baseline", best_baseline), ("Optuna alone", optuna_arm),
                    ("tune m0", lambda: tune_arm("tune m0", 0)),
                    ("tune m8", lambda: tune_arm("tune m8", args.measure))):
        kept = journal.step(f"search {arm}", lambda: searched(fn))
        picks[arm], search[arm] = (Strategy.from_dict(kept["strategy"]), kept["source"]), kept["search_s"]
        if arm.startswith("tune"):
            row[f"{arm} why"] = kept["why"]
    timed: dict[str, dict] = {}
    with EfficiencyMeter(refs_store, wl, batch, world, rph, also=[data]) as train_meter:
        def train(name, strategy, cap=None, msg=None):
            def run():
                say(f"{wl} {spec}: {msg}")
                return time_to_target(pool, wl, batch, strategy, goal, train_meter, cap)
            return journal.step(name, run)

        first = train("train default first", Strategy.default(), msg=f"training the DDP default to L* = {goal:.4f}")
        cap = args.cap * (first["time_s"] or first["trained_s"])
        for arm in ARMS[1:]:
            strategy, source = picks[arm]
            if strategy.hash not in timed and strategy.hash != Strategy.default().hash:
                timed[strategy.hash] = train(f"train {strategy.hash}", strategy, cap,
                                             f"training {arm} ({source}) to L*")
        last = train("train default last", Strategy.default(),
                     msg="training the DDP default to L* again (its noise)")
    defaults = [r["time_s"] for r in (first, last) if r["time_s"]]
    default = dict(first, time_s=statistics.median(defaults) if defaults else None, runs=[first, last],
                   spread=(max(defaults) - min(defaults)) / statistics.median(defaults) if len(defaults) > 1 else None)
    timed[Strategy.default().hash] = default
    for arm in ARMS:
        strategy, source = picks[arm]
        row[arm] = {"source": source, "search_s": search[arm], **timed[strategy.hash]}
    if journal.resumed:
        row["resumed_after"] = journal.resumed
        row["resumed_by"] = journal.resumed_by()
    journal.close()
    return row


def failed_arms(row: dict) -> list[str]:
    """The arms of a finished context whose pick's timed training failed (crashed or hung)."""
    return [a for a in ARMS if "left_out" not in row and row[a].get("failed")]


def retrain_failed(pool, cluster, spec, wl, prior, args, data, work, say) -> dict:
    """``prior`` (a finished row) with its failed arms' picks trained to L* again, after a fix to what failed them:
    same L*, the same cap over the default's first time, the arm's search kept. A pick is rebuilt from its source's
    name, so only a hand-crafted baseline's (the searches' picks are not kept in the row). The row keeps who
    measured the rest and says what was retrained, by which code, and why it failed before (``retrained``)."""
    row = json.loads(json.dumps(prior))
    batch = W.default_batch_size(wl)
    profile = _profile(pool, cluster, Context.on(pool, wl, batch, cluster).id, wl, batch, data, work, say)
    hand = baselines(profile)
    first = row["DDP default"]["runs"][0]
    cap = args.cap * (first["time_s"] or first["trained_s"])
    with EfficiencyMeter(DatasetStore(work / "references"), wl, batch, cluster.world_size, cluster.ranks_per_node,
                         also=[data]) as meter:
        for arm in failed_arms(row):
            old = row[arm]
            strategy = hand.get(old["source"])
            if strategy is None or strategy.hash != old["hash"]:
                say(f"{wl} {spec}: {arm}'s pick {old['source']} ({old['hash']}) is not a baseline this code rebuilds "
                    "the same: left FAILED")
                continue
            say(f"{wl} {spec}: training {arm} ({old['source']}) to L* = {row['target_loss']:.4f} again "
                f"(it failed: {old['failed'][:120]})")
            t0 = time.monotonic()
            timed = time_to_target(pool, wl, batch, strategy, row["target_loss"], meter, cap)
            row[arm] = {"source": old["source"], "search_s": old["search_s"], **timed}
            row.setdefault("retrained", {})[arm] = {"by": f"{commit()}, {_now()}", "failed_before": old["failed"],
                                                    "bench_s": time.monotonic() - t0}
    return row


def _x(r, d, e2e=False):
    """The default's median time to L* over the arm's (0 = never reached)."""
    if not r.get("time_s") or not d.get("time_s"):
        return 0.0
    return d["time_s"] / (r["time_s"] + (r["search_s"] if e2e else 0.0))


def _slow(spec):
    return Cluster.parse(spec).slowest_rate_bps <= 1e9


def table(rows, args):
    done = [r for r in rows if "left_out" not in r]
    lines = ["# Time to quality, end to end: tune (measure 8, measure 0) vs the DDP default, the best baseline and "
             "Optuna alone, models retrained without the workload under test", "",
             "Wall-clock seconds of training (evaluations excluded) until the consensus model's smoothed held-out "
             "loss reaches L*, measured on the emulated cluster (2-core CPU host, gloo). train x = the DDP default's "
             "median time / the pick's; e2e x adds the arm's search seconds to the pick's time. LOSSY picks change "
             "the math (compression, local SGD, relaxed sync); their time includes what that costs in convergence. "
             f"'never' = L* not reached within {args.cap:g}x the default's time or 2x the horizon in steps; "
             "FAILED = the pick's training crashed or hung (its reason in rows.jsonl; tune m8's column shows it). "
             "noise = (max - min) / median of the default's two timed runs. Arms: see the script's docstring.", "",
             "| workload | cluster | L* | default s (noise) | best baseline | x | Optuna alone | x | tune m0 | x | "
             "tune m8 | s | train x | search s | e2e x |",
             "|---|---|---:|---:|---|---:|---|---:|---|---:|---|---:|---:|---:|---:|"]
    tag = lambda a: f"{a['source'][:24]} ({'LOSSY' if a['lossy'] else 'lossless'})"  # noqa: E731
    xs = lambda a, d: "FAILED" if a.get("failed") else f"{_x(a, d):.2f}"  # noqa: E731
    for r in done:
        d = r["DDP default"]
        noise = f"{d['spread']:.0%}" if d.get("spread") is not None else "n/a"
        b, o, z, t = (r[a] for a in ARMS[1:])
        lines.append(f"| {r['workload']} | {r['cluster']} | {r['target_loss']:.3f} | {fmt_time(d)} ({noise}) | "
                     f"{tag(b)} | {xs(b, d)} | {tag(o)} | {xs(o, d)} | {tag(z)} | {xs(z, d)} | {tag(t)} | "
                     f"{fmt_time(t)} | {xs(t, d)} | {t['search_s']:.0f} | {_x(t, d, True):.2f} |")
    left = [f"- {r['workload']} on {r['cluster']}: {r['left_out']}" for r in rows if "left_out" in r]
    if left:
        lines += ["", f"Left out ({len(left)}):", "", *left]
    per = collections.Counter(r["workload"] for r in done)
    if per:
        lines += ["", "Clusters measured per workload: " + ", ".join(f"{w} {n}" for w, n in per.items())]

    def ratios(sel, num, den=None):
        out = []
        for r in sel:
            d = r["DDP default"]
            a, b = _x(r[num], d), (_x(r[den], d) if den else 1.0)
            out.append(a / b if b else (math.inf if a else float("nan")))
        return out

    def med(vals):
        vals = [v for v in vals if not math.isnan(v)]
        return f"{statistics.median(vals):.2f}" if vals else "n/a"

    def worst(vals):
        vals = [v for v in vals if not math.isnan(v)]
        return f"{min(vals):.2f}" if vals else "n/a"

    lines += ["", "| clusters | contexts | tune m8 / default | / best baseline | / Optuna alone | / tune m0 | "
              "worst tune m8 / default | e2e tune m8 / default | e2e tune m0 / default | slower than the default beyond its "
              "noise |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, sel in (("<= 1 gbit", [r for r in done if _slow(r["cluster"])]), ("all", done)):
        if not sel:
            continue
        slower = [f"{r['workload']} {r['cluster']}" for r in sel
                  if _x(r["tune m8"], r["DDP default"]) < 1 / (1 + (r["DDP default"].get("spread") or 0.0))]
        lines.append(f"| {label} | {len(sel)} | {med(ratios(sel, 'tune m8'))} | "
                     f"{med(ratios(sel, 'tune m8', 'best baseline'))} | {med(ratios(sel, 'tune m8', 'Optuna alone'))} | "
                     f"{med(ratios(sel, 'tune m8', 'tune m0'))} | {worst(ratios(sel, 'tune m8'))} | "
                     f"{med([_x(r['tune m8'], r['DDP default'], True) for r in sel])} | "
                     f"{med([_x(r['tune m0'], r['DDP default'], True) for r in sel])} | "
                     f"{len(slower)}{': ' + ', '.join(slower) if slower else ''} |")
    lines += ["", "Medians of per-context ratios (a ratio over an arm that never reached L*, or failed, is inf and "
              "counts as a win). One timed training per pick (two for the default): read differences within the "
              "noise column as ties."]
    why = [f"- {r['workload']} {r['cluster']}: {r['tune m8 why']}" for r in done if r.get("tune m8 why")]
    if why:
        lines += ["", "Why tune m8 did not take the fastest-per-step strategy:", "", *why]
    by: dict[str, list[str]] = {}
    for r in done:
        by.setdefault(measured_by(r), []).append(f"{r['workload']} {r['cluster']}")
    lines += ["", "Code that measured each context (its commit; rows.jsonl's `measured_by` has the date, "
              "`resumed_by` each step a stopped run took, `retrained` an arm trained again after a fix, with why it "
              "had failed):", "",
              *(f"- {code}: {', '.join(ctxs)}" for code, ctxs in by.items())]
    return lines


def measure(args, work: Path) -> list[dict]:
    """Measure the contexts of ``args`` not finished in ``work`` (with ``--retrain-failed``: retrain the failed picks of
    the finished ones instead); every finished row of ``args``' contexts."""
    finished = load_rows(work)
    done = set(finished)
    if args.retrain_failed:
        done = {(w, c) for w in args.workloads for c in args.clusters} - {k for k, r in finished.items()
                                                                          if failed_arms(r)}
    data = DatasetStore(args.data, create=False)
    full = training.build(data)
    settings = TrialSettings()
    sizes = model_bytes()

    def say(msg):
        print(f"  {msg}", flush=True)

    def measure_one(pool, cluster, spec, wl, prior):
        if args.retrain_failed:
            return retrain_failed(pool, cluster, spec, wl, prior, args, data, work, say)
        return run_context(pool, cluster, spec, wl, args, data, full, work, settings, say)

    def show(row):
        if "left_out" in row:
            return f"{row['workload']} {row['cluster']}: left out ({row['left_out']})"
        return (f"{row['workload']} {row['cluster']}: " + "  ".join(f"{a} {fmt_time(row[a])}" for a in ARMS)
                + f"  ({row['bench_s']:.0f} s)")

    def leave_out(cluster, wl):
        return ("the default's all-reduce alone is over the campaign's per-step limit on this machine"
                if too_slow(sizes[wl], cluster) else None)

    return run_contexts(args, work, done, measure_one, show, leave_out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", nargs="+", default=list(W.BUILTINS), choices=list(W.BUILTINS), metavar="WORKLOAD")
    ap.add_argument("--clusters", nargs="+", default=None,
                    help="default: the four of the table (%s); with --table-only, those and every other cluster "
                         "with a finished context in --work" % ", ".join(CLUSTERS).replace("%", "%%"))
    ap.add_argument("--data", default=str(SHIPPED_DATA), help="dataset the models are fitted to (less the workload "
                                                              "under test); default: the shipped one")
    ap.add_argument("--measure", type=int, default=8, help="measured trials of tune and of Optuna alone (default 8)")
    ap.add_argument("--confirm-rounds", type=int, default=3, help="as `autosync tune` (default 3)")
    ap.add_argument("--finalists", type=int, default=3, help="as `autosync tune` (default 3)")
    ap.add_argument("--cap", type=float, default=2.0, help="give up on a pick after this many times the default's "
                                                           "time to target (default 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default=str(Path(__file__).parent / "work" / "time_to_quality"),
                    help="resumable work directory (default bench/work/time_to_quality: it outlives a session; git "
                         "keeps its rows.jsonl, the finished contexts, and ignores the rest)")
    ap.add_argument("--out", default=str(RESULTS / "time_to_quality.md"))
    ap.add_argument("--retrain-failed", action="store_true",
                    help="measure no new context: train the FAILED picks of the finished contexts of --workloads x "
                         "--clusters again (after a fix), keeping the rest of each row and saying so in the table")
    ap.add_argument("--table-only", action="store_true",
                    help="measure nothing: write the table and plot of the contexts of --workloads x --clusters "
                         "finished in --work")
    args = ap.parse_args()
    work = check_inputs(ap, args)
    if args.table_only:
        finished = load_rows(work)
        if args.clusters is None:     # the four, then any other a context was measured on (in the order measured)
            args.clusters = list(dict.fromkeys(CLUSTERS + [c for _, c in finished]))
        rows = [finished[(w, c)] for c in args.clusters for w in args.workloads if (w, c) in finished]
    else:
        args.clusters = args.clusters or CLUSTERS
        rows = measure(args, work)
    lines = table(rows, args)
    write_result(args.out, lines)
    print("\n".join(lines))
    (Path(args.out).with_suffix(".json")).write_text(json.dumps(rows, indent=1, default=str))
    _plot([r for r in rows if "left_out" not in r], Path(args.out).with_suffix(".png"))


def _plot(rows, path):
    speedup_bars([f"{r['workload']}\n{r['cluster']}" for r in rows],
                 {a: [_x(r[a], r["DDP default"]) for r in rows] for a in ARMS[1:]},
                 "time-to-target speedup over the DDP default\n(training time; 0 = never reached)", path)


if __name__ == "__main__":
    main()
