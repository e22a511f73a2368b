"""The analytical simulator against measurement, per context of a dataset.

For every context: Spearman rank correlation between the simulator's predicted step time
(recomputed from the stored profile, so it reflects the current simulator) and the
measured median step time, over the successful trials; and the median ratio
predicted/measured. Prints the table and the median correlation (target >= 0.7), over every
context and, separately, over the contexts with a latency of at least 1 ms one way (emulated by
the delay line; target >= 0.7 there too).

    python bench/simulator_accuracy.py [--data autosync/datasets/data]  ->  bench/results/simulator_accuracy.md
"""
import argparse
import statistics
from pathlib import Path

from scipy.stats import spearmanr

from autosync.datasets import SHIPPED_DATA
from autosync.datasets.store import DatasetStore
from autosync.models.simulator import simulate
from autosync.profiler import Profile
from autosync.strategy import loads_strategy
from _results import RESULTS, write as write_result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(SHIPPED_DATA))
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "simulator_accuracy.md"))
    args = ap.parse_args()
    store = DatasetStore(args.data, create=False)
    df = store.read()
    df = df[df.status == "ok"]
    rows = []
    for ctx, part in sorted(df.groupby("context_id")):
        raw = store.load_profile_dict(ctx)
        if raw is None or len(part) < 5:
            continue
        profile = Profile.from_dict(raw)
        predicted = [simulate(profile, loads_strategy(s)).step_s for s in part.strategy]
        rho = spearmanr(predicted, part.median_step_s).statistic
        ratio = statistics.median(p / m for p, m in zip(predicted, part.median_step_s))
        rows.append((ctx, len(part), rho, ratio, float(part.latency_s.max()) >= 1e-3))
    lines = ["# Simulator vs measurement, per context (successful trials)", "",
             "| context | trials | Spearman rho | median predicted/measured | latency >= 1 ms |",
             "|---|---:|---:|---:|---|"]
    lines += [f"| {c} | {n} | {r:.3f} | {q:.2f} | {'yes' if far else ''} |" for c, n, r, q, far in rows]
    med = statistics.median(r for _, _, r, _, _ in rows)
    far = [r for _, _, r, _, f in rows if f]
    lines += ["", f"Median Spearman rho over {len(rows)} contexts: **{med:.3f}** (target >= 0.7).", ""]
    if far:
        lines += [f"Over the {len(far)} contexts with a latency (>= 1 ms one way, the delay line): median "
                  f"Spearman rho **{statistics.median(far):.3f}** (target >= 0.7), range "
                  f"{min(far):.3f}-{max(far):.3f}.", ""]
    write_result(args.out, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
