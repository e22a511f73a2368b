"""What a lossy stretch costs a training's convergence: the DDP default against the same training switched to a
lossy strategy at fixed steps, through the switcher `strategy="auto"` uses.

`strategy="auto"` explores lossy candidates in windows of the user's steps; on vit-tiny (bench/online_tuning.py) a
training that tried local SGD for one 8-step window near its start, then went back to DDP, did not reach L* within
twice the default's time, and one that committed to DiLoCo (period 16, outer lr 1, Nesterov momentum 0.9) stalled
above it. This benchmark separates the causes. Per seed (``--seeds``, default 1 2) it trains, with the efficiency
protocol's recipe (Adam at the workload's learning rate, the same weights, data order and held-out set per seed) and
untimed (only the math matters; one unshaped host per rank), each arm of ``--arms`` (default: the DDP default, one 8-step local SGD window at step 8, local SGD from step 48 on
and for 48 steps from there, and both DiLoCo variants from step 48 on) until the smoothed held-out loss
reaches L* (the DDP default's reference curves' loss at 3/4 of the efficiency horizon), or twice the horizon:

  DDP default             never switched
  local_sgd_8 @A+N        local SGD (period 8) for N steps from step A, then DDP again (N = 8: one explored window)
  local_sgd_8 @A          local SGD (period 8) from step A on (committed)
  diloco m0.9 @A          DiLoCo period 16, outer lr 1, Nesterov momentum 0.9, 4 fragments, from step A on
  diloco m0 @A            the same with no outer momentum
  ddp_1mb @A+N            a lossless switch (DDP with 1 MB buckets) for N steps from step A, then the default again:
                          what a change of rounding alone does to the trajectory
  local_sgd_8 applied @A  no switcher: local SGD (period 8) applied from the start with a bsp warm-up of A steps, as
                          the efficiency protocol trains it (``autosync.apply``); beside "local_sgd_8 @A" it tells
                          what the switch itself does from what local SGD does

Figures: steps to L* per seed ("never": not within twice the horizon) and the lowest smoothed held-out loss reached;
every curve (held-out and training loss) in the result file's .json.

    python bench/lossy_window.py [--workload vit-tiny] [--seeds 1 2] [--arms "DDP default" "local_sgd_8 @8+8" ...]
"""
import argparse
import json
import re
from pathlib import Path

from autosync import workloads as W
from autosync.datasets import SHIPPED_DATA
from autosync.datasets.store import DatasetStore
from autosync.efficiency import Curve, CurveSpec, smooth, steps_to, target
from autosync.efficiency.meter import EfficiencyMeter
from autosync.efficiency.train import train_curve
from autosync.strategy import Strategy
from _online import train_scheduled_curve
from _results import RESULTS, say, write as write_result

LOCAL = {"sync": {"mode": "local_sgd", "period": 8, "warmup_steps": 2}}
LOSSLESS = {"fusion": {"bucket_cap_mb": 1}}
DILOCO = {"sync": {"mode": "diloco", "period": 16, "outer_lr": 1.0, "outer_momentum": 0.9, "nesterov": True,
                   "warmup_steps": 2, "fragments": 4, "delay": 0, "mix": 0.0}}


ARMS = ["DDP default", "local_sgd_8 @8+8", "local_sgd_8 @48", "local_sgd_8 @48+48", "diloco m0.9 @48", "diloco m0 @48"]


def applied(arm: str) -> dict | None:
    """The strategy an "applied" arm trains by from its start (no switcher); None for another arm."""
    m = re.fullmatch(r"local_sgd_8 applied @(\d+)", arm)
    return Strategy.from_dict({"sync": dict(LOCAL["sync"], warmup_steps=int(m.group(1)))}).canonical() if m else None


