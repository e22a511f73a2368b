"""The README's results table, read from the result files under bench/results/ (never typed by hand).

    python bench/summary.py                 # print the table
    python bench/summary.py --readme README.md   # rewrite the table between the README's markers

Each row names its figure, the file it comes from, and that file's commit and date (its header). A test
(tests/test_bench_results.py) fails when the README's table differs from what this script writes, so a figure
cannot drift from its file: re-run the benchmark, then this script.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
BEGIN, END = "<!-- results:begin (python bench/summary.py --readme README.md) -->", "<!-- results:end -->"


def header(name: str) -> dict[str, str]:
    """The command, commit and date a result file opens with."""
    text = (RESULTS / name).read_text()
    found = {k: re.search(rf"^{k}: (.+?)\s*$", text, re.M) for k in ("Command", "Commit", "Date")}
    missing = [k for k, m in found.items() if m is None]
    if missing:
        raise ValueError(f"bench/results/{name} does not open with its {', '.join(missing)}")
    return {k: m.group(1).strip("` ") for k, m in found.items()}


def table(name: str, first_column: str, having: str | None = None) -> list[dict[str, str]]:
    """The rows of the first Markdown table in ``name`` whose first header cell is ``first_column`` (and which has a
    column ``having``, when given)."""
    lines = (RESULTS / name).read_text().splitlines()
    for i, line in enumerate(lines):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_column and (having is None or having in cells):
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                rows.append(dict(zip(cells, (c.strip() for c in row.strip().strip("|").split("|")))))
            return rows
    raise ValueError(f"bench/results/{name} has no table starting with {first_column!r}")


def pick(rows: list[dict[str, str]], **where) -> dict[str, str]:
    hits = [r for r in rows if all(r.get(k) == v for k, v in where.items())]
    if len(hits) != 1:
        raise ValueError(f"expected one row with {where}, found {len(hits)}")
    return hits[0]


def _n(count: str, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == "1" else "s")


def figures() -> list[tuple[str, str, str]]:
    """(what, figure, result file) per row."""
    ttq = pick(table("time_to_quality.md", "clusters"), clusters="all")
    transfer = table("transfer.md", "split")
    held = pick(transfer, split="workload", method="regressor")
    coverage = pick(table("transfer.md", "method"), method="normalized conformal (fold spread) - shipped")
    hook = table("hook_overhead.md", "workload")
    ratios = [float(r[k]) for r in hook for k in ("hook/builtin", "worker/builtin")]
    rates = table("emulation_fidelity.md", "cluster", "delayed by")
    fidelity = [float(r["ratio"]) for r in rates if r["delayed by"] == "-"
                and int(r["configured Mbit/s"].replace(",", "")) <= 10_000]
    delayed = [float(r["ratio"]) for r in rates if r["delayed by"] != "-"
               and int(r["configured Mbit/s"].replace(",", "")) <= 1_000]
    latency = [float(r["measured - base"].split()[0]) / float(r["configured"].split()[0])
               for r in table("emulation_fidelity.md", "cluster", "measured - base")]
    streams = [float(r["ratio"]) for r in table("emulation_fidelity.md", "cluster", ">= 0.85")]
    sim = re.search(r"Median Spearman rho over (\d+) contexts: \*\*([0-9.]+)\*\*",
                    (RESULTS / "simulator_accuracy.md").read_text())
    online = table("online_tuning.md", "figure")
    auto = pick(online, figure="auto point end to end / DDP default (median)")   # "auto"'s default rule
    auto_m0 = pick(online, figure="tune m0 end to end / DDP default (median)")
    explore = pick(online, figure="auto point's exploration / its time to L* (median; max)")
    diloco = table("diloco.md", "comparison")
    outer = pick(diloco, comparison="diloco / local_sgd_8 (time to L*, higher = first faster)")
    low_tune = pick(diloco, comparison="tune m8 / the best baseline of its context (training only)")
    data = re.search(r"^# Dataset statistics: (\d+) trials, (\d+) ok, (\d+) contexts",
                     (RESULTS / "datasheet_stats.md").read_text(), re.M)
    return [
        (f"time to the target loss, `tune --measure 8`'s pick / the DDP default (median of {ttq['contexts']} "
         "contexts, training only, one timed run each)", f"{ttq['tune m8 / default']}x", "time_to_quality.md"),
        ("the same, `tune --measure 8`'s pick / the best hand-crafted baseline", f"{ttq['/ best baseline']}x",
         "time_to_quality.md"),
        ("the same end to end (the search's time added to the pick's)", f"{ttq['e2e tune m8 / default']}x",
         "time_to_quality.md"),
        ("`tune --measure 0` (prediction only) end to end / the DDP default", f"{ttq['e2e tune m0 / default']}x",
         "time_to_quality.md"),
        ("`tune --measure 8`'s pick / `tune --measure 0`'s, training only", f"{ttq['/ tune m0']}x",
         "time_to_quality.md"),
        (f'`strategy="auto"` (tuning inside the training) end to end / the DDP default (median of '
         f"{auto['contexts']} contexts, 2 seeds each, models without the workload)", auto["value"], "online_tuning.md"),
        ("`tune --measure 0` then train, end to end / the DDP default (the same contexts)", auto_m0["value"],
         "online_tuning.md"),
        ('`strategy="auto"`: time lost to exploring / its time to the target (median; max)', explore["value"],
         "online_tuning.md"),
        (f"on slow links (100-200 mbit): DiLoCo (outer Nesterov step, period 8) / plain parameter averaging every 8 "
         f"steps, time to the target (median of {_n(outer['contexts'], 'context')}, 2 seeds each)", f"{outer['median']}",
         "diloco.md"),
        (f"the same links: `tune --measure 8`'s pick (DiLoCo in its space) / the best baseline, DiLoCo's included "
         f"(median of {_n(low_tune['contexts'], 'context')})", f"{low_tune['median']}", "diloco.md"),
        ("cost model on a held-out workload: pairs of strategies ordered right (median)",
         held["pairwise acc. (median)"], "transfer.md"),
        ("its calibrated 80% interval: share of held-out measurements inside", coverage["coverage"], "transfer.md"),
        (f"simulator alone: rank correlation with measurement (median of {sim.group(1)} contexts)", sim.group(2),
         "simulator_accuracy.md"),
        ("the autosync hook's samples/s / DDP's built-in all-reduce", f"{min(ratios):.3f}-{max(ratios):.3f}",
         "hook_overhead.md"),
        ("emulated bandwidth / configured, 50 mbit to 10 gbit", f"{min(fidelity):.3f}-{max(fidelity):.3f}",
         "emulation_fidelity.md"),
        ("the same with 1 or 10 ms of latency (the delay line), 50 mbit to 1 gbit",
         f"{min(delayed):.3f}-{max(delayed):.3f}", "emulation_fidelity.md"),
        (f"emulated one-way latency / configured, {len(latency)} latencies from 1 to 100 ms (base subtracted)",
         f"{min(latency):.3f}-{max(latency):.3f}", "emulation_fidelity.md"),
        ("one TCP stream's rate / configured over a long path (100 mbit with 50 ms, 1 gbit with 10 and 50 ms)",
         f"{min(streams):.3f}-{max(streams):.3f}", "emulation_fidelity.md"),
        (f"trials in the shipped dataset ({data.group(3)} contexts)", f"{data.group(1)} ({data.group(2)} ok)",
         "datasheet_stats.md"),
    ]


def render() -> str:
    lines = [BEGIN, "| what (measured on this project's 2-core CPU machine) | figure | from | commit, date |",
             "|---|---:|---|---|"]
    for what, figure, name in figures():
        h = header(name)
        commit = h["Commit"].split()[0].strip("`")
        lines.append(f"| {what} | {figure} | [{name}](bench/results/{name}) | {commit}, {h['Date']} |")
    return "\n".join(lines + [END])


def readme_block(text: str) -> str:
    """The results block of a README's text (markers included)."""
    a, b = text.index(BEGIN), text.index(END) + len(END)
    return text[a:b]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--readme", type=Path, help="rewrite the table between the markers of this README")
    args = ap.parse_args(argv)
    block = render()
    if args.readme is None:
        print(block)
        return 0
    text = args.readme.read_text()
    args.readme.write_text(text.replace(readme_block(text), block))
    print(f"results table -> {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
