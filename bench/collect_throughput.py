"""Trials per hour: ranks kept alive across trials (what `collect` does) vs a fresh launch per trial.

Same emulated cluster, same workload, the same strategies (the baselines of the context)
with collect's trial settings, run both ways in alternation:
  kept-alive: one RankPool for all trials
  fresh:      a new RankPool per trial (start the ranks, join the process group), as a
              launcher that starts `torchrun` per trial would
Prints trials/hour of each and their ratio (target >= 3x).

    python bench/collect_throughput.py [--workload resnet-tiny] [--cluster 2x1@10gbit]
"""
import argparse
import time
from pathlib import Path

from autosync.cluster import parse_cluster
from autosync.executor.emulate import emulate
from autosync.profiler import NetworkProfile, Profile
from autosync.profiler.measure import profile_model
from autosync.search.baselines import baselines
from autosync.search.trials import TrialSettings, measure_strategy
from _results import RESULTS, write as write_result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="resnet-tiny")
    ap.add_argument("--cluster", default="2x1@10gbit")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    cluster = parse_cluster(args.cluster)
    profile = Profile(profile_model(args.workload, repeats=1, warmup=1), NetworkProfile.nominal(cluster), cluster)
    strategies = list(baselines(profile).values())
    settings = TrialSettings()
    elapsed = {"kept-alive": 0.0, "fresh": 0.0}
    trials = {"kept-alive": 0, "fresh": 0}
    with emulate(cluster) as emu:
        with emu.pool() as kept:
            kept.start()  # started once, like collect does per cluster
            for _ in range(args.rounds):
                for s in strategies:
                    t0 = time.monotonic()
                    assert measure_strategy(kept, profile, s, settings).ok
                    elapsed["kept-alive"] += time.monotonic() - t0
                    trials["kept-alive"] += 1
                    t0 = time.monotonic()
                    with emu.pool() as fresh:
                        assert measure_strategy(fresh, profile, s, settings).ok
                    elapsed["fresh"] += time.monotonic() - t0
                    trials["fresh"] += 1
    per_hour = {k: trials[k] / elapsed[k] * 3600 for k in trials}
    ratio = per_hour["kept-alive"] / per_hour["fresh"]
    lines = [f"# Collect throughput: {args.workload} on emulated {cluster}, {trials['fresh']} trials each, "
             "alternating", "", "| ranks | trials | seconds | trials/hour |", "|---|---:|---:|---:|"]
    lines += [f"| {k} | {trials[k]} | {elapsed[k]:.1f} | {per_hour[k]:,.0f} |" for k in trials]
    lines += ["", f"kept-alive / fresh: **{ratio:.2f}x** (target >= 3x).", "",
              ""]
    write_result(RESULTS / "collect_throughput.md", lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
