"""Tune while you train: `strategy="auto"` end to end against the DDP default and `tune` then train.

Per (workload, cluster) context, on one emulated cluster and one kept-alive rank pool, every arm trains with the
efficiency protocol's recipe (Adam at the workload's learning rate, the same weights, data order and held-out set
per seed) until the consensus model's smoothed held-out loss reaches L* (the DDP default's reference curves' loss at
3/4 of the efficiency horizon), once per timed seed (``--seeds``, default 1 and 2: seeds no reference curve and no
search used):

  DDP default   the lossless reference
  auto          ``autosync.apply(model, optimizer, "auto", zero_shot="lower")``: the default trains a window, the
                model and network are profiled from it, the cost model proposes candidates (lossy ones admitted at the
                lower bound of their predicted efficiency), each trains a window, the best trains the rest. Its exploration (worse
                candidates' windows, the network's collectives, switches, rank 0's prediction thread) is inside its
                time to L*: there is no separate search.
  auto point    the same with ``zero_shot="point"``, ``"auto"``'s default: a lossy candidate judged at its
                efficiency's point estimate (what tune --measure 0 picks by) instead of the lower bound
  auto late     "auto point" with ``lossy_after=24``: no lossy candidate trains a window before step 24 (lossless
                ones first; an early lossy stretch can cost a training much more than its window,
                bench/lossy_window.py)
  tune m0       `tune --measure 0` (prediction-only profile, cost and efficiency models), then its pick trains; the
                profile and prediction time is added (end to end)
  tune m8       (``--arms`` with "tune m8") `tune --measure 8`, then its pick trains; its whole search is added

The cost model (regressor), its intervals and the efficiency model are fitted to ``--data`` less every row of the
workload under test, for every arm ("auto" gets them through its ``predict`` option). The references come from
``--refs`` (default: those of bench/time_to_quality.py, where they exist). A pick that has not reached L* within
``--cap`` times the default's time of the same seed is stopped ("never").

Figures: per arm the median time to L* over the seeds and its spread ((max - min) / median); "auto e2e x" = the
default's median / auto's; "explore" = auto's time lost to exploring (candidates' windows against the best, plus
the time outside steps: profiling, switches, decisions), as a share of its time to L*.

Resumable: each finished context is a line of ``--work``/rows.jsonl and is skipped; each finished (arm, seed)
training of a context in progress is kept in its journal (bench/_results.Journal).

    python bench/online_tuning.py [--workloads ...] [--clusters ...] [--arms ...] [--seeds 1 2]
    python bench/online_tuning.py --again auto "auto point"     # those arms again, the rest kept from the rows
                                                                # (resumes: skips contexts this commit measured)
    python bench/online_tuning.py --table-only
"""
import argparse
import functools
import json
import statistics
from pathlib import Path

from autosync import workloads as W
from autosync.context import Context
from autosync.datasets import SHIPPED_DATA
from autosync.datasets.store import DatasetStore, safe_name
from autosync.efficiency import CurveSpec, is_flat, smooth, target
from autosync.efficiency.meter import EfficiencyMeter
from autosync.executor.launch import TrialFailure
from autosync.models import training, uncertainty
from autosync.profiler.measure import nominal_profile
from autosync.search.config import TuneConfig
from autosync.search.tuner import tune
from autosync.strategy import Strategy
from _online import measure_auto_curve, predict_without
from _results import (RESULTS, beats, card_words, check_inputs, commit, Journal, finished_rows, load_rows,
                      run_contexts, say, SearchClock, show_done, stamp, speedup_bars, write as write_result)
from diloco import train_to
from time_to_quality import lowo_models

