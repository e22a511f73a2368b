"""The seed systems' per-layer ideas against the DDP default and the best other strategy (issue 16).

``--part sfb`` (default): sufficient-factor broadcasting (plan sfb). Per (workload, cluster), on one emulated cluster: the DDP default, ``poseidon`` (sfb where Poseidon's rule
says so, from the profile's factor rows; all-reduce elsewhere), ``sfb all`` (every fully connected weight by
sfb) and the other lossless hand-crafted baselines of ``--others``, measured in interleaved rounds (median step time per
arm). sfb is lossless: its training trajectory is DDP's to float rounding (tests/test_sfb.py), so its time
to any target loss is its step time times the same number of steps, and the time-to-target ratio over the
default equals the step-time ratio printed here. The rule's verdict is the share of the model's bytes in
weights where it says sfb moves less.

    python bench/seed_plans.py [--workloads ...] [--clusters ...] [--rounds 3] [--work DIR]

``--part selective``: selective receivers (sync mode selective) on uneven clusters, where hosts joined by
fast paths average every step and the slow paths carry an averaging every 4 steps. It is lossy, so each arm
*trains* until the consensus model's smoothed held-out loss reaches L* (the efficiency reference's loss at
3/4 of its horizon; same initial weights, data order and optimizer for every arm), timed with the clock
paused during evaluations, as bench/stragglers.py does: the DDP default, ``selective`` (islands picked from
the measured per-path bandwidths of the profile), and the other baselines of ``--others`` (the best of
them is 'best other'). One timed run per arm (~10% noise on these 2 cores).

    python bench/seed_plans.py --part selective [--workloads resnet-tiny] [--clusters ...]

Resumable: finished contexts are kept in ``--work`` (rows.jsonl; the selective part in ``--work``/selective).
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from _results import RESULTS, load_rows, run_contexts, speedup_bars, write

from autosync import workloads as W
from autosync.plans.sfb import poseidon_rule
from autosync.profiler.measure import nominal_profile
from autosync.search.baselines import baselines
from autosync.search.trials import TrialSettings, measure_strategy
from autosync.strategy import Strategy

HERE = Path(__file__).parent
WORKLOADS = ["mlp", f"{HERE / '_sfb_workloads.py'}:wide", f"{HERE / '_sfb_workloads.py'}:autoencoder",
             "gpt2-tiny", "vit-tiny"]
BATCH = {"wide": 64, "autoencoder": 64}


def short(wl: str) -> str:
    return wl.rsplit(":", 1)[-1] if ":" in wl else wl


def measure_one(pool, cluster, spec, wl, args):
    batch = BATCH.get(short(wl)) or W.default_batch_size(wl)
    profile = nominal_profile(cluster, wl, batch)          # the model's factor rows; the network is not used
    params = profile.model.params
    total = sum(p.nbytes for p in params)
    win = [p for p in params if poseidon_rule(p.shape, p.factor_rows, cluster.world_size)]
    arms = {"DDP default": Strategy.default()}
    hand = baselines(profile)
    if "poseidon" in hand:
        arms["poseidon"] = hand["poseidon"]
    if any(p.factor_rows > 0 for p in params):
        arms["sfb all"] = Strategy.from_dict({"groups": [{"plan": "sfb"}]})
    others = {n: s for n, s in hand.items() if n in args.others}
    arms.update(others)
    settings = TrialSettings(warmup_steps=2, max_steps=args.steps, timeout_s=300)
    times: dict[str, list[float]] = {a: [] for a in arms}
    for r in range(args.rounds):
        for arm, strategy in arms.items():
            res = measure_strategy(pool, profile, strategy, settings)
            if res.ok:
                times[arm].append(res.step_s)
            print(f"  {short(wl)} {spec} round {r + 1}: {arm} {res.step_s if res.ok else res.status}", flush=True)
    med = {a: statistics.median(v) if v else None for a, v in times.items()}
    best_other = min((a for a in others if med[a]), key=lambda a: med[a], default=None)
    return {"workload": short(wl), "cluster": spec, "batch": batch, "rows": sorted({p.factor_rows for p in params
                                                                                       if p.factor_rows})[:3],
            "rule_win_bytes": sum(p.nbytes for p in win) / total, "median_step_s": med, "best_other": best_other,
            "spread": {a: (min(v), max(v)) for a, v in times.items() if v}}


SELECTIVE_CLUSTERS = ["3x1@1gbit;node2=100mbit", "4x1@1gbit;node3=100mbit"]
SELECTIVE_OTHERS = ["local_sgd_4", "powersgd_r4", "adaptive_local_sgd", "ssp_1"]


def measure_selective(pool, cluster, spec, wl, args, work, prior=None):
    """One uneven-cluster context of the selective part: every arm trained to L* (module docstring)."""
    from time_to_loss import time_to_target

    from autosync.context import Context
    from autosync.datasets.store import DatasetStore
    from autosync.efficiency import target
    from autosync.efficiency.meter import EfficiencyMeter
    from autosync.search.collect import context_profile

    def say(msg):
        print(f"  {msg}", flush=True)

    batch = W.default_batch_size(wl)
    profile = context_profile(DatasetStore(work / "profiles"), pool, cluster, wl, batch, say)
    ctx = Context.on(pool, wl, batch, cluster).id
    hand = baselines(profile)
    arms = {"DDP default": Strategy.default()}
    if "selective" in hand:
        arms["selective"] = hand["selective"]
    arms.update({n: hand[n] for n in args.others if n in hand})
    paths, source = profile.path_bps()
    row = {"workload": wl, "cluster": spec, "context": ctx, "batch": batch, "paths_bps": paths, "paths_from": source,
           "islands": arms["selective"].sync.to_dict()["islands"] if "selective" in arms else None}
    timed = {x["hash"]: x for x in (prior or {}).get("arms", {}).values() if isinstance(x, dict) and "hash" in x}
    with EfficiencyMeter(DatasetStore(work / "efficiency"), wl, batch, cluster.world_size, cluster.ranks_per_node,
                         progress=say) as meter:
        goal = target(meter.references(), meter.horizon)
        row["target_loss"] = goal
        ref = None
        out = {}
        for arm, strategy in arms.items():
            if strategy.hash not in timed:
                say(f"{wl} {spec}: training {arm} to L* = {goal:.4f}")
                cap = None if ref is None else args.cap * (ref["time_s"] or ref["trained_s"])
                timed[strategy.hash] = time_to_target(pool, wl, batch, strategy, goal, meter, cap)
            out[arm] = {**timed[strategy.hash], "strategy": strategy.canonical()}
            if arm == "DDP default":
                ref = timed[strategy.hash]
    row["arms"] = out
    reached = {a: x["time_s"] for a, x in out.items() if a in args.others and x.get("time_s")}
    row["best_other"] = min(reached, key=reached.get) if reached else None
    return row


def selective_table(rows: list[dict], args) -> list[str]:
    from time_to_loss import fmt_time, ratio

    lines = ["# Selective receivers (sync mode selective) vs the DDP default and the best other strategy", "",
             "Wall-clock seconds of training (evaluations excluded) until the consensus model's smoothed held-out "
             "loss reaches L*, on the emulated cluster; x = the default's time / the arm's (time-to-target "
             f"speedup); 'never' = not within {args.cap:g}x the default's time (the loss reached in brackets). "
             "selective is LOSSY (ranks outside an island see each other's updates only every 4 steps), as are "
             f"{', '.join(args.others)}; islands = the hosts averaging every step, chosen from the profile's "
             "per-path bandwidths (measured: one point-to-point transfer per pair of hosts). One timed run per arm.",
             "", "| workload | cluster | paths (Mbit/s) | islands | L* | DDP default s | selective s | x | "
                 "best other | s | x | s/step DDP / selective |",
             "|---|---|---|---|---:|---:|---:|---:|---|---:|---:|---|"]
    for r in rows:
        a = r["arms"]
        d = a["DDP default"]
        n = len(r["paths_bps"])
        paths = " ".join(f"{i}-{j}:{r['paths_bps'][i][j] / 1e6:.0f}" for i in range(n) for j in range(i + 1, n))
        islands = "\\|".join(",".join(map(str, i)) for i in r["islands"]) if r["islands"] else "-"
        sel = a.get("selective")
        bo = r["best_other"]
        lines.append(f"| {r['workload']} | {r['cluster']} | {paths} ({r['paths_from']}) | {islands} | "
                     f"{r['target_loss']:.3f} | {fmt_time(d)} | "
                     + (f"{fmt_time(sel)} | {ratio(sel, d):.2f}" if sel else "- | -")
                     + (f" | {bo} | {fmt_time(a[bo])} | {ratio(a[bo], d):.2f}" if bo else " | - | - | -")
                     + f" | {d['s_per_step']:.3f} / {sel['s_per_step'] if sel else float('nan'):.3f} |")
    lines += ["", "Every arm:", "", "| workload | cluster | " + " | ".join(f"{o} s | x" for o in args.others) + " |",
              "|---|---|" + "---:|---:|" * len(args.others)]
    for r in rows:
        a = r["arms"]
        lines.append(f"| {r['workload']} | {r['cluster']} | " + " | ".join(
            f"{fmt_time(a[o])} | {ratio(a[o], a['DDP default']):.2f}" if o in a else "- | -" for o in args.others)
            + " |")
    failed = [f"- {r['workload']} {r['cluster']} {n}: {x['failed']}" for r in rows for n, x in r["arms"].items()
              if x.get("failed")]
    if failed:
        lines += ["", "Failed arms:", "", *failed]
    return lines


def table(rows: list[dict]) -> list[str]:
    lines = ["# Sufficient-factor broadcasting (sfb) vs the DDP default and the best other lossless baseline", "",
             "Median step seconds over interleaved rounds on the emulated cluster; x = the default's step time / "
             "the arm's = its time-to-target-loss speedup (sfb is lossless: the same trajectory as DDP to float "
             "rounding). 'rule' = share of the model's bytes where Poseidon's rule says sfb moves less "
             "(2K(W-1)(M+N) <= 2MN(S+W-2)/S, S = W). poseidon = sfb where the rule says so; sfb all = every "
             "fully connected weight by sfb.", "",
             "| workload | batch | factor rows | cluster | rule | DDP default s | poseidon s | x | sfb all s | x | "
             "best other | s | x |", "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        m = r["median_step_s"]
        d = m["DDP default"]

        def cell(a):
            return (f"{m[a]:.3f} | {d / m[a]:.2f}" if m.get(a) else "- | -")
        bo = r["best_other"]
        lines.append(f"| {r['workload']} | {r['batch']} | {'/'.join(f'{k:g}' for k in r['rows'])} | {r['cluster']} | "
                     f"{r['rule_win_bytes']:.2f} | {d:.3f} | {cell('poseidon')} | {cell('sfb all')} | "
                     f"{bo or '-'} | {cell(bo) if bo else '- | -'} |")
    agree = [r for r in rows if r["median_step_s"].get("sfb all")]
    right = sum((r["rule_win_bytes"] > 0.5) == (r["median_step_s"]["sfb all"] < r["median_step_s"]["DDP default"])
                for r in agree)
    lines += ["", f"The rule's verdict (sfb wins on most bytes) matched the measured sign of sfb all vs the default "
                  f"in {right} of {len(agree)} contexts."]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("sfb", "selective"), default="sfb")
    ap.add_argument("--workloads", nargs="+", default=None,
                    help="default: 5 sfb workloads; resnet-tiny for --part selective")
    ap.add_argument("--clusters", nargs="+", default=None,
                    help=f"default: 2x1@1gbit; {' '.join(SELECTIVE_CLUSTERS)} for --part selective")
    ap.add_argument("--cap", type=float, default=2.0, help="selective part: give up on an arm after this many times "
                                                           "the default's time to target (default 2)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every arm (median)")
    ap.add_argument("--steps", type=int, default=6, help="timed steps per trial")
    ap.add_argument("--others", nargs="+", default=None,
                    help="the other baselines measured (the best of them is 'best other'); default: the lossless "
                         f"ps_load_balancing partitioned_ps hierarchical; {' '.join(SELECTIVE_OTHERS)} for --part "
                         "selective")
    ap.add_argument("--work", default="/tmp/autosync-seed-plans", help="resumable work directory")
    ap.add_argument("--out", default=None, help="default: bench/results/seed_plans.md (seed_plans_selective.md)")
    ap.add_argument("--report-only", action="store_true", help="write the table from the finished contexts")
    args = ap.parse_args()
    sel = args.part == "selective"
    args.workloads = args.workloads or (["resnet-tiny"] if sel else WORKLOADS)
    args.clusters = args.clusters or (SELECTIVE_CLUSTERS if sel else ["2x1@1gbit"])
    args.others = args.others or (SELECTIVE_OTHERS if sel else ["ps_load_balancing", "partitioned_ps", "hierarchical"])
    args.out = args.out or str(RESULTS / ("seed_plans_selective.md" if sel else "seed_plans.md"))
    work = Path(args.work) / ("selective" if sel else "")
    work.mkdir(parents=True, exist_ok=True)
    if sel:
        return main_selective(args, work)
    finished = set(load_rows(work))               # (short workload name, cluster)
    done = {(w, c) for w in args.workloads for c in args.clusters
            if args.report_only or (short(w), c) in finished}
    run_contexts(args, work, done, lambda pool, cluster, spec, wl, prior: measure_one(pool, cluster, spec, wl, args),
                 lambda r: f"{r['workload']} {r['cluster']}: " + "  ".join(
                     f"{a} {v:.3f}" for a, v in r["median_step_s"].items() if v))
    by_key = load_rows(work)
    rows = [by_key[(short(w), c)] for c in args.clusters for w in args.workloads if (short(w), c) in by_key]
    write(args.out, table(rows))
    speedup_bars([f"{r['workload']}\n{r['cluster']}" for r in rows],
                 {a: [r["median_step_s"]["DDP default"] / r["median_step_s"][a] if r["median_step_s"].get(a) else 0
                      for r in rows] for a in ("poseidon", "sfb all")},
                 "step-time (= time-to-loss) speedup over DDP default", Path(args.out).with_suffix(".png"))
    print(f"wrote {args.out}")


def main_selective(args, work: Path) -> None:
    from time_to_loss import ratio

    finished = set(load_rows(work))
    done = {(w, c) for w in args.workloads for c in args.clusters if args.report_only or (w, c) in finished}
    run_contexts(args, work, done, lambda pool, cluster, spec, wl, prior: measure_selective(
        pool, cluster, spec, wl, args, work, prior),
                 lambda r: f"{r['workload']} {r['cluster']}: " + "  ".join(
                     f"{a} {x['time_s']:.1f}" if x.get("time_s") else f"{a} never" for a, x in r["arms"].items()))
    by_key = load_rows(work)
    rows = [by_key[(w, c)] for c in args.clusters for w in args.workloads if (w, c) in by_key]
    lines = selective_table(rows, args)
    write(args.out, lines)
    print("\n".join(lines))
    arms = ["selective", *args.others]
    speedup_bars([f"{r['workload']}\n{r['cluster']}" for r in rows],
                 {a: [ratio(r["arms"][a], r["arms"]["DDP default"]) if a in r["arms"] else 0.0 for r in rows]
                  for a in arms},
                 "time-to-target speedup over DDP default\n(0 = never reached)", Path(args.out).with_suffix(".png"))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
