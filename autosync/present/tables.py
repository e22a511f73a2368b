"""The tables the ``autosync`` command prints (rich), one function per command; the CLI only calls them."""
from __future__ import annotations

import json
import math
import sys

from autosync.present.text import measured_rows, uncertainty_lines


def console(stderr: bool = False):
    """A rich console; 120 columns when the stream is not a terminal (rich would assume 80)."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr) if stream.isatty() else Console(stderr=stderr, width=120)


def _table(title: str, columns, justify: str = "right"):
    from rich.table import Table

    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify=justify)
    return table


def sent_text(nbytes: float | None) -> str:
    """Bytes one rank sent to other hosts per step, measured; or why there is no figure."""
    if nbytes is None or nbytes != nbytes:
        return "not measured (no emulated hosts)"
    return f"{nbytes / 1e6:,.2f} MB (measured)"


def print_trial(result, as_json: bool, title: str, where: str | None = None) -> None:
    """One measured trial (``autosync run``); as JSON, ``where`` travels with the numbers as ``measured_on``."""
    if as_json:
        print(result.to_json() if where is None else json.dumps({**json.loads(result.to_json()), "measured_on": where}))
        return
    table = _table(title, ("status", "samples/s", f"step ({result.step_stat})", "CV", "peak mem",
                           "sent per step and rank", "ranks", "batch/rank"))
    table.add_row(result.status, f"{result.samples_per_s:,.1f}", f"{result.step_s * 1e3:.1f} ms",
                  f"{result.cv:.1%}", f"{result.peak_mem_mb:,.0f} MB", sent_text(result.sent_bytes_per_step),
                  str(result.world_size), str(result.batch_size))
    out = console()
    out.print(table)
    if result.reason:
        out.print(f"reason: {result.reason}", markup=False)


def print_auto(summary: dict, as_json: bool, title: str) -> None:
    """``autosync run --strategy auto``: each window (strategy, steps, median step of the slowest rank, speedup over
    the default's, outcome), then the commit, what exploring cost and the loss guard's state."""
    if as_json:
        print(json.dumps(summary))
        return
    table = _table(title, ("window", "source", "strategy", "steps", "median step", "speedup", "predicted", "outcome"))
    default = summary["default_step_s"]
    for i, w in enumerate(summary["windows"], 1):
        med = w["median_step_s"]
        table.add_row(str(i), w["source"], w["strategy"], str(w["steps"]),
                      f"{med * 1e3:.1f} ms" if med and w["steps"] else "-",
                      f"{default / med:.2f}x" if med and default and w["steps"] else "-",
                      f"{w['predicted_speedup']:.2f}x" if w["predicted_speedup"] else "-",
                      w["outcome"] + (" (while predicting: not compared)" if w["busy"] else ""))
    out = console()
    out.print(table)
    if summary["committed"]:
        out.print(f"committed at step {summary['committed_at']} of {summary['steps']} to {summary['committed']} "
                  f"({summary['committed_hash']}); {summary['exploration_steps']} steps by candidates not chosen "
                  f"({summary['lost_s']:.2f} s lost against the best), "
                  f"{summary['overhead_s']:.1f} s outside steps; {summary['wall_s']:.1f} s in all", markup=False)
    else:
        out.print(f"no commit within {summary['steps']} steps: give more --steps (each window is settle + window "
                  "steps; the default's, then one per candidate)", markup=False)
    if summary.get("guard"):
        out.print(f"loss guard: {summary['guard']}", markup=False)


def bandwidth_text(bps: float, world_size: int) -> str:
    """A fit with no time per byte has infinite bandwidth; at one rank that is because nothing is sent."""
    if bps != float("inf"):
        return f"{bps / 1e6:,.0f} Mbit/s"
    return "nothing sent (1 rank)" if world_size == 1 else "no time per byte measured"


def print_profile(profile, workload, out_path) -> None:
    m = profile.model
    table = _table(f"profile of {workload} on {profile.context.label} -> {out_path}", ("what", "value"))
    for what, value in [("parameters", f"{sum(p.numel for p in m.params) / 1e6:.2f} M in {len(m.params)} tensors"),
                        ("buckets at 25 MB", str(len(m.buckets(25)))),
                        ("forward / backward / optimizer", f"{m.forward_s * 1e3:.1f} / {m.backward_s * 1e3:.1f} / "
                                                           f"{m.optimizer_s * 1e3:.1f} ms"),
                        ("FLOPs per step", f"{m.flops_per_step / 1e9:.2f} G"),
                        ("peak memory", f"{m.peak_mem_mb:,.0f} MB")]:
        table.add_row(what, value)
    for scope, fits in profile.network.fits.items():
        f = fits["all_reduce"]
        table.add_row(f"all_reduce ({scope})", f"alpha {f.alpha_s * 1e6:,.0f} us, "
                                               f"{bandwidth_text(f.bandwidth_bps, profile.network.world_size)}")
    console().print(table)


def print_cluster_check(check) -> None:
    """``autosync cluster check``: links, paths (3 hosts or more) with the islands they allow, compute speeds."""
    out = console()
    table = _table(f"cluster {check.cluster}: host links (each to its peer host)",
                   ("host", "peer", "configured", "measured", "ratio", "configured latency", "measured latency"))
    for r in check.links:
        table.add_row(f"node{r.host}", f"node{r.peer}", f"{r.configured_bps / 1e6:,.0f} Mbit/s",
                      f"{r.measured_bps / 1e6:,.1f} Mbit/s", f"{r.measured_bps / r.configured_bps:.2f}",
                      f"{r.configured_latency_s * 1e3:.3f} ms", f"{r.measured_latency_s * 1e3:.3f} ms")
    out.print(table)
    if check.paths:
        n = check.cluster.nodes
        table = _table("host-to-host paths, measured Mbit/s (what selective receivers choose islands by)",
                       ["", *(f"node{b}" for b in range(n))])
        for a in range(n):
            table.add_row(f"node{a}", *("-" if a == b else f"{check.paths[a][b] / 1e6:,.0f}" for b in range(n)))
        out.print(table)
        print("islands for sync mode selective (fastest first): "
              + (", ".join(f"{p['text']} (reach {p['reach']:.0%})" for p in check.islands) if check.islands
                 else "none (the paths are even: bsp or local SGD)"))
    st = check.cluster.stragglers
    table = _table("compute speed per host (1 = a full share of this machine)"
                   + (f"; stragglers {st.slowdown:g}x for {st.fraction:.0%} of the time" if st else ""),
                   ("host", "configured", "measured", "matmuls/s"))
    for r in check.compute:
        table.add_row(f"node{r.host}", f"{r.configured_speed:.2f}", f"{r.measured_speed:.2f}", f"{r.rate:,.0f}")
    out.print(table)


def print_transfer(report, data) -> None:
    """``autosync evaluate``: the held-out transfer summary."""
    table = _table(f"transfer to held-out groups ({len(data.frame)} trials, {data.frame.context_id.nunique()} "
                   f"contexts)", ("split", "method", "pairwise acc.", "Kendall tau", "top-1 regret", "best in top 5"))
    for _, r in report.summary.iterrows():
        table.add_row(f"leave-one-{r.split}-out", str(r.method), f"{r.pairwise:.3f}", f"{r.kendall_tau:.3f}",
                      f"{r.regret:.1%}", f"{r.top5_hit:.0%}")
    console().print(table)


def measured_table(result, profile, workload):
    """The table of every strategy a tune measured."""
    rows = measured_rows(result)
    peers = any(r["worker"] for r in rows)
    table = _table(f"measured on {profile.context.label} ({workload}, batch {profile.model.batch_size}/rank; "
                   f"objective {result.objective})",
                   ["source", "strategy", "lossy", "predicted", "status", "samples/s", "+-spread", "speedup",
                    "efficiency", "time to target", "MB sent/step"] + (["by"] if peers else []))
    for r in rows:
        pred = "-" if math.isnan(r["predicted_speedup"]) else f"{r['predicted_speedup']:.2f}x"
        if r["predicted_interval"] and pred != "-":
            pred += " [{:.2f}-{:.2f}]".format(*r["predicted_interval"])
        tt = ("-" if r["time_speedup"] is None else "never" if r["time_speedup"] == 0 else
              f"{r['time_speedup']:.2f}x" + (" pred." if r["time_speedup_predicted"] else ""))
        cells = [r["source"], r["hash"][:8], "yes" if r["lossy"] == "lossy" else "no", pred, r["status"],
                 f"{r['samples_per_s']:,.1f}" if r["samples_per_s"] else "-",
                 f"{r['spread'] / 2:.0%} ({r['rounds']})" if r["spread"] is not None else "-",
                 f"{r['speedup']:.2f}x" if r["speedup"] else "-", r["efficiency_short"], tt,
                 "-" if r["sent_bytes_per_step"] is None else f"{r['sent_bytes_per_step'] / 1e6:,.2f}"]
        table.add_row(*cells, *([r["worker"] or "this run"] if peers else []))
    return table


def tune_summary(result) -> list[str]:
    """The lines that close a tune's output: the pick and its figures, the uncertainty, why and notes."""
    pick = result.pick
    line = f"recommended: {result.source} ({result.strategy.hash}, " \
           f"{'lossless' if result.strategy.is_lossless else 'LOSSY'})"
    if result.speedup_over_default:
        line += f", {result.speedup_over_default:.2f}x the DDP default per step"
        tt = result.time_speedup(pick) if pick else None
        if pick and pick.lossy and tt:
            line += f", {tt:.2f}x to the target loss (efficiency {pick.efficiency:.2f})"
    if result.speedup_over_best_baseline:
        line += f", {result.speedup_over_best_baseline:.2f}x the best baseline ({result.best_baseline[0]})"
    if not math.isnan(result.predicted_speedup):
        line += f"; predicted {result.predicted_speedup:.2f}x"
    lines = [line, *uncertainty_lines(result)]
    if result.why:
        lines.append(f"why not the fastest per step: {result.why}")
    if result.note:
        lines.append(f"note: {result.note}")
    if result.peer_measurements_seen:
        lines.append(f"shared study: proposals learned from {result.peer_measurements_seen} measurement(s) of other "
                     f"workers")
    return lines


def print_tune(result, profile, workload, out_path, plot_path, report_path, data) -> None:
    """Everything a tune leaves: the strategy file, the measured table, the plot, the report page and the summary."""
    from pathlib import Path

    from autosync.datasets.store import DatasetStore
    from autosync.present.plot import plot_predicted_vs_measured
    from autosync.present.report import write_report
    from autosync.present.text import strategy_file_text

    Path(out_path).write_text(strategy_file_text(result, profile))
    out = console()
    if result.measured:
        out.print(measured_table(result, profile, workload))
        plot_predicted_vs_measured(result, plot_path)
        out.print(f"plot -> {plot_path}")
    write_report(result, profile, report_path, DatasetStore(data, create=False) if Path(data).is_dir() else None)
    out.print(f"report -> {report_path}")
    for line in tune_summary(result):
        out.print(line, markup=False)
    out.print(f"search overhead {result.search_seconds:.1f} s for {result.candidates_scored} candidates; "
              f"strategy -> {out_path}", markup=False)
