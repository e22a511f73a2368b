"""Overhead of the autosync comm hook against DDP's built-in all-reduce.

Same workload, same ranks (one kept-alive pool), runs alternated A/B/C so that drift of
the machine hits all variants alike:
  builtin  - DDP with its built-in all-reduce (no comm hook)
  hook     - the allreduce plan through autosync's hook (one async all-reduce per bucket)
  worker   - the allreduce plan forced through the hook's segment worker thread, the path
             every other plan takes
Prints throughput medians and the ratios hook/builtin and worker/builtin (target >= 0.97),
and writes the table to bench/results/hook_overhead.md.

    python bench/hook_overhead.py [--workloads mlp bert-mini] [--nproc 2] [--rounds 5] [--steps 20]
"""
import argparse
import statistics
from pathlib import Path

from autosync import workloads
from autosync.executor.launch import RankPool
from autosync.executor.measure import TrialSpec, measure
from autosync.strategy import Strategy
from _results import RESULTS, write as write_result

VARIANTS = {"builtin": {"builtin_ddp": True}, "hook": {}, "worker": {"force_worker": True}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", nargs="+", default=["mlp", "bert-mini", "resnet-tiny"])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "hook_overhead.md"))
    args = ap.parse_args()
    strategy = Strategy.default().canonical()
    rows = []
    with RankPool(args.nproc) as pool:
        for wl in args.workloads:
            tput = {v: [] for v in VARIANTS}
            for _ in range(args.rounds):
                for name, extra in VARIANTS.items():
                    spec = TrialSpec(wl, strategy, workloads.default_batch_size(wl), warmup_steps=3,
                                     steps=args.steps, **extra)
                    result, _ = measure(pool, spec, timeout=600)
                    if not result.ok:
                        raise SystemExit(f"{wl}/{name}: {result.status}: {result.reason}")
                    tput[name].append(result.samples_per_s)
            med = {k: statistics.median(v) for k, v in tput.items()}
            rows.append((wl, med["builtin"], med["hook"], med["worker"], med["hook"] / med["builtin"],
                         med["worker"] / med["builtin"]))
            print(f"{wl}: builtin {med['builtin']:.1f}/s  hook {med['hook']:.1f}/s  worker {med['worker']:.1f}/s  "
                  f"hook/builtin {rows[-1][4]:.3f}  worker/builtin {rows[-1][5]:.3f}", flush=True)
    lines = [f"# Hook overhead ({args.nproc} local gloo ranks, {args.rounds} alternating rounds of {args.steps} "
             "timed steps, medians of samples/s)", "",
             "| workload | builtin DDP | autosync hook | hook via worker | hook/builtin | worker/builtin |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {w} | {b:.1f} | {h:.1f} | {k:.1f} | {r1:.3f} | {r2:.3f} |" for w, b, h, k, r1, r2 in rows]
    lines += ["", "Target: ratio >= 0.97."]
    write_result(args.out, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