WORKLOADS = ["resnet-tiny", "convnext-tiny", "bert-mini", "gpt2-tiny", "vit-tiny", "llama-tiny"]
CLUSTERS = ["2x1@1gbit", "3x1@200mbit", "2x1@1gbit;node1=cpu:0.5"]
LOSSY_AFTER = 24
ARMS = ("DDP default", "auto", "auto point", "auto late", "tune m0", "tune m8")
#: the strategy="auto" arms: their options beside the models and the cluster
AUTOS = {"auto": {"zero_shot": "lower"}, "auto point": {"zero_shot": "point"},
         "auto late": {"zero_shot": "point", "lossy_after": LOSSY_AFTER}}


def train_auto(pool, wl, batch, goal, meter, seed, cap_s, options):
    """Train with ``strategy="auto"`` from ``seed`` until L*: its time, steps and what the tuner did."""
    spec = CurveSpec(wl, Strategy.default().canonical(), batch, 2 * meter.horizon, meter.eval_every, seed, meter.lr,
                     meter.optimizer, signals=False, stop_at=goal, max_train_s=cap_s)
    try:
        curve, auto = measure_auto_curve(pool, spec, options, 600.0 + 3 * (cap_s or 600.0))
    except TrialFailure as f:
        pool.start()
        return {"time_s": None, "failed": f"{f.status}: {f.reason}"[:300], "steps": 0}
    return {"time_s": curve.time_to(goal), "steps": curve.steps[-1], "trained_s": curve.train_s[-1],
            "reached": min(smooth(curve.eval_loss)), "auto": auto}


def _seed_journal(journal, prior: dict, args) -> list[str]:
    """``--again``: the arms of a finished context's row ``prior`` that are not measured again, as finished steps of
    ``journal`` (the DDP default's and the tune arms' trainings and searches); returns the arms measured again."""
    again = [a for a in args.again if a in args.arms or a == "DDP default"]
    for seed in args.seeds:
        if "DDP default" not in again:
            journal.steps.setdefault(f"train DDP default seed {seed}", prior["DDP default"]["runs"][str(seed)])
        for arm in (a for a in args.arms if a not in again and a in prior):
            if arm.startswith("tune"):
                journal.steps.setdefault(f"search {arm}", {k: prior[arm][k] for k in ("source", "lossy", "search_s")}
                                         | {"strategy_hash": prior[arm]["hash"], "pick": prior[arm].get("pick")})
            journal.steps.setdefault(f"train {arm} seed {seed}", prior[arm]["runs"][str(seed)])
    return again


