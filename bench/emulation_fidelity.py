"""Configured vs measured bandwidth and latency of the emulated cluster.

For each rate (50 mbit to 50 gbit) and latency (0, 1, 10 ms) a 2x1 cluster
is brought up and its links measured with torch.distributed point-to-point transfers and
a ping-pong (autosync.executor.linkcheck). On a kernel without the netem qdisc, latencies
above 0 cannot be emulated: those rows say so instead of a figure.

    python bench/emulation_fidelity.py   ->  bench/results/emulation_fidelity.md
"""
import argparse
import statistics
from pathlib import Path

from autosync.cluster import parse_cluster
from autosync.executor.emulate import EmulatedCluster, has_netem
from autosync.executor.linkcheck import check_links
from _results import RESULTS, write as write_result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", nargs="+", default=["50mbit", "100mbit", "1gbit", "10gbit", "25gbit", "50gbit"])
    ap.add_argument("--latencies", nargs="+", default=["0ms", "1ms", "10ms"])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "emulation_fidelity.md"))
    args = ap.parse_args()
    netem = has_netem()
    lines = ["# Emulation fidelity: 2x1 clusters, configured vs measured (median of the two host links)", "",
             "| cluster | configured Mbit/s | measured Mbit/s | ratio | configured latency | measured latency |",
             "|---|---:|---:|---:|---:|---:|"]
    for rate in args.rates:
        for lat in args.latencies:
            spec = f"2x1@{rate}" + (f",{lat}" if lat not in ("0ms", "0us", "0") else "")
            cluster = parse_cluster(spec)
            if cluster.link.latency_s and not netem:
                lines.append(f"| {spec} | {cluster.link.rate_bps / 1e6:,.0f} | n/a | n/a | "
                             f"{cluster.link.latency_s * 1e3:.3f} ms | n/a: this kernel has no netem |")
                print(lines[-1], flush=True)
                continue
            with EmulatedCluster(cluster) as emu, emu.pool(threads_per_rank=1) as pool:
                rows = check_links(pool, cluster)
            bw = statistics.median(r.measured_bps for r in rows)
            lat_m = statistics.median(r.measured_latency_s for r in rows)
            lines.append(f"| {spec} | {cluster.link.rate_bps / 1e6:,.0f} | {bw / 1e6:,.1f} | "
                         f"{bw / cluster.link.rate_bps:.3f} | {cluster.link.latency_s * 1e3:.3f} ms | "
                         f"{lat_m * 1e3:.3f} ms |")
            print(lines[-1], flush=True)
    lines += ["", "Latency is half the best round trip of "
              "a 4-byte gloo ping-pong; bandwidth is a 0.5 s point-to-point transfer after a warm-up."]
    write_result(args.out, lines)


if __name__ == "__main__":
    main()
