"""Single-process step time of every built-in workload at its default batch size, one thread.

    python bench/workload_step_times.py   ->  bench/results/workload_step_times.md
"""
import statistics
import time
from pathlib import Path

import torch

from autosync import workloads
from _results import RESULTS, write as write_result


def main() -> None:
    torch.set_num_threads(1)
    lines = ["# Built-in workloads: one step (forward, backward, SGD step) on one core", "",
             "| workload | params | batch | median step (s) |", "|---|---:|---:|---:|"]
    for name in workloads.BUILTINS:
        model, make_batch = workloads.build(name)
        batch_size = workloads.default_batch_size(name)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        gen = torch.Generator().manual_seed(0)
        times = []
        for _ in range(13):
            batch = make_batch(batch_size, gen)
            t0 = time.perf_counter()
            workloads.loss_of(model(**batch)).backward()
            opt.step()
            opt.zero_grad()
            times.append(time.perf_counter() - t0)
        params = sum(p.numel() for p in model.parameters()) / 1e6
        lines.append(f"| {name} | {params:.1f} M | {batch_size} | {statistics.median(times[3:]):.3f} |")
        print(lines[-1], flush=True)
    lines += ["", ""]
    write_result(RESULTS / "workload_step_times.md", lines)


if __name__ == "__main__":
    main()
