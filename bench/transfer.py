"""Held-out transfer of the cost model: leave-one-workload-out and leave-one-cluster-out on a dataset.

Same evaluation as `autosync evaluate`: pairwise accuracy, Kendall tau, top-1 regret and
best-in-top-5 for the LightGBM ranker, the regressor, the simulator alone and the ranker
without simulator features.

    python bench/transfer.py [--data autosync/datasets/data]  ->  bench/results/transfer.md, transfer.png
"""
import argparse
from pathlib import Path

from autosync.datasets.store import DatasetStore
from autosync.models import training, transfer
from _results import RESULTS, write as write_result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(Path(__file__).parent.parent / "autosync" / "datasets" / "data"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    data = training.build(DatasetStore(args.data, create=False))
    report = transfer.evaluate(data, seed=args.seed)
    transfer.plot(report, RESULTS / "transfer.png")
    lines = [f"# Cost-model transfer to held-out groups ({len(data.frame)} trials, "
             f"{data.frame.context_id.nunique()} contexts)", report.to_markdown(), "",
             "Medians over held-out groups of the per-context figures; plot: transfer.png."]
    write_result(RESULTS / "transfer.md", lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
