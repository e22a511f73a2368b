"""The low-communication family on slow links: time to the target loss of DiLoCo and streaming DiLoCo against
the DDP default, local SGD, PowerSGD and (optionally) tune's pick, with the bytes each sends per step.

Per (workload, cluster) context, on one emulated cluster and one kept-alive rank pool:

  DDP default        the lossless reference
  local_sgd_4        post-local SGD, averaging every 4 steps (the hand-crafted baseline)
  local_sgd_8        plain parameter averaging every 8 steps: DiLoCo's period without its outer optimizer
  powersgd_r4        PowerSGD rank 4 with error feedback
  diloco             DiLoCo: every 8 steps the averaged pseudo-gradient through an outer Nesterov SGD (lr 0.7,
                     momentum 0.9), the paper's outer optimizer (autosync.search.baselines)
  streaming_diloco   the same period in two staggered fragments, each overlapping one inner step, mixed half and
                     half, pseudo-gradients as 4-bit floats
  tune m8            (with ``--tune``) `tune --measure 8` by time to loss, its models fitted to ``--data`` less the
                     workload under test; its search time is reported beside its training time. The efficiencies
                     its searches measure are kept in ``--work``/efficiency-tune, as a user's store keeps them:
                     a workload's later contexts with the same number of ranks reuse them, so its first pays most

Every arm first runs one throughput trial on the cluster (samples/s and bytes sent per step and rank, measured at
the hosts' interfaces), then trains with the efficiency protocol's recipe (Adam at the workload's learning rate)
until the consensus model's smoothed held-out loss reaches L* (the DDP default's reference curves' loss at 3/4 of
the efficiency horizon), once per timed seed (``--seeds``, default 1 and 2: seeds no reference curve and no search
used; each seed gives the weights, data order and held-out set). A pick that has not reached L* after ``--cap``
times the default's time (of the same seed) is stopped: time "never". Figures are medians over the seeds, with the
spread (max - min) / median; one arm beats another only beyond the larger of the two spreads.

Resumable: each finished context is a line of ``--work``/rows.jsonl and is skipped; each finished (arm, seed)
training of a context in progress is kept in its journal (bench/_results.Journal). With ``--tune``, a finished
context that has no tune m8 arm gets one: only that arm runs (the default's times of its row set the cap), and the
row says who measured it and when.

    python bench/diloco.py [--workloads ...] [--clusters ...] [--seeds 1 2] [--tune] [--work DIR]
    python bench/diloco.py --table-only
"""
import argparse
import json
import statistics
from pathlib import Path

from autosync import workloads as W
from autosync.context import Context
from autosync.datasets import SHIPPED_DATA
from autosync.datasets.store import DatasetStore, safe_name
from autosync.efficiency import CurveSpec, is_flat, smooth, target
from autosync.efficiency.meter import EfficiencyMeter
from autosync.efficiency.train import measure_curve
from autosync.executor.launch import TrialFailure
from autosync.search.baselines import baselines
from autosync.search.trials import TrialSettings, measure_strategy
from autosync.strategy import Strategy
from _results import (RESULTS, beats, card_words, check_inputs, Journal, finished_rows, load_rows, measured_by,
                      run_contexts, say, SearchClock, show_done, speedup_bars, stamp, write as write_result)

WORKLOADS = ["gpt2-tiny", "llama-tiny", "t5-tiny", "lstm-lm", "resnet-tiny"]
CLUSTERS = ["2x1@100mbit", "3x1@200mbit", "4x1@100mbit"]
EXTRA = {"local_sgd_8": {"sync": {"mode": "local_sgd", "period": 8, "warmup_steps": 2}}}
ARMS = ("DDP default", "local_sgd_4", "local_sgd_8", "powersgd_r4", "diloco", "streaming_diloco", "tune m8")


def arm_strategies(profile) -> dict[str, Strategy]:
    hand = baselines(profile)
    out = {"DDP default": hand["ddp_default"]}
    for name in ARMS[1:-1]:
        out[name] = hand[name] if name in hand else Strategy.from_dict(EXTRA[name])
    return out


