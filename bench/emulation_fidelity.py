"""Configured vs measured bandwidth, latency, jitter and loss of the emulated cluster.

Five tables, each from 2x1 clusters brought up as autosync brings them up for a trial:

1. **Rate** (50 mbit to 50 gbit, with 0, 1 and 10 ms of latency): torch.distributed point-to-point
   transfers and a gloo ping-pong (autosync.executor.linkcheck, what ``autosync cluster check`` runs).
2. **Latency** (1, 10, 50, 100 ms one way): a UDP ping-pong between the hosts' namespaces, the median
   round trip halved, minus the base: the same ping-pong over the delay line set to 0 ms (what the
   TAP pair and the process moving the frames cost by themselves). Target: within 10% of configured.
3. **Jitter**: the standard deviation of the one-way delay (that of the round trip over sqrt 2; the
   two directions draw independently). Target: within 25% of configured.
4. **One TCP stream** over a long path: the rate in its steady state (after the window has opened).
   Target: >= 0.85 of configured at 100 mbit with 50 ms and at 1 gbit with 10 ms.
5. **Loss with latency**: the share of 4,000 UDP datagrams that do not arrive. Target: within 1 point.

On a kernel with netem, netem delays instead of the delay line (the tables say which ran).

    python bench/emulation_fidelity.py   ->  bench/results/emulation_fidelity.md
"""
import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

from autosync.cluster import parse_cluster
from autosync.executor.emulate import EmulatedCluster, has_netem
from autosync.executor.linkcheck import check_links
from _results import write as write_result

_ECHO = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("{addr}", 5301)); s.settimeout(60)
print("ready", flush=True)
while True:
    data, peer = s.recvfrom(2048)
    if data == b"bye":
        break
    s.sendto(data, peer)
"""
_PING = """
import json, socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5)
rtts = []
for i in range({count}):
    t0 = time.perf_counter()
    s.sendto(i.to_bytes(8, "big"), ("{addr}", 5301))
    while True:
        data, _ = s.recvfrom(2048)
        if int.from_bytes(data, "big") == i:
            break
    rtts.append(time.perf_counter() - t0)
    time.sleep({gap})
s.sendto(b"bye", ("{addr}", 5301))
print(json.dumps(rtts))
"""
_SINK = """
import socket, time, json
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("{addr}", 5302)); s.settimeout({quiet})
print("ready", flush=True)
got = 0
try:
    while True:
        s.recvfrom(2048)
        got += 1
except socket.timeout:
    pass
print(got)
"""
_SPRAY = """
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range({count}):
    s.sendto(bytes(100), ("{addr}", 5302))
    time.sleep({gap})
"""
_STREAM_IN = """
import socket, time, json
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("{addr}", 5303)); s.listen(1)
print("ready", flush=True)
c, _ = s.accept(); buf = bytearray(1 << 20); marks = []; n = 0; t0 = time.perf_counter()
while True:
    k = c.recv_into(buf)
    if not k:
        break
    n += k
    marks.append((time.perf_counter() - t0, n))