def schedule(arm: str) -> list[tuple[int, dict]]:
    """The switches of an arm named as in the docstring: [(steps taken, strategy), ...]."""
    default = Strategy.default().canonical()
    if arm == "DDP default" or applied(arm) is not None:
        return []
    m = re.fullmatch(r"(local_sgd_8|diloco m0\.9|diloco m0|ddp_1mb) @(\d+)(\+(\d+))?", arm)
    if not m:
        raise ValueError(f"unknown arm {arm!r}")
    kind, at, length = m.group(1), int(m.group(2)), m.group(4)
    if kind == "ddp_1mb":
        raw = LOSSLESS
    elif kind == "local_sgd_8":
        raw = LOCAL
    else:
        raw = dict(DILOCO, sync=dict(DILOCO["sync"], outer_momentum=0.0 if kind == "diloco m0" else 0.9))
    out = [(at, Strategy.from_dict(raw).canonical())]
    if length:
        out.append((at + int(length), default))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="vit-tiny", choices=list(W.BUILTINS))
    ap.add_argument("--clusters", nargs="+", default=["2x1@1gbit"], help="the ranks (the links do not matter here)")
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--arms", nargs="+", default=ARMS, metavar="ARM", help="arms as the description names them")
    ap.add_argument("--refs", default=str(Path(__file__).parent / "work" / "time_to_quality" / "references"),
                    help="the store of the DDP default's reference curves (L*), beside the shipped dataset's")
    ap.add_argument("--out", default=str(RESULTS / "lossy_window.md"))
    args = ap.parse_args()
    for arm in args.arms:
        try:
            schedule(arm)
        except ValueError as e:
            ap.error(f"--arms: {e}")
    if not Path(args.refs).is_dir():
        ap.error(f"--refs {args.refs}: no such folder")

    from autosync.cluster import parse_cluster
    from autosync.executor.emulate import emulate

    arms = args.arms
    cluster = parse_cluster(args.clusters[0])
    wl, batch = args.workload, W.default_batch_size(args.workload)
    results: dict[tuple[str, int], tuple[int | None, float]] = {}
    curves = []
    with emulate(cluster, unshaped=True) as emu, emu.pool() as pool:
        with EfficiencyMeter(DatasetStore(args.refs), wl, batch, cluster.world_size, cluster.ranks_per_node,
                             also=[DatasetStore(SHIPPED_DATA)], progress=say) as meter:
            goal = target(meter.references(), meter.horizon)
            for seed in args.seeds:
                for arm in arms:
                    fixed = applied(arm)
                    spec = CurveSpec(wl, fixed or Strategy.default().canonical(), batch, meter.horizon,
                                     meter.eval_every, seed, meter.lr, meter.optimizer, signals=False, goal=goal,
                                     extend_to=2 * meter.horizon)
                    raw = (pool.run(train_curve, spec, timeout=1800) if fixed else
                           pool.run(train_scheduled_curve, spec, schedule(arm), timeout=1800))[0]
                    curve = Curve(raw["steps"], raw["eval_loss"], raw["train_loss"])
                    n = steps_to(curve.steps, curve.eval_loss, goal)
                    results[arm, seed] = (n, min(smooth(curve.eval_loss)))
                    curves.append({"arm": arm, "seed": seed, "schedule": schedule(arm), "applied": fixed,
                                   "steps": curve.steps, "eval_loss": curve.eval_loss, "train_loss": curve.train_loss})
                    say(f"{wl} seed {seed} {arm}: L* {goal:.4f} " + (f"at step {n:.0f}" if n else "never")
                        + f", lowest {results[arm, seed][1]:.4f}")
    lines = [f"# What a lossy stretch costs: {wl} on {cluster.world_size} ranks, switched at fixed steps", "",
             f"Steps to L* = {goal:.4f} per seed (held-out loss read every {meter.eval_every} steps, smoothed; "
             f"'never': not within {2 * meter.horizon} steps) and the lowest smoothed held-out loss reached. "
             "Untimed: the math of each arm, not its speed.", "",
             "| arm | " + " | ".join(f"seed {s}: steps to L* | lowest" for s in args.seeds) + " |",
             "|---|" + "---:|---:|" * len(args.seeds)]
    for arm in arms:
        cells = []
        for s in args.seeds:
            n, low = results[arm, s]
            cells += [f"{n:.0f}" if n else "never", f"{low:.4f}"]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    write_result(args.out, lines)
    Path(args.out).with_suffix(".json").write_text(json.dumps({"workload": wl, "target_loss": goal, "curves": curves}))


if __name__ == "__main__":
    main()