def train_to(pool, wl, batch, strategy, goal, meter, seed, cap_s):
    """Train ``strategy`` with the efficiency protocol's recipe from ``seed`` until L*; its time and steps."""
    spec = CurveSpec(wl, strategy.canonical(), batch, 2 * meter.horizon, meter.eval_every, seed, meter.lr,
                     meter.optimizer, signals=False, stop_at=goal, max_train_s=cap_s)
    try:
        curve = measure_curve(pool, spec, 600.0 + 3 * (cap_s or 600.0))
    except TrialFailure as f:
        pool.start()
        return {"time_s": None, "failed": f"{f.status}: {f.reason}"[:300], "steps": 0}
    t = curve.time_to(goal)
    return {"time_s": t, "steps": curve.steps[-1], "trained_s": curve.train_s[-1],
            "reached": min(smooth(curve.eval_loss))}


def run_context(pool, cluster, spec, wl, args, data, work, settings, say, prior=None):
    """A context's row; ``prior``: its finished row, whose arms are kept (only the arms it lacks run)."""
    from autosync.profiler import Profile
    from autosync.search.collect import context_profile

    batch = W.default_batch_size(wl)
    row = {**prior, "measured_by": prior.get("measured_by", "not recorded")} if prior else {}
    row.update(workload=wl, cluster=spec)
    ctx = Context.on(pool, wl, batch, cluster).id
    raw = data.load_profile_dict(ctx)
    profile = Profile.from_dict(raw) if raw else context_profile(DatasetStore(work / "profiles"), pool, cluster, wl,
                                                                 batch, say)
    refs = DatasetStore(work / "references")
    with EfficiencyMeter(refs, wl, batch, cluster.world_size, cluster.ranks_per_node, also=[data],
                         progress=say) as meter:
        curves = meter.references()
        goal, start = target(curves, meter.horizon), statistics.fmean(c.eval_loss[0] for c in curves)
        if is_flat(start, goal):
            return dict(row, left_out=f"flat: the DDP default's held-out loss falls only {start:.4g} -> {goal:.4g}")
        if prior and abs(prior["target_loss"] - goal) > 1e-9 * abs(goal):
            raise SystemExit(f"{wl} {spec}: the references now give L* = {goal:.6g}, its finished row "
                             f"{prior['target_loss']:.6g}: a new arm would not be comparable; measure the context "
                             f"again in a new --work")
        row["target_loss"] = goal
        journal = Journal(work / "contexts" / f"{safe_name(ctx)}.steps.json",
                          {"goal": goal, "seeds": args.seeds, "cap": args.cap})   # the tune arm is a step of its own
        arms = arm_strategies(profile)
        if args.tune and "tune m8" not in row:
            found = journal.step("search tune m8", lambda: _tune(pool, profile, wl, args, data, work, ctx, say))
            arms["tune m8"] = Strategy.from_dict(found["strategy"])
            row["tune m8 search_s"], row["tune m8 source"] = found["search_s"], found["source"]
            if found.get("search_note"):
                row["tune m8 search_note"] = found["search_note"]
            row["held_out_card"] = ["tune m8"] if found.get("card") == "held out" else []
            if prior:
                row["tune m8 measured_by"] = stamp()
        for arm, strategy in arms.items():
            if arm in row:      # a finished row's arm: kept
                continue
            def probe(s=strategy, a=arm):
                say(f"{wl} {spec}: {a}: throughput and bytes")
                r = measure_strategy(pool, profile, s, settings)
                return {"samples_per_s": r.samples_per_s if r.ok else None, "sent": r.sent_bytes_per_step,
                        "status": r.status}
            row[arm] = {"hash": strategy.hash, "lossy": not strategy.is_lossless,
                        **journal.step(f"probe {arm}", probe), "runs": {}}
        for seed in args.seeds:
            base = row["DDP default"]["runs"].get(str(seed)) or journal.step(
                f"train DDP default seed {seed}",
                lambda s=seed: train_to(pool, wl, batch, arms["DDP default"], goal, meter, s, None))
            row["DDP default"]["runs"][str(seed)] = base
            cap = args.cap * (base["time_s"] or base.get("trained_s") or 600.0)
            for arm, strategy in arms.items():
                if arm == "DDP default" or str(seed) in row[arm]["runs"]:
                    continue
                say(f"{wl} {spec}: training {arm} from seed {seed} to L* = {goal:.4f}")
                row[arm]["runs"][str(seed)] = journal.step(f"train {arm} seed {seed}", lambda s=strategy, sd=seed:
                                                           train_to(pool, wl, batch, s, goal, meter, sd, cap))
    if journal.resumed:
        row["resumed_by"] = journal.resumed_by()    # the steps a stopped run took, each with who ran it
    journal.close()
    return row