def run_context(pool, cluster, spec, wl, args, data, full, work, say, prior=None):
    batch = W.default_batch_size(wl)
    row = {"workload": wl, "cluster": spec}
    ctx = Context.on(pool, wl, batch, cluster).id
    refs = DatasetStore(args.refs)
    with EfficiencyMeter(refs, wl, batch, cluster.world_size, cluster.ranks_per_node, also=[data],
                         progress=say) as meter:
        curves = meter.references()
        goal, start = target(curves, meter.horizon), statistics.fmean(c.eval_loss[0] for c in curves)
        if is_flat(start, goal):
            return dict(row, left_out=f"flat: the DDP default's held-out loss falls only {start:.4g} -> {goal:.4g}")
        row["target_loss"] = goal
        noise = meter.noise_scale()
        journal = Journal(work / "contexts" / f"{safe_name(ctx)}.steps.json",
                          {"goal": goal, "seeds": args.seeds, "cap": args.cap, "arms": args.arms})
        if args.again and prior is not None and "left_out" not in prior:
            again = _seed_journal(journal, prior, args)
            kept = arm_provenance(prior)
            row["arm_measured_by"] = {a: stamp() if a in again else kept.get(a, "not recorded")
                                      for a in ARMS if a in again or a in prior}
        base, cost_model, eff_model = lowo_models(full, data, wl, 0)
        card = uncertainty.card_without(full, wl)
        again_only = bool(args.again and prior is not None)   # the arms measured here read ``card``; kept ones did not
        row["held_out_card"] = sorted(set(prior.get("held_out_card", [])) | set(args.again) if again_only
                                      else set(args.arms))
        # zero_shot: the rule the tuner names (its predict judges by it)
        options = {arm: {"cluster": spec, "network": "emulated", "out": None, "data": None, "report": None, **extra,
                         "predict": functools.partial(predict_without, cost_model, eff_model, base, card,
                                                      "time-to-loss", extra["zero_shot"])}
                   for arm, extra in AUTOS.items()}
        picks = {}
        for arm in (a for a in args.arms if a.startswith("tune")):
            kept = journal.step(f"search {arm}", lambda a=arm: _tune(pool, cluster, wl, batch, a, args, base,
                                                                       cost_model, eff_model, noise, card, work, ctx,
                                                                       refs, say))
            picks[arm] = kept
            row[arm] = {"hash": kept["strategy_hash"], "pick": kept.get("pick"),
                        "source": kept["source"], "lossy": kept["lossy"], "search_s": kept["search_s"], "runs": {}}
        row["DDP default"] = {"runs": {}}
        autos = [a for a in AUTOS if a in args.arms]
        for arm in autos:
            row[arm] = {"runs": {}}
        for seed in args.seeds:
            say(f"{wl} {spec}: training the DDP default from seed {seed} to L* = {goal:.4f}")
            base_run = journal.step(f"train DDP default seed {seed}", lambda s=seed: train_to(
                pool, wl, batch, Strategy.default(), goal, meter, s, None))
            row["DDP default"]["runs"][str(seed)] = base_run
            cap = args.cap * (base_run["time_s"] or base_run.get("trained_s") or 600.0)
            for arm in autos:
                say(f"{wl} {spec}: training with strategy=\"auto\" ({arm}) from seed {seed}")
                row[arm]["runs"][str(seed)] = journal.step(f"train {arm} seed {seed}", lambda s=seed, a=arm:
                                                           train_auto(pool, wl, batch, goal, meter, s, cap,
                                                                      options[a]))
            for arm, kept in picks.items():
                say(f"{wl} {spec}: training {arm}'s pick ({kept['source']}) from seed {seed}")
                row[arm]["runs"][str(seed)] = journal.step(f"train {arm} seed {seed}", lambda k=kept, sd=seed:
                                                           train_to(pool, wl, batch, Strategy.from_dict(k["strategy"]),
                                                                    goal, meter, sd, cap))
    journal.close()
    if args.again and prior is not None and "left_out" not in prior:
        for arm in (a for a in ARMS if a in prior and a not in row):   # arms not in --arms: kept as they were
            row[arm] = prior[arm]
    return row


def _tune(pool, cluster, wl, batch, arm, args, base, cost_model, eff_model, noise, card, work, ctx, refs, say):
    """``tune --measure 0`` (prediction-only profile) or ``--measure 8`` by time to loss with the models fitted
    without ``wl``; the pick and the search's whole time (the profile's included)."""
    from autosync.search.collect import context_profile

    n = 0 if arm == "tune m0" else 8
    scratch = work / "contexts" / safe_name(ctx)
    scratch.mkdir(parents=True, exist_ok=True)
    # tune m0 (seconds, nothing to resume) searches a fresh study: TPE's proposals, and so its pick, must not depend
    # on the trials an earlier run of this bench added; tune m8's study is kept, so that a search cut short resumes,
    # and its clock with it (a stopped run's time belongs to the search whose trials it measured)
    study = scratch / f"{arm.replace(' ', '-')}.db"
    clock_path = study.with_suffix(".search_clock.json")
    if n == 0:
        study.unlink(missing_ok=True)
        clock_path.unlink(missing_ok=True)
    with SearchClock(clock_path) as clock:
        profile = nominal_profile(cluster, wl, batch) if n == 0 else context_profile(
            DatasetStore(scratch / "profiles"), pool, cluster, wl, batch, say)
        config = TuneConfig(measure=n, storage=f"sqlite:///{study}", objective="time-to-loss")
        with EfficiencyMeter(DatasetStore(work / "efficiency-tune"), wl, batch, cluster.world_size,
                             cluster.ranks_per_node, also=[refs], progress=say) as meter:
            if n:
                meter.on_cluster(pool, cluster.spec())
            result = tune(profile, cost_model, config, DatasetStore(scratch / f"trials-{arm.replace(' ', '-')}"),
                          pool if n else None, base, workload=wl, efficiency_model=eff_model, noise_scale=noise,
                          meter=meter if n else None, on_progress=say, intervals_card=card)
    return {"strategy": result.strategy.canonical(), "strategy_hash": result.strategy.hash,
            "pick": result.strategy.summary(),
            "source": result.source, "lossy": not result.strategy.is_lossless, "search_s": clock.total_s(),
            "search_runs": clock.runs}


