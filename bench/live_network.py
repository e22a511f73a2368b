"""The live network bench of ``strategy="auto"``: each sweep stopped after the first size slower than 0.1 s
("after", the offline profiler's rule) against before the first size predicted slower ("ahead", the live rule).

A training pays for every second of this bench. Per emulated cluster, one rank pool; ``--rounds`` interleaved
rounds of both rules (after, ahead, after, ahead, ...) over the live sizes (4 KiB .. 4 MiB), then a measured
8 MiB all-reduce (median of 5) that each rule's fit predicts. Medians over the rounds: the bench's wall time and
the predicted 8 MiB all-reduce against the measured one.

    python bench/live_network.py [--clusters 3x1@200mbit 2x1@1gbit] [--rounds 3]
"""
import argparse
import statistics
import time

from _results import RESULTS, write as write_result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clusters", nargs="+", default=["3x1@200mbit", "2x1@1gbit"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS / "live_network.md"))
    args = ap.parse_args()

    from autosync.cluster import parse_cluster
    from autosync.executor.emulate import EmulatedCluster
    from autosync.profiler.measure import all_reduce_seconds, profile_network
    from autosync.profiler.observe import LIVE_SIZES

    probe = 8 << 20
    rows = []
    for spec in args.clusters:
        took: dict[bool, list[float]] = {False: [], True: []}
        predicted: dict[bool, list[float]] = {False: [], True: []}
        with EmulatedCluster(parse_cluster(spec)) as emu, emu.pool() as pool:
            for r in range(args.rounds):
                for ahead in (False, True):
                    t0 = time.perf_counter()
                    network = profile_network(pool, sizes=LIVE_SIZES, max_op_s=0.1, ahead=ahead)
                    took[ahead].append(time.perf_counter() - t0)
                    predicted[ahead].append(network.time("all_reduce", probe))
                    print(f"{spec} round {r + 1}: {'ahead' if ahead else 'after'} {took[ahead][-1]:.2f} s, "
                          f"8 MiB all-reduce predicted {predicted[ahead][-1]:.3f} s", flush=True)
            measured = pool.run(all_reduce_seconds, probe, 5, timeout=300)[0]
        after_s, ahead_s = statistics.median(took[False]), statistics.median(took[True])
        rows.append(f"| {spec} | {after_s:.2f} s | {ahead_s:.2f} s | {after_s / ahead_s:.1f}x | "
                    f"{statistics.median(predicted[False]) / measured:.2f} | "
                    f"{statistics.median(predicted[True]) / measured:.2f} | {measured:.3f} s |")
    lines = ["# The live network bench: stop after the first slow size, or before it",
             "",
             f"Medians of {args.rounds} interleaved rounds per emulated cluster (one rank pool each). \"after\": each "
             "collective's sweep stops after the first size slower than 0.1 s; \"ahead\": before the first size "
             "predicted slower (the last time times the sizes' ratio), what `strategy=\"auto\"` and `tune --in-job` "
             "run. Fit / measured: each rule's alpha-beta fit of the 8 MiB all-reduce over the measured one "
             "(median of 5, the slowest rank).",
             "",
             "| cluster | bench (after) | bench (ahead) | after / ahead | fit / measured (after) | "
             "fit / measured (ahead) | 8 MiB all-reduce measured |",
             "|---|---:|---:|---:|---:|---:|---:|", *rows]
    print("\n".join(lines))
    write_result(args.out, lines)


if __name__ == "__main__":
    main()