print(json.dumps(marks[::max(1, len(marks) // 4000)] + marks[-1:]))
"""
_STREAM_OUT = """
import socket, time
c = socket.create_connection(("{addr}", 5303)); data = bytes(1 << 20); t0 = time.perf_counter()
while time.perf_counter() - t0 < {seconds}:
    c.sendall(data)
c.close()
"""


def _pair(emu, server: str, client: str, timeout: float = 300) -> tuple[str, str]:
    """Run ``server`` on host 1 (it prints ready first), then ``client`` on host 0; both outputs."""
    srv = subprocess.Popen(["ip", "netns", "exec", emu.hosts[1], sys.executable, "-c", server],
                           stdout=subprocess.PIPE, text=True)
    try:
        if srv.stdout.readline().strip() != "ready":
            raise RuntimeError("the probe's server did not start")
        cli = subprocess.run(["ip", "netns", "exec", emu.hosts[0], sys.executable, "-c", client],
                             capture_output=True, text=True, timeout=timeout, check=True)
        return srv.communicate(timeout=timeout)[0], cli.stdout
    finally:
        srv.kill()


def ping(spec: str, count: int, delay_lines: bool = False) -> list[float]:
    """Round trips (s) of a UDP ping-pong from host 0 to host 1 of ``spec``."""
    addr = "198.18.0.2"
    with EmulatedCluster(parse_cluster(spec), delay_lines=delay_lines) as emu:
        _, out = _pair(emu, _ECHO.format(addr=addr), _PING.format(addr=addr, count=count, gap=0.005))
    return json.loads(out)[3:]        # the first round trips resolve ARP


def loss(spec: str, count: int = 4000) -> float:
    addr = "198.18.0.2"
    cluster = parse_cluster(spec)
    with EmulatedCluster(cluster) as emu:
        out, _ = _pair(emu, _SINK.format(addr=addr, quiet=2 + 4 * cluster.link.latency_s),
                       _SPRAY.format(addr=addr, count=count, gap=0.0005))
    return 1 - int(out.strip()) / count


def stream(spec: str, seconds: float) -> tuple[float, float]:
    """(steady-state bit/s, time the window took to open) of one TCP stream from host 0 to host 1."""
    addr = "198.18.0.2"
    with EmulatedCluster(parse_cluster(spec)) as emu:
        out, _ = _pair(emu, _STREAM_IN.format(addr=addr), _STREAM_OUT.format(addr=addr, seconds=seconds))
    marks = json.loads(out)
    end_t, end_n = marks[-1]
    start = 0.4 * end_t           # the last 60% of the stream: slow start is long over by then
    t0, n0 = next((t, n) for t, n in marks if t >= start)
    return (end_n - n0) * 8 / (end_t - t0), start


def rate_table(rates, latencies, netem) -> list[str]:
    lines = ["## Rate: configured vs measured (median of the two host links)", "",
             "| cluster | delayed by | configured Mbit/s | measured Mbit/s | ratio | configured latency | "
             "measured latency | label |", "|---|---|---:|---:|---:|---:|---:|---|"]
    for rate in rates:
        for lat in latencies:
            spec = f"2x1@{rate}" + (f",{lat}" if lat not in ("0ms", "0us", "0") else "")
            cluster = parse_cluster(spec)
            how = "-" if not cluster.link.latency_s else "netem" if netem else "delay line"
            with EmulatedCluster(cluster) as emu, emu.pool(threads_per_rank=1) as pool:
                rows = check_links(pool, cluster)
                label = emu.network
            bw = statistics.median(r.measured_bps for r in rows)
            lat_m = statistics.median(r.measured_latency_s for r in rows)
            lines.append(f"| {spec} | {how} | {cluster.link.rate_bps / 1e6:,.0f} | {bw / 1e6:,.1f} | "
                         f"{bw / cluster.link.rate_bps:.3f} | {cluster.link.latency_s * 1e3:.3f} ms | "
                         f"{lat_m * 1e3:.3f} ms | {label} |")
            print(lines[-1], flush=True)
    return lines + ["", "Latency here is half the best round trip of a 4-byte gloo ping-pong; bandwidth a 0.5 s "
                    "point-to-point transfer after a warm-up. Label: `emulated-beyond` where the cluster is beyond "
                    "this machine's faithful range (autosync.executor.fidelity), as its trials are labelled.", ""]


def latency_table(latencies_ms, count) -> tuple[list[str], float]:
    base_rtts = ping("2x1@1gbit", count, delay_lines=True)
    base = statistics.median(base_rtts) / 2
    lines = ["## Latency: a UDP ping-pong, one way (median round trip / 2)", "",
             f"Base: {base * 1e3:.3f} ms one way through the delay lines set to 0 ms "
             f"({len(base_rtts)} round trips); the veth pair without them: "
             f"{statistics.median(ping('2x1@1gbit', count)) / 2 * 1e3:.3f} ms.", "",
             "| cluster | configured | measured | measured - base | error | within 10% |",
             "|---|---:|---:|---:|---:|---|"]
    for ms in latencies_ms:
        spec = f"2x1@1gbit,{ms}ms"
        one_way = statistics.median(ping(spec, count)) / 2
        err = (one_way - base) / (ms * 1e-3) - 1
        lines.append(f"| {spec} | {ms:.3f} ms | {one_way * 1e3:.3f} ms | {(one_way - base) * 1e3:.3f} ms | "
                     f"{err:+.1%} | {'yes' if abs(err) <= 0.10 else 'NO'} |")
        print(lines[-1], flush=True)
    return lines + [""], base


def jitter_table(specs, count) -> list[str]:
    lines = ["## Jitter: standard deviation of the one-way delay (of the round trip / sqrt 2)", "",
             "| cluster | configured | measured | ratio | within 25% |", "|---|---:|---:|---:|---|"]
    for spec in specs:
        jitter = parse_cluster(spec).link.jitter_s
        sd = statistics.stdev(ping(spec, count)) / math.sqrt(2)
        lines.append(f"| {spec} | {jitter * 1e3:.3f} ms | {sd * 1e3:.3f} ms | {sd / jitter:.3f} | "
                     f"{'yes' if abs(sd / jitter - 1) <= 0.25 else 'NO'} |")
        print(lines[-1], flush=True)
    return lines + [""]


def stream_table(specs, seconds) -> list[str]:
    lines = ["## One TCP stream over a long path (steady state)", "",
             "| cluster | configured Mbit/s | measured Mbit/s | ratio | >= 0.85 |", "|---|---:|---:|---:|---|"]
    for spec in specs:
        rate = parse_cluster(spec).link.rate_bps
        bps, _ = stream(spec, seconds)
        lines.append(f"| {spec} | {rate / 1e6:,.0f} | {bps / 1e6:,.1f} | {bps / rate:.3f} | "
                     f"{'yes' if bps / rate >= 0.85 else 'NO'} |")
        print(lines[-1], flush=True)
    return lines + ["", f"A {seconds:g} s stream; the rate of its last 60% (slow start is over by then).", ""]


def loss_table(specs) -> list[str]:
    lines = ["## Loss with latency: 4,000 UDP datagrams, host 0 to host 1", "",
             "| cluster | configured | measured | within 1 point |", "|---|---:|---:|---|"]
    for spec in specs:
        want = parse_cluster(spec).link.loss
        got = loss(spec)
        lines.append(f"| {spec} | {want:.1%} | {got:.2%} | {'yes' if abs(got - want) <= 0.01 else 'NO'} |")
        print(lines[-1], flush=True)
    return lines + [""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", nargs="+", default=["50mbit", "100mbit", "1gbit", "10gbit", "25gbit", "50gbit"])
    ap.add_argument("--latencies", nargs="+", default=["0ms", "1ms", "10ms"],
                    help="latencies of the rate table")
    ap.add_argument("--one-way-ms", nargs="+", type=float, default=[1, 10, 50, 100],
                    help="latencies of the latency table")
    ap.add_argument("--pings", type=int, default=60)
    ap.add_argument("--jitter", nargs="+", default=["2x1@1gbit,10ms,jitter=2ms", "2x1@100mbit,50ms,jitter=10ms"])
    ap.add_argument("--streams", nargs="+", default=["2x1@100mbit,50ms", "2x1@1gbit,10ms", "2x1@1gbit,50ms"])
    ap.add_argument("--stream-seconds", type=float, default=10.0)
    ap.add_argument("--loss", nargs="+", default=["2x1@100mbit,10ms,loss=1%", "2x1@100mbit,50ms,loss=5%"])
    ap.add_argument("--skip-rates", action="store_true", help="leave out the rate table (the slowest part)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "emulation_fidelity.md"))
    args = ap.parse_args()
    netem = has_netem()
    lines = ["# Emulation fidelity: 2x1 clusters, configured vs measured", "",
             f"Delay: {'netem' if netem else 'the userspace delay line (this kernel has no netem)'}.", ""]
    if not args.skip_rates:
        lines += rate_table(args.rates, args.latencies, netem)
    table, _ = latency_table(args.one_way_ms, args.pings)
    lines += table
    lines += jitter_table(args.jitter, max(args.pings, 200))
    lines += stream_table(args.streams, args.stream_seconds)
    lines += loss_table(args.loss)
    write_result(args.out, lines)


if __name__ == "__main__":
    main()
