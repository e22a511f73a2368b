"""Sufficient-factor broadcasting (plan sfb) against the DDP default and the best other lossless baseline.

Per (workload, cluster), on one emulated cluster: the DDP default, ``poseidon`` (sfb where Poseidon's rule
says so, from the profile's factor rows; all-reduce elsewhere), ``sfb all`` (every fully connected weight by
sfb) and the other lossless hand-crafted baselines of ``--others``, measured in interleaved rounds (median step time per
arm). sfb is lossless: its training trajectory is DDP's to float rounding (tests/test_sfb.py), so its time
to any target loss is its step time times the same number of steps, and the time-to-target ratio over the
default equals the step-time ratio printed here. The rule's verdict is the share of the model's bytes in
weights where it says sfb moves less.

    python bench/seed_plans.py [--workloads ...] [--clusters ...] [--rounds 3] [--work DIR]

Resumable: finished contexts are kept in ``--work`` (rows.jsonl). Selective receivers (issue 16, part 2)
are not built yet, so this covers the sfb half of the issue's benchmark.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from _results import RESULTS, load_rows, run_contexts, speedup_bars, write

from autosync import workloads as W
from autosync.plans.sfb import poseidon_rule
from autosync.profiler.profile import nominal_profile
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
    ap.add_argument("--workloads", nargs="+", default=WORKLOADS)
    ap.add_argument("--clusters", nargs="+", default=["2x1@1gbit"])
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every arm (median)")
    ap.add_argument("--steps", type=int, default=6, help="timed steps per trial")
    ap.add_argument("--others", nargs="+", default=["ps_load_balancing", "partitioned_ps", "hierarchical"],
                    help="the other lossless baselines measured (the best of them is 'best other')")
    ap.add_argument("--work", default="/tmp/autosync-seed-plans", help="resumable work directory")
    ap.add_argument("--out", default=str(RESULTS / "seed_plans.md"))
    ap.add_argument("--report-only", action="store_true", help="write the table from the finished contexts")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
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


if __name__ == "__main__":
    main()
