"""The live network bench of ``strategy="auto"`` and ``tune --in-job``: how long it takes and how well its fits
predict, for four sweep rules side by side.

A training pays for every second of this bench. Each collective's sweep runs over the live sizes (4 KiB .. 4 MiB,
x4 each) and stops

  after 0.1    after the first size slower than 0.1 s (the offline profiler's rule)
  ahead 0.1    before the first size predicted slower than 0.1 s (the last time times the sizes' ratio)
  ahead 0.025  the same, before the first size predicted slower than 25 ms
  ahead 0.1 / 0.025   all-reduce's and send/recv's sweeps as "ahead 0.1", the other collectives' as "ahead 0.025"
                      (``LIVE_MAX_OP_S``: what strategy="auto" and tune --in-job run)

Per emulated cluster, one rank pool; ``--rounds`` interleaved rounds of the rules (one of each per round, in turn),
then a measured 8 MiB and 256 KiB all-reduce (median of 5, the slowest rank) that each rule's fit predicts.
Medians over the rounds: the bench's wall time and the predicted all-reduces over the measured ones.

    python bench/live_network.py [--clusters 3x1@200mbit 2x1@1gbit] [--rounds 5]
"""
import argparse
import statistics
import time

from _results import RESULTS, write as write_result

RULES = {"after 0.1": (0.1, False), "ahead 0.1": (0.1, True), "ahead 0.025": (0.025, True),
         "ahead 0.1 / 0.025": ("live", True)}
PROBES = (256 << 10, 8 << 20)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clusters", nargs="+", default=["3x1@200mbit", "2x1@1gbit", "2x1@100mbit"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(RESULTS / "live_network.md"))
    args = ap.parse_args()

    from autosync.cluster import parse_cluster
    from autosync.executor.emulate import EmulatedCluster
    from autosync.profiler.measure import all_reduce_seconds, profile_network
    from autosync.profiler.observe import LIVE_MAX_OP_S, LIVE_SIZES

    rows = []
    for spec in args.clusters:
        took = {rule: [] for rule in RULES}
        predicted = {(rule, p): [] for rule in RULES for p in PROBES}
        with EmulatedCluster(parse_cluster(spec)) as emu, emu.pool() as pool:
            for r in range(args.rounds):
                for rule, (max_op_s, ahead) in RULES.items():
                    t0 = time.perf_counter()
                    network = profile_network(pool, sizes=LIVE_SIZES, ahead=ahead,
                                              max_op_s=LIVE_MAX_OP_S if max_op_s == "live" else max_op_s)
                    took[rule].append(time.perf_counter() - t0)
                    for p in PROBES:
                        predicted[rule, p].append(network.time("all_reduce", p))
                    print(f"{spec} round {r + 1}: {rule} {took[rule][-1]:.2f} s, all-reduce predicted "
                          + ", ".join(f"{p >> 10} KiB {predicted[rule, p][-1] * 1e3:.1f} ms" for p in PROBES),
                          flush=True)
            measured = {p: pool.run(all_reduce_seconds, p, 5, timeout=300)[0] for p in PROBES}
        base = statistics.median(took["ahead 0.1"])
        for rule in RULES:
            t = statistics.median(took[rule])
            fits = " | ".join(f"{statistics.median(predicted[rule, p]) / measured[p]:.2f} "
                              f"({min(predicted[rule, p]) / measured[p]:.2f}-{max(predicted[rule, p]) / measured[p]:.2f})"
                              for p in PROBES)
            rows.append(f"| {spec} | {rule} | {t:.2f} s | {base / t:.1f}x | {fits} |")
        rows.append(f"| {spec} | measured all-reduce | | | " + " | ".join(f"{measured[p] * 1e3:.1f} ms" for p in PROBES)
                    + " |")
    lines = ["# The live network bench: four sweep rules side by side",
             "",
             f"Medians of {args.rounds} interleaved rounds per emulated cluster (one rank pool each). Each "
             "collective's sweep over 4 KiB .. 4 MiB stops \"after\" the first size slower than the limit, or "
             "\"ahead\" of the first size predicted slower (the last time times the sizes' ratio). `strategy=\"auto\"` "
             "and `tune --in-job` run \"ahead 0.1 / 0.025\" (all-reduce's and send/recv's sweeps at 0.1 s, the other "
             "collectives' at 25 ms). Speed: \"ahead 0.1\"'s time over the rule's. Fit / measured: the rule's alpha-beta fit of an all-reduce over the measured one (median of 5, the "
             "slowest rank; the measured times in each cluster's last row), the rounds' range in parentheses.",
             "",
             "| cluster | rule | bench | speed vs ahead 0.1 | fit / measured, 256 KiB | fit / measured, 8 MiB |",
             "|---|---|---:|---:|---:|---:|", *rows]
    print("\n".join(lines))
    write_result(args.out, lines)


if __name__ == "__main__":
    main()
