"""Rank pool starts: multiprocessing's forkserver (what RankPool uses) against spawn, and the forkserver's preload
(torch and torch.distributed alone, or with torch._dynamo, which every torch optimizer imports when it is built).

Each round runs one fresh Python process per arm, interleaved (spawn, forkserver, forkserver + dynamo, spawn, ...):
it starts ``--pools`` 2-rank pools one after another (as a `tune` does: the measured trials, the efficiency meter's
ranks, a restart after a failed trial), runs one small task on each (join the process group, an all-reduce, build
mlp and an SGD optimizer and train 20 steps, as a trial does) and closes it. The last arm, what RankPool uses,
also freezes the server's objects (``gc.freeze``, :mod:`autosync.executor._frozen`) before it forks. Per process: the wall time of the first start (under forkserver it includes the server's own
torch import), the median of the later ones, the whole process's wall time, and the CPU time the whole machine
spent meanwhile (/proc/stat: every process, the ranks and the forkserver included). Medians over ``--rounds``.

    python bench/pool_start.py [--rounds 5] [--pools 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _results import RESULTS, write as write_result


def _all_reduce(ctx):
    import torch
    import torch.distributed as dist

    from autosync import workloads

    t = torch.ones(1000)
    dist.all_reduce(t)
    model, make_batch = workloads.build("mlp", seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(ctx.rank)
    for _ in range(20):
        workloads.loss_of(model(**make_batch(32, gen))).backward()
        opt.step()
        opt.zero_grad()
    return float(t[0])


ARMS = {"spawn": ("spawn", None), "forkserver (torch)": ("forkserver", ["torch", "torch.distributed"]),
        "forkserver (torch + _dynamo)": ("forkserver", ["torch", "torch.distributed", "torch._dynamo"]),
        "forkserver (torch + _dynamo, frozen)": ("forkserver", ["torch", "torch.distributed", "torch._dynamo",
                                                                "autosync.executor._frozen"])}


def child(arm: str, pools: int) -> None:
    from autosync.executor import launch
    from autosync.executor.launch import RankPool

    method, preload = ARMS[arm]
    if preload:
        launch.PRELOAD = preload

    starts = []
    for _ in range(pools):
        t = time.monotonic()
        with RankPool(2, method=method) as pool:
            pool.start()
            starts.append(time.monotonic() - t)
            assert pool.run(_all_reduce) == [2.0, 2.0]
    print(json.dumps(starts))


def machine_cpu_s() -> float:
    with open("/proc/stat") as f:
        user, nice, system = (int(x) for x in f.readline().split()[1:4])
    return (user + nice + system) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pools", type=int, default=3, help="pools started one after another per process (default 3)")
    ap.add_argument("--child", nargs=2, metavar=("ARM", "POOLS"), help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(RESULTS / "pool_start.md"))
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return
    if args.rounds < 1 or args.pools < 2:
        ap.error("--rounds must be >= 1 and --pools >= 2")
    methods = tuple(ARMS)
    res = {m: {"first": [], "later": [], "wall": [], "cpu": []} for m in methods}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent.parent),
                                                        os.environ.get("PYTHONPATH", "")])}
    for r in range(args.rounds):
        for m in methods:
            c0, t0 = machine_cpu_s(), time.monotonic()
            out = subprocess.run([sys.executable, __file__, "--child", m, str(args.pools)], capture_output=True,
                                 text=True, env=env, timeout=600)
            wall, cpu = time.monotonic() - t0, machine_cpu_s() - c0
            if out.returncode != 0:
                sys.exit(f"pool_start: {m} failed: {out.stderr[-2000:]}")
            starts = json.loads(out.stdout.strip().splitlines()[-1])
            for k, v in (("first", starts[0]), ("later", statistics.median(starts[1:])), ("wall", wall), ("cpu", cpu)):
                res[m][k].append(v)
            print(f"round {r + 1} {m}: first start {starts[0]:.2f} s, later {statistics.median(starts[1:]):.2f} s, "
                  f"process {wall:.1f} s, machine CPU {cpu:.1f} s", flush=True)
    med = {m: {k: statistics.median(v) for k, v in res[m].items()} for m in methods}
    new = methods[-1]
    lines = ["# Rank pool start: forkserver against spawn, and what the forkserver preloads", "",
             f"{args.rounds} interleaved rounds; per round one fresh process per arm starting {args.pools} "
             f"2-rank pools in turn (each runs one all-reduce, then builds mlp and an SGD optimizer and trains 20 "
             f"steps, as a trial does). Medians; ratios = each arm / the last (> 1: the last is faster). RankPool "
             f"uses the last arm. {os.cpu_count()} cores.", "",
             f"| | {' | '.join(methods)} | " + " | ".join(f"{m} / last" for m in methods[:-1]) + " |",
             "|---|" + "---:|" * (2 * len(methods) - 1)]
    for k, what in (("first", "first pool start, s"), ("later", "each later pool start, s"),
                    ("wall", f"whole process ({args.pools} pools), s"), ("cpu", "machine CPU of the process, s")):
        lines.append(f"| {what} | {' | '.join(f'{med[m][k]:.2f}' for m in methods)} | "
                     + " | ".join(f"{med[m][k] / med[new][k]:.2f}x" for m in methods[:-1]) + " |")
    write_result(args.out, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