def e2e(arm: dict) -> tuple[float | None, float | None]:
    """(median over the seeds of the arm's time to L* plus its search, spread); None if a seed never reached it."""
    times = [r.get("time_s") for r in arm["runs"].values()]
    if not times or any(t is None for t in times):
        return None, None
    times = [t + arm.get("search_s", 0.0) for t in times]
    med = statistics.median(times)
    return med, (max(times) - min(times)) / med if med else 0.0


def explore_share(arm: dict) -> float | None:
    """auto's time lost to exploring over its time to L*, median over the seeds."""
    shares = [(r["auto"]["lost_s"] + r["auto"]["overhead_s"]) / r["time_s"] for r in arm["runs"].values()
              if r.get("time_s") and r.get("auto")]
    return statistics.median(shares) if shares else None


def _cell(arm: dict | None, default: dict) -> str:
    if not arm:
        return "-"
    t, spread = e2e(arm)
    d, _ = e2e(default)
    if t is None:
        return "FAILED" if any(r.get("failed") for r in arm["runs"].values()) else "never"
    return f"{t:.0f} s +-{spread / 2:.0%}" + (f" ({d / t:.2f}x)" if d else "")


def steps_table(rows: list[dict]) -> list[str]:
    """Where auto point's time went, in steps: per seed the steps the DDP default and auto point took to L*, the
    steps of auto point's windows of lossy candidates, and whether it committed to a lossy one. A lossless commit
    after lossy windows that needed more steps than the default shows what leaving a local mode cost the
    training's convergence (beyond the seeds' own spread: the default's steps of its two seeds)."""
    if not rows:
        return []
    lines = ["", "Steps to L* per seed (held-out loss read every 20 steps): the DDP default's, auto point's, and the "
                 "steps of auto point's windows of lossy candidates (its exploration; a lossy commit trains the "
                 "rest). guard: the step at which the loss guard left a lossy commit whose training loss made no "
                 "progress (from the lossy commit's step), - where it did not.", "",
             "| workload | cluster | seed | default steps | auto point steps | lossy windows' steps | committed | guard |",
             "|---|---|---:|---:|---:|---:|---|---|"]
    for r in rows:
        default = r["DDP default"]["runs"]
        for seed, run in sorted(r["auto point"]["runs"].items()):
            a = run.get("auto") or {}
            lossy = sum(w["steps"] for w in a.get("windows", []) if "LOSSY" in w["strategy"])
            committed = "lossy" if "LOSSY" in (a.get("committed_summary") or "") else "lossless"
            back = a.get("reverted")
            guard = f"{back['step']} (from {back['committed_at']})" if back else "-"
            lines.append(f"| {r['workload']} | {r['cluster']} | {seed} | {default.get(seed, {}).get('steps', '-')} | "
                         f"{run.get('steps', '-')} | {lossy} | {committed} | {guard} |")
    return lines


