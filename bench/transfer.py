"""Held-out transfer of the cost model: leave-one-workload-out and leave-one-cluster-out on a dataset.

Same evaluation as `autosync evaluate`: pairwise accuracy, Kendall tau, top-1 regret and
best-in-top-5 for the LightGBM ranker, the regressor, the simulator alone and the ranker
without simulator features.

The efficiency model (autosync/models/efficiency_model.py) is evaluated the same way, leave one
workload out, against predicting the training rows' mean; its card is rewritten.

    python bench/transfer.py [--data autosync/datasets/data]  ->  bench/results/transfer.md, transfer.png,
                                                                 autosync/models/pretrained/efficiency/card.json
"""
import argparse

from autosync.datasets import SHIPPED_DATA
from autosync.datasets.store import DatasetStore
from autosync.models import efficiency_model, training, transfer, uncertainty
from _results import RESULTS, write as write_result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(SHIPPED_DATA))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    store = DatasetStore(args.data, create=False)
    data = training.build(store)
    report = transfer.evaluate(data, seed=args.seed)
    transfer.plot(report, RESULTS / "transfer.png")
    lines = [f"# Cost-model transfer to held-out groups ({len(data.frame)} trials, "
             f"{data.frame.context_id.nunique()} contexts)", report.to_markdown(), "",
             "Medians over held-out groups of the per-context figures; plot: transfer.png.", ""]
    lines += interval_lines(uncertainty.write_card(data, seed=args.seed))
    lines += efficiency_lines(efficiency_model.write_card(store, seed=args.seed))
    write_result(RESULTS / "transfer.md", lines)
    print("\n".join(lines))


def interval_lines(card: dict) -> list[str]:
    ev = card["held_out_workload"]
    names = {"normalized": "normalized conformal (fold spread) - shipped", "constant": "constant-width conformal",
             "quantile": "LightGBM quantile 0.1/0.9", "gaussian": "fold ensemble as Gaussian (uncalibrated)"}
    out = [f"## Intervals of the regressor, leave one workload out ({ev['rows']} successful rows, nested "
           f"calibration)", "",
           f"Nominal level {ev['level']:.0%}; width = upper / lower bound as speedups (median over rows); above = "
           "share of rows measured above the interval. Shipped: q = "
           f"{card['q']:.2f} (normalized), calibrated on all {len(ev['workloads'])} workloads.", "",
           "| method | coverage | median width | above | " + " | ".join(ev["workloads"]) + " |",
           "|---|---:|---:|---:|" + "---:|" * len(ev["workloads"])]
    for method, m in ev["methods"].items():
        out.append(f"| {names[method]} | {m['coverage']:.3f} | {m['median_width']:.2f}x | {m['share_above']:.1%} | "
                   + " | ".join(f"{m['per_workload'][w]['coverage']:.2f}" for w in ev["workloads"]) + " |")
    z = ev["zero_shot_offline"]
    out += ["", f"Zero-shot pick among each held-out context's measured strategies ({z['contexts']} contexts; measured "
            "speedup of the pick / the context's best):", "",
            "| rule | median | mean | worst |", "|---|---:|---:|---:|",
            f"| point estimate | {z['point']['median']:.3f} | {z['point']['mean']:.3f} | {z['point']['worst']:.3f} |",
            f"| lower bound of the 80% interval | {z['lower']['median']:.3f} | {z['lower']['mean']:.3f} | "
            f"{z['lower']['worst']:.3f} |", "",
            "Out-of-distribution distance (standardized context features, nearest context of another workload, "
            "per held-out workload): " + ", ".join(f"{w} {d:.2f}" for w, d in card["reference"]["held_out_distance"]
                                                   .items()) + f"; flagged beyond {card['reference']['ood_distance']:.2f}.",
            ""]
    return out


def efficiency_lines(card: dict) -> list[str]:
    ev = card["held_out_workload"]
    m = ev["measured_efficiency"]
    out = [f"## Efficiency model, leave one workload out ({ev['rows']} measured lossy rows, {ev['workloads']} "
           "workloads)", "",
           f"Measured efficiencies: min {m['min']:.2f}, median {m['median']:.2f}, share below 0.95: "
           f"{m['share_below_0.95']:.0%}.",
           "", "The model predicts the conditional median (L1 loss); the constants to beat are the training median "
           "(least MAE of any constant) and mean.", "",
           "| held-out workload | rows | MAE of the model | MAE of the training median | MAE of the training mean |",
           "|---|---:|---:|---:|---:|"]
    out += [f"| {w} | {r['rows']} | {r['mae']:.3f} | {r['mae_median_baseline']:.3f} | {r['mae_mean_baseline']:.3f} |"
            for w, r in ev["per_workload"].items()]
    out += [f"| all | {ev['rows']} | {ev['mae']:.3f} | {ev['mae_median_baseline']:.3f} | {ev['mae_mean_baseline']:.3f} |",
            "",
            "Spearman rank correlation of held-out predictions with measurements: "
            + (f"{ev['spearman']:.2f}. " if ev["spearman"] is not None else "undefined (constant predictions). ") +
            f"With fewer than {card['min_rows']} training rows the model predicts 1.0 (optimistic: the tuner then "
            "measures the lossy finalists' efficiency before recommending one)."]
    return out


if __name__ == "__main__":
    main()