def _tune(pool, profile, wl, args, data, work, ctx, say):
    """tune --measure 8 by time to loss, its regressor, efficiency model and interval card built without ``wl``."""
    from autosync.models import training, uncertainty
    from autosync.search.config import TuneConfig
    from autosync.search.tuner import tune
    from time_to_quality import lowo_models

    full = training.build(data)
    base, cost_model, eff_model = lowo_models(full, data, wl, 0)
    scratch = work / "contexts" / safe_name(ctx)
    scratch.mkdir(parents=True, exist_ok=True)
    card = uncertainty.card_without(full, wl)       # before the clock: a user's tune reads a shipped card
    clock = SearchClock(scratch / "search_clock.json")
    with clock, EfficiencyMeter(DatasetStore(work / "efficiency-tune"), wl, profile.model.batch_size,
                                profile.cluster.world_size, profile.cluster.ranks_per_node,
                                also=[DatasetStore(work / "references")], progress=say) as meter:
        config = TuneConfig(measure=8, storage=f"sqlite:///{scratch}/tune.db", objective="time-to-loss")
        result = tune(profile, cost_model, config, DatasetStore(scratch / "trials"), pool, base, workload=wl,
                      efficiency_model=eff_model, meter=meter, on_progress=say, intervals_card=card)
    return {"strategy": result.strategy.canonical(), "source": result.source, "search_s": clock.total_s(),
            "search_runs": clock.runs, "card": "held out"}


def summary(arm: dict) -> tuple[float | None, float | None, int]:
    """(median time to L* over the seeds or None if any seed never reached it, spread, seeds)."""
    times = [r.get("time_s") for r in arm["runs"].values()]
    if not times or any(t is None for t in times):
        return None, None, len(times)
    med = statistics.median(times)
    return med, (max(times) - min(times)) / med if med else 0.0, len(times)


def _fmt(arm: dict | None, default: dict) -> str:
    if not arm:
        return "-"
    t, spread, n = summary(arm)
    d, _, _ = summary(default)
    if t is None:
        return "never" if not any(r.get("failed") for r in arm["runs"].values()) else "FAILED"
    x = f" ({d / t:.2f}x)" if d else ""
    return f"{t:.0f} s +-{spread / 2:.0%}{x}"


def _date(row: dict) -> str:
    """The date a context's row was stored (from its ``measured_by``: "commit, date")."""
    return row.get("measured_by", "not recorded").rpartition(", ")[2]