def table(rows: list[dict], arms) -> list[str]:
    lines = ['# Tune while you train: `strategy="auto"` end to end against the DDP default and tune then train', "",
             "Median time to L* over the timed seeds, end to end (a tune arm's search added; auto's exploration is "
             "inside its training), +- half the spread, and in parentheses the DDP default's median over it. Models "
             "fitted without the workload under test (the interval card: each context's line at the end says). "
             "explore = auto point's (strategy=\"auto\"'s default rule) time lost to exploring (worse candidates' windows against the best, profiling, switches, decisions) / its "
             "time to L*. LOSSY: the pick changes "
             "the math; its time to L* includes what that costs.", "",
             "| workload | cluster | L* | " + " | ".join(arms) + " | auto committed to (any arm) | explore |",
             "|---|---|---:|" + "---:|" * len(arms) + "---|---:|"]
    for r in rows:
        if "left_out" in r:
            lines.append(f"| {r['workload']} | {r['cluster']} | left out: {r['left_out']} |" + " |" * (len(arms) + 1))
            continue
        commits = {run["auto"]["committed_summary"] or "(not committed)" for a in AUTOS
                   for run in r.get(a, {}).get("runs", {}).values() if run.get("auto")}
        share = explore_share(r["auto point"]) if "auto point" in r else None
        lines.append(f"| {r['workload']} | {r['cluster']} | {r['target_loss']:.3f} | "
                     + " | ".join(_cell(r.get(a), r["DDP default"]) for a in arms)
                     + f" | {'; '.join(sorted(commits))[:120] or '-'} | "
                     + (f"{share:.1%}" if share is not None else "-") + " |")
    done = [r for r in rows if "left_out" not in r and any(a in r for a in AUTOS)]
    if done:
        def x(r, a):
            t, d = e2e(r[a])[0], e2e(r["DDP default"])[0]
            return (d / t) if t and d else 0.0

        lines += ["", "| figure | value | contexts |", "|---|---:|---:|"]
        for arm in AUTOS:       # "auto point" is strategy="auto"'s default
            sel = [r for r in done if arm in r]
            if not sel:
                continue
            lines.append(f"| {arm} end to end / DDP default (median) | "
                         f"{statistics.median([x(r, arm) for r in sel]):.2f}x | {len(sel)} |")
            for other in (a for a in arms if a.startswith("tune")):
                both = [r for r in sel if other in r]
                if both:
                    beat = sum(x(r, arm) >= x(r, other) for r in both)
                    lines.append(f"| {arm} end to end >= {other} end to end | {beat} of {len(both)} | {len(both)} |")
                    lost = [f"{r['workload']} {r['cluster']}" for r in both if beats(e2e(r[other]), e2e(r[arm]))]
                    lines.append(f"| {arm} end to end beaten by {other} beyond the larger spread | {len(lost)}"
                                 f"{': ' + ', '.join(lost) if lost else ''} | {len(both)} |")
            shares = [v for v in (explore_share(r[arm]) for r in sel) if v is not None]
            if shares:
                lines.append(f"| {arm}'s exploration / its time to L* (median; max) | {statistics.median(shares):.1%}; "
                             f"{max(shares):.1%} | {len(shares)} |")
            slower = []
            for r in sel:
                (a, _), (d, sd) = e2e(r[arm]), e2e(r["DDP default"])
                if a is None or (d is not None and a > d * (1 + (sd or 0.0))):
                    slower.append(f"{r['workload']} {r['cluster']}")
            lines.append(f"| {arm} slower than the default beyond the default's spread | {len(slower)}"
                         f"{': ' + ', '.join(slower) if slower else ''} | {len(sel)} |")
        for other in (a for a in arms if a.startswith("tune")):
            sel = [r for r in done if other in r]
            if sel:
                lines.append(f"| {other} end to end / DDP default (median) | "
                             f"{statistics.median([x(r, other) for r in sel]):.2f}x | {len(sel)} |")
    lines += steps_table([r for r in done if "auto point" in r])
    lines += ["", "Code that measured each arm (commit, date its trainings were stored), per context:", ""]
    for r in rows:
        by: dict[str, list[str]] = {}
        provenance = arm_provenance(r)
        for arm, code in provenance.items():
            by.setdefault(code, []).append(arm)
        lines.append(f"- {r['workload']} {r['cluster']}: "
                     + "; ".join(f"{', '.join(arms)}: {code}" for code, arms in by.items())
                     + f"; {card_words(r, [a for a in provenance if a != 'DDP default'])}")
    return lines


