"""Coverage and outcome tables of a dataset, for its DATASHEET.

    python bench/datasheet_stats.py [--data autosync/datasets/data]  ->  bench/results/datasheet_stats.md
"""
import argparse

from autosync.datasets import SHIPPED_DATA
from autosync.datasets.store import DatasetStore
from _results import RESULTS, write as write_result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", default=str(SHIPPED_DATA))
    args = ap.parse_args()
    df = DatasetStore(args.data, create=False).read()
    ok = df[df.status == "ok"]
    lines = [f"# Dataset statistics: {len(df)} trials, {len(ok)} ok, {df.context_id.nunique()} contexts, "
             f"{df.workload.nunique()} workloads, {df.cluster.nunique()} clusters", "",
             "## Successful trials per workload and cluster", ""]
    table = ok.pivot_table(index="workload", columns="cluster", values="strategy_hash", aggfunc="count", fill_value=0)
    lines.append("| workload | " + " | ".join(table.columns) + " |")
    lines.append("|---|" + "---:|" * len(table.columns))
    for wl, row in table.iterrows():
        lines.append(f"| {wl} | " + " | ".join(str(int(v)) for v in row) + " |")
    lines += ["", "## Outcomes", "", "| status | trials |", "|---|---:|"]
    lines += [f"| {s} | {n} |" for s, n in df.status.value_counts().items()]
    failed = df[df.status != "ok"]
    if len(failed):
        lines += ["", "## Reasons of failed and timed-out trials (first 80 characters)", "", "| reason | trials |",
                  "|---|---:|"]
        lines += [f"| {r} | {n} |" for r, n in failed.reason.str.slice(0, 80).str.replace("|", "/")
                  .value_counts().items()]
    lines += ["", "## Within-trial noise (coefficient of variation of the timed steps)", "",
              f"median {ok.cv.median():.1%}, 90th percentile {ok.cv.quantile(0.9):.1%}, "
              f"median timed steps {ok.steps.median():.0f}", "",
              "## Speedup over the DDP default of the same context", ""]
    ref = ok[ok.source == "ddp_default"].set_index("context_id").samples_per_s
    sp = ok.samples_per_s / ok.context_id.map(ref)
    lines += [f"best per context: median {sp.groupby(ok.context_id).max().median():.2f}x; "
              f"share of strategies slower than the default: {(sp < 1).mean():.0%}"]
    lines += ["", ""]
    write_result(RESULTS / "datasheet_stats.md", lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
