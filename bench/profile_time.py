"""Wall time of `autosync profile` (model + network) for every built-in workload on a 2-rank cluster.

    python bench/profile_time.py [--cluster 2x1@1gbit]  ->  bench/results/profile_time.md
"""
import argparse
import time
from pathlib import Path

from autosync import workloads
from autosync.cluster import parse_cluster
from autosync.executor.emulate import emulate
from autosync.profiler.measure import run_profile
from _results import RESULTS, write as write_result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cluster", default="2x1@1gbit")
    args = ap.parse_args()
    cluster = parse_cluster(args.cluster)
    lines = [f"# Profiling time on emulated {cluster} (model on every rank at once, then the network)", "",
             "| workload | model + network (s) | rank start-up included (s) |", "|---|---:|---:|"]
    for name in workloads.BUILTINS:
        t0 = time.monotonic()
        with emulate(cluster) as emu, emu.pool() as pool:
            pool.start()
            t1 = time.monotonic()
            run_profile(pool, cluster, name)
            t2 = time.monotonic()
        lines.append(f"| {name} | {t2 - t1:.1f} | {t2 - t0:.1f} |")
        print(lines[-1], flush=True)
    lines += ["", "Target: under 60 s per workload."]
    write_result(RESULTS / "profile_time.md", lines)


if __name__ == "__main__":
    main()