def table(rows: list[dict]) -> list[str]:
    arms = [a for a in ARMS if any(a in r for r in rows)]
    lines = ["# DiLoCo, streaming DiLoCo and the hand-crafted baselines: time to the target loss on slow links", "",
             "Median time to L* over the timed seeds (+- half the spread), and in parentheses the DDP default's median "
             "over it; 'never': some seed did not reach L* within the cap. MB = megabytes one rank sent to other "
             "hosts per step (measured at the emulated hosts' interfaces, one throughput trial); tune m8's search time "
             "is beside its training time, not in it. In the comparisons below, an arm that never reached L* counts as "
             "0x (the lowest ratio: a median falls on it only when half the contexts never reached L*).", "",
             "| workload | cluster | " + " | ".join(arms) + " |", "|---|---|" + "---:|" * len(arms)]
    for r in rows:
        if "left_out" in r:
            lines.append(f"| {r['workload']} | {r['cluster']} | left out: {r['left_out']} |" + " |" * (len(arms) - 1))
            continue
        cells = []
        for a in arms:
            arm = r.get(a)
            mb = f", {arm['sent'] / 1e6:.2f} MB" if arm and arm.get("sent") else ""
            search = (f", search {r['tune m8 search_s']:.0f} s" + ("*" if r.get("tune m8 search_note") else "")
                      if a == "tune m8" and r.get("tune m8 search_s") else "")
            cells.append(_fmt(arm, r["DDP default"]) + mb + search)
        lines.append(f"| {r['workload']} | {r['cluster']} | " + " | ".join(cells) + " |")
    done = [r for r in rows if "left_out" not in r]

    def ratio(r, num, den):
        a, b = summary(r[num])[0], summary(r[den])[0]
        if a is None:
            return 0.0
        return (b / a) if b else float("inf")

    if done:
        lines += ["", "| comparison | median | contexts where the first wins beyond both spreads | contexts |",
                  "|---|---:|---:|---:|"]
        for num, den in (("diloco", "local_sgd_8"), ("diloco", "DDP default"), ("streaming_diloco", "DDP default"),
                         ("diloco", "powersgd_r4"), ("tune m8", "DDP default")):
            sel = [r for r in done if num in r and den in r]
            if not sel:
                continue
            wins = sum(beats(summary(r[num]), summary(r[den])) for r in sel)
            lines.append(f"| {num} / {den} (time to L*, higher = first faster) | "
                         f"{statistics.median([ratio(r, num, den) for r in sel]):.2f}x | {wins} | {len(sel)} |")
        sel = [r for r in done if "tune m8" in r]
        if sel:   # the target: tune's pick against the best baseline of its context (DiLoCo's included)
            ratios, wins = [], 0
            for r in sel:
                best = min((summary(r[a]) for a in ARMS[:-1] if a in r and summary(r[a])[0] is not None),
                           key=lambda t: t[0], default=(None, None, 0))
                a = summary(r["tune m8"])[0]
                ratios.append(0.0 if a is None else best[0] / a if best[0] else float("inf"))
                wins += beats(summary(r["tune m8"]), best)
            lines.append(f"| tune m8 / the best baseline of its context (training only) | "
                         f"{statistics.median(ratios):.2f}x | {wins} | {len(sel)} |")
        lines += ["", "Code that measured each context (commit, date its row was stored):", "",
                  *(f"- {r['workload']} {r['cluster']}: {measured_by(r)}, {_date(r)}"
                    + (f"; tune m8 added by {r['tune m8 measured_by']}" if r.get("tune m8 measured_by") else "")
                    + (f"; tune m8 picked `{r['tune m8 source']}`" if r.get("tune m8 source") else "")
                    + (f"; {card_words(r, ['tune m8'])}" if "tune m8" in r else "")
                    + (f"; *search time: {r['tune m8 search_note']}" if r.get("tune m8 search_note") else "")
                    for r in done)]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", nargs="+", default=WORKLOADS, choices=list(W.BUILTINS), metavar="WORKLOAD")
    ap.add_argument("--clusters", nargs="+", default=CLUSTERS)
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2], help="timed seeds (default 1 2)")
    ap.add_argument("--cap", type=float, default=2.0, help="stop a pick after this many times the default's time "
                                                           "(default 2)")
    ap.add_argument("--tune", action="store_true", help="add the arm tune m8 (regressor, efficiency model and "
                                                        "interval card built without the workload)")
    ap.add_argument("--data", default=str(SHIPPED_DATA))
    ap.add_argument("--work", default=str(Path(__file__).parent / "work" / "diloco"))
    ap.add_argument("--out", default=str(RESULTS / "diloco.md"))
    ap.add_argument("--table-only", action="store_true", help="measure nothing: the table of the finished contexts")
    args = ap.parse_args()
    work = check_inputs(ap, args)
    if args.table_only:
        rows = finished_rows(work, args)
    else:
        data = DatasetStore(args.data, create=False)
        settings = TrialSettings()

        finished = load_rows(work)     # a finished context without tune m8 is measured again for it alone
        done = {k for k, r in finished.items() if not (args.tune and "left_out" not in r and "tune m8" not in r)}
        rows = run_contexts(args, work, done,
                            lambda pool, cluster, spec, wl, prior: run_context(pool, cluster, spec, wl, args, data,
                                                                               work, settings, say, prior), show_done)
    lines = table(rows)
    write_result(args.out, lines)
    print("\n".join(lines))
    Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=1, default=str))
    done = [r for r in rows if "left_out" not in r]
    if done:
        arms = [a for a in ARMS[1:] if any(a in r for r in done)]
        speedup_bars([f"{r['workload']}\n{r['cluster']}" for r in done],
                     {a: [(summary(r["DDP default"])[0] or 0) / summary(r[a])[0]
                          if a in r and summary(r[a])[0] else 0.0 for r in done] for a in arms},
                     "time-to-target speedup over the DDP default\n(median of seeds; 0 = never reached)",
                     Path(args.out).with_suffix(".png"))


if __name__ == "__main__":
    main()