def arm_provenance(row: dict) -> dict[str, str]:
    """Who measured each arm of ``row`` ("commit, date"), by arm. A row measured in one run has one ``measured_by``;
    one whose arms were measured again (``--again``) has ``arm_measured_by``, or, stored before it, a
    ``measured_by`` of the form "X (arms); the rest Y (arms); ...; the rest Z": an arm belongs to the first part
    that names it, the others to the last."""
    arms = [a for a in ARMS if a in row]
    out = dict(row.get("arm_measured_by", {}))
    parts = row.get("measured_by", "not recorded").split("; the rest ")
    for part in parts[:-1]:
        code, _, named = part.partition(" (")
        for a in named.rstrip(")").split(", "):
            if a in arms:
                out.setdefault(a, code)
    return {a: out.get(a, parts[-1]) for a in arms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", nargs="+", default=WORKLOADS, choices=list(W.BUILTINS), metavar="WORKLOAD")
    ap.add_argument("--clusters", nargs="+", default=CLUSTERS)
    ap.add_argument("--arms", nargs="+", default=list(ARMS[1:]), choices=list(ARMS[1:]),
                    help="arms beside the DDP default (default: all)")
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2], help="timed seeds (default 1 2)")
    ap.add_argument("--cap", type=float, default=2.0, help="stop a pick after this many times the default's time "
                                                           "(default 2)")
    ap.add_argument("--data", default=str(SHIPPED_DATA))
    ap.add_argument("--refs", default=str(Path(__file__).parent / "work" / "time_to_quality" / "references"),
                    help="the store of the DDP default's reference curves (measured there when missing)")
    ap.add_argument("--work", default=str(Path(__file__).parent / "work" / "online_tuning"))
    ap.add_argument("--out", default=str(RESULTS / "online_tuning.md"))
    ap.add_argument("--table-only", action="store_true", help="measure nothing: the table of the finished contexts")
    ap.add_argument("--again", nargs="+", default=[], choices=list(ARMS), metavar="ARM",
                    help="measure these arms of the finished contexts again (the new code's), keeping the others' "
                         "trainings and searches from their rows; an arm's ratios to the default are fair only "
                         "where both were measured on the same machine: measure \"DDP default\" again with them "
                         "on another")
    args = ap.parse_args()
    work = check_inputs(ap, args)
    arms = ["DDP default", *[a for a in ARMS[1:] if a in args.arms]]
    if args.table_only:
        rows = finished_rows(work, args)
        arms = ["DDP default", *[a for a in ARMS[1:] if any(a in r for r in rows)]]
    else:
        data = DatasetStore(args.data, create=False)
        full = training.build(data)

        # with --again, a context is done once the checkout's code measured every arm named (an interrupted run
        # resumes); without, once it has a row
        code = commit()
        done = {k for k, r in load_rows(work).items()
                if not args.again or all(arm_provenance(r).get(a, "").startswith(code + ",") for a in args.again)}
        rows = run_contexts(args, work, done,
                            lambda pool, cluster, spec, wl, prior: run_context(pool, cluster, spec, wl, args, data,
                                                                               full, work, say, prior), show_done)
    lines = table(rows, arms)
    write_result(args.out, lines)
    print("\n".join(lines))
    Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=1, default=str))
    done = [r for r in rows if "left_out" not in r]
    if done:
        speedup_bars([f"{r['workload']}\n{r['cluster']}" for r in done],
                     {a: [(e2e(r["DDP default"])[0] or 0) / e2e(r[a])[0] if a in r and e2e(r[a])[0] else 0.0
                          for r in done] for a in arms[1:]},
                     "time-to-target speedup over the DDP default, end to end\n(median of seeds; 0 = never reached)",
                     Path(args.out).with_suffix(".png"))


if __name__ == "__main__":
    main()
