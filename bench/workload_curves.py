"""Does every built-in workload's loss keep falling over the efficiency horizon? One process, one thread.

Each workload trains from seed 0 at its default batch size with the efficiency protocol's optimizer (Adam at
the workload's learning rate, `efficiency.lr_of`) for the horizon (240 steps); the held-out loss (8 batches'
worth, at most 512 samples, a fixed generator no training batch uses) is read 4 times. "falling" = the last
quarter still lowered it by >= 1%; "drop by L*" = the fall up to 3/4 of the horizon, which the efficiency
protocol needs to be >= 2% (`autosync/efficiency/__init__.py`: FLAT_DROP).

    python bench/workload_curves.py [--workloads ...] [--steps 240]  ->  bench/results/workload_curves.md
"""
import argparse
import time

import torch

from autosync import efficiency, workloads as W
from _results import RESULTS, write as write_result


def curve(name: str, steps: int) -> tuple[float, list[float], float]:
    model, make_batch = W.build(name)
    batch = W.default_batch_size(name)
    opt = torch.optim.Adam(model.parameters(), lr=efficiency.lr_of(name))
    held_out = make_batch(min(512, batch * 8), torch.Generator().manual_seed(efficiency.EVAL_SEED))

    def evaluate() -> float:
        with torch.no_grad():
            return float(W.loss_of(model(**held_out)))

    gen, start, losses, t0 = torch.Generator().manual_seed(0), evaluate(), [], time.perf_counter()
    for step in range(1, steps + 1):
        loss = W.loss_of(model(**make_batch(batch, gen)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % (steps // 4) == 0:
            losses.append(evaluate())
    return start, losses, (time.perf_counter() - t0) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", nargs="+", default=list(W.BUILTINS))
    ap.add_argument("--steps", type=int, default=efficiency.DEFAULT_HORIZON)
    args = ap.parse_args()
    torch.set_num_threads(1)
    q = args.steps // 4
    lines = [f"# Built-in workloads: held-out loss over {args.steps} steps (one process, Adam)", "",
             f"| workload | batch | lr | s/step | step 0 | {q} | {2 * q} | {3 * q} | {4 * q} | drop by L* | "
             "last quarter | verdict |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name in args.workloads:
        start, losses, s_per_step = curve(name, args.steps)
        by_target = 1 - losses[2] / start
        last = 1 - losses[3] / losses[2]
        verdict = "falling" if by_target >= efficiency.FLAT_DROP and last >= 0.01 else (
            "flat" if by_target < efficiency.FLAT_DROP else "levelling off")
        lines.append(f"| {name} | {W.default_batch_size(name)} | {efficiency.lr_of(name):g} | {s_per_step:.3f} | "
                     f"{start:.3f} | "
                     + " | ".join(f"{v:.3f}" for v in losses) + f" | {by_target:.1%} | {last:.1%} | {verdict} |")
        print(lines[-1], flush=True)
    lines += [""]
    write_result(RESULTS / "workload_curves.md", lines)


if __name__ == "__main__":
    main()
