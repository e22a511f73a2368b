"""Noise of a measurement: the DDP default measured N times in one context, in one run.

    python bench/default_noise.py [--workload bert-mini] [--cluster 2x1@1gbit] [--repeats 5]
    ->  bench/results/default_noise.md

Reports each run's samples/s, and the coefficient of variation across runs (target <= 5%).
"""
import argparse
import statistics
from pathlib import Path

from autosync.cluster import parse_cluster
from autosync.executor.emulate import emulate
from autosync.profiler import NetworkProfile, Profile
from autosync.profiler.measure import profile_model
from autosync.search.trials import TrialSettings, measure_strategy
from autosync.strategy import Strategy
from _results import RESULTS, write as write_result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="bert-mini")
    ap.add_argument("--clusters", nargs="+", default=["2x1@1gbit", "2x1@100mbit"])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    lines = [f"# DDP default measured {args.repeats} times per context (collect's trial settings)", "",
             "| context | samples/s per run | mean | CV across runs |", "|---|---|---:|---:|"]
    for spec in args.clusters:
        cluster = parse_cluster(spec)
        profile = Profile(profile_model(args.workload, repeats=1, warmup=1), NetworkProfile.nominal(cluster), cluster)
        with emulate(cluster) as emu, emu.pool() as pool:
            runs = [measure_strategy(pool, profile, Strategy.default(), TrialSettings()).samples_per_s
                    for _ in range(args.repeats)]
        cv = statistics.pstdev(runs) / statistics.fmean(runs)
        lines.append(f"| {args.workload} on {spec} | {', '.join(f'{r:.1f}' for r in runs)} | "
                     f"{statistics.fmean(runs):.1f} | {cv:.1%} |")
        print(lines[-1], flush=True)
    lines += ["", "Target: CV <= 5%."]
    write_result(RESULTS / "default_noise.md", lines)


if __name__ == "__main__":
    main()
