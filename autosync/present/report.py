"""``report.html``: one self-contained page a person reads before trusting a tune's pick.

Written by ``autosync tune`` beside the strategy file (``--report``). It holds, with nothing fetched at
view time (plots are inline PNG):

- the context: workload, batch, cluster, and what was real, emulated, unshaped or predicted;
- the pick: its strategy (summary and YAML), lossy or not, measured and predicted speedups, statistical
  efficiency and time to the target loss, and why a faster-per-step strategy was not taken;
- every measured strategy with its figures (the table of ``tune``);
- predicted vs measured speedup (the cost model's scatter);
- loss against wall-clock time for the DDP default, the best hand-crafted baseline and the pick, where their
  efficiency curves are stored: the curve's held-out loss per step (trained on loopback ranks by the
  efficiency protocol) on a time axis of the step time measured on the cluster. The page labels it so: it is
  derived, not a timed run.
"""
from __future__ import annotations

import base64
import html
import io
import json
import math
from pathlib import Path

from autosync.present.plot import plot_predicted_vs_measured
from autosync.present.text import measured_rows, uncertainty_lines
from autosync.search.result import TuneResult


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _scatter(result: TuneResult) -> str | None:
    import tempfile

    if not result.default_samples_per_s or not any(m.status == "ok" for m in result.measured):
        return None
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "scatter.png"
        plot_predicted_vs_measured(result, path)
        return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def loss_curves(result: TuneResult, profile, store) -> list[dict]:
    """Per arm (DDP default, best baseline, pick): its stored efficiency curve on a time axis of its measured
    step time. An arm without a stored curve is left out."""
    from autosync import efficiency

    if store is None or not result.measured:
        return []
    rows = store.efficiency_rows()
    c = profile.cluster
    wl, batch = profile.model.workload, profile.model.batch_size
    by_hash = {m.strategy.hash: m for m in result.measured if m.status == "ok"}
    arms = [("DDP default", next((m for m in result.measured if m.source == "ddp_default"), None))]
    if result.best_baseline:
        arms.append((f"best baseline ({result.best_baseline[0]})",
                     next((m for m in result.measured if m.source == result.best_baseline[0]), None)))
    arms.append(("autosync pick", by_hash.get(result.strategy.hash)))
    out, seen = [], set()
    for label, m in arms:
        if m is None or m.status != "ok" or m.strategy.hash in seen:
            continue
        seen.add(m.strategy.hash)
        if m.lossy:
            where = None if profile.env.get("network") == "unshaped" else c.spec()   # as tune's meter keys asp
            ekey = efficiency.key(wl, batch, c.world_size, c.ranks_per_node, m.strategy, where)
        else:
            ekey = efficiency.reference_key(wl, batch, c.world_size, 0)
        row = rows.get(ekey)
        if not row or not row.get("curve"):
            continue
        curve = json.loads(row["curve"])
        step_s = batch * c.world_size / m.confirmed_samples_per_s
        out.append({"label": label, "lossy": m.lossy, "seconds": [s * step_s for s in curve["steps"]],
                    "loss": curve["eval_loss"], "step_s": step_s, "target": row.get("target_loss")})
    return out


def _curves_png(curves: list[dict]) -> str | None:
    if not curves:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for c in curves:
        ax.plot(c["seconds"], c["loss"], marker="o", ms=3, lw=1.4,
                label=f"{c['label']}{' (LOSSY)' if c['lossy'] else ''}, {c['step_s'] * 1e3:.0f} ms/step")
    goal = next((c["target"] for c in curves if c.get("target") is not None and math.isfinite(c["target"])), None)
    if goal is not None:
        ax.axhline(goal, color="grey", ls="--", lw=0.8, label=f"target loss L* = {goal:.3g}")
    losses = [v for c in curves for v in c["loss"] if v > 0]
    if losses and max(losses) / min(losses) > 20:
        ax.set_yscale("log")
    ax.set_xlabel("wall-clock seconds of training (measured step time x steps)")
    ax.set_ylabel("held-out loss (efficiency protocol, loopback)")
    ax.set_title("loss against time: derived from stored curves")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _png(fig)


CSS = """body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9em}td,th{padding:.25em .6em;border-bottom:1px solid #eee;text-align:right}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}.lossy{color:#b00;font-weight:600}
.note{color:#555;font-size:.9em}pre{background:#f7f7f7;padding:.8em;font-size:.85em;overflow:auto}
.kv td{text-align:left}.pick{background:#eef7ee}img{max-width:100%}"""


def _facts(result: TuneResult, profile) -> list[tuple[str, str]]:
    """The context table: what was tuned, where, and how the figures were obtained."""
    env = profile.env if isinstance(profile.env, dict) else {}
    network = env.get("network", "emulated")
    what = {"emulated": "measured on an emulated cluster (network namespaces, tc shaping, CPU limits on this "
                        "machine)",
            "unshaped": "measured on unshaped loopback ranks (no network emulation)",
            "real": "measured on the real job's ranks and devices",
            "nominal": "network from the spec's numbers (nominal, not measured)"}.get(network, network)
    facts = [("workload", f"{profile.model.workload} (batch {profile.model.batch_size} per rank)"),
             ("cluster", str(profile.cluster)), ("context", profile.context.label), ("network", what),
             ("backend / device", f"{env.get('backend', 'gloo')} / {env.get('device', 'cpu')}"),
             ("objective", result.objective),
             ("measured", f"{sum(m.status == 'ok' for m in result.measured)} strategies"
                          + (f", confirmed over {result.confirm_rounds} interleaved round(s)"
                             if result.confirm_rounds else "")),
             ("cost model", "predicted speedups come from the LightGBM cost model; measured ones from real "
                            "torch.distributed runs")]
    if env.get("host_speeds"):
        facts.append(("host speeds (measured)", " / ".join(f"{s:.2f}" for s in env["host_speeds"])))
    return facts


def _verdict(result: TuneResult) -> list[str]:
    """The pick's lines: which strategy, its measured and predicted figures, and what it costs when lossy."""
    pick = result.pick
    verdict = [f"source {result.source}, strategy {result.strategy.hash}", result.strategy.summary()]
    if result.speedup_over_default:
        verdict.append(f"{result.speedup_over_default:.2f}x the DDP default per step (measured)")
    if result.speedup_over_best_baseline and result.best_baseline:
        verdict.append(f"{result.speedup_over_best_baseline:.2f}x the best baseline ({result.best_baseline[0]})")
    if not math.isnan(result.predicted_speedup):
        verdict.append(f"predicted {result.predicted_speedup:.2f}x")
    if pick is not None and not result.strategy.is_lossless:
        tt = result.time_speedup(pick)
        verdict.append(f"LOSSY: statistical efficiency {pick.efficiency:.2f} ({pick.efficiency_source})"
                       + (f", {tt:.2f}x the DDP default to the target loss" if tt else ""))
    return verdict


def _measured_html(result: TuneResult) -> str:
    """The table of every measured strategy ('' when nothing was measured)."""
    e = html.escape
    rows = measured_rows(result)
    if not rows:
        return ""
    cols = ["source", "strategy", "lossy", "status", "samples/s", "+-spread", "speedup", "predicted",
            "efficiency", "time to target", "MB sent/step/rank"]
    body = []
    for r in rows:
        tt = ("-" if r["time_speedup"] is None else "never" if r["time_speedup"] == 0 else
              f"{r['time_speedup']:.2f}x" + (" pred." if r["time_speedup_predicted"] else ""))
        cells = [r["source"], r["hash"][:8], r["lossy"], r["status"] + (f" ({r['reason'][:60]})" if r["reason"]
                                                                       and r["status"] != "ok" else ""),
                 f"{r['samples_per_s']:,.1f}" if r["samples_per_s"] else "-",
                 f"{r['spread'] / 2:.0%} ({r['rounds']})" if r["spread"] is not None else "-",
                 f"{r['speedup']:.2f}x" if r["speedup"] else "-",
                 "-" if math.isnan(r["predicted_speedup"]) else f"{r['predicted_speedup']:.2f}x"
                 + (" [{:.2f}-{:.2f}]".format(*r["predicted_interval"]) if r["predicted_interval"] else ""),
                 r["efficiency"], tt,
                 "-" if r["sent_bytes_per_step"] is None else f"{r['sent_bytes_per_step'] / 1e6:,.2f}"]
        cls = " class='pick'" if r["hash"] == result.strategy.hash else ""
        body.append(f"<tr{cls}>" + "".join(f"<td{' class=lossy' if c == 'lossy' else ''}>{e(str(c))}</td>"
                                           for c in cells) + "</tr>")
    return ("<h2>Every measured strategy</h2><table><tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>"
            + "".join(body) + "</table><p class='note'>speedup = measured samples/s over the DDP default's; time to "
            "target = speedup x statistical efficiency (lossless: 1); MB sent/step/rank = bytes one rank sent to other hosts "
            "per step, measured at the emulated hosts' interfaces (- where not measured); the pick is highlighted.</p>")


def _plots_html(result: TuneResult, profile, store) -> list[str]:
    parts = []
    scatter = _scatter(result)
    if scatter:
        parts.append(f"<h2>Predicted vs measured</h2><img alt='predicted vs measured speedup' src='{scatter}'>")
    curves = _curves_png(loss_curves(result, profile, store))
    parts.append("<h2>Loss against wall-clock time</h2>")
    if curves:
        parts.append(f"<img alt='loss against time' src='{curves}'><p class='note'>Derived, not a timed run: each "
                     "curve is the held-out loss per step measured by the efficiency protocol on loopback ranks "
                     "(same initial weights and data for every arm; lossless strategies share the reference "
                     "curve), placed on a time axis of the step time measured on the cluster.</p>")
    else:
        parts.append("<p class='note'>No stored loss curves for these strategies (they are measured by "
                     "<code>--objective time-to-loss</code> for lossy finalists and the reference).</p>")
    return parts


def render(result: TuneResult, profile, store=None, during_training: bool = False) -> str:
    """The report's HTML (a string): context, pick, notes, the strategy, every measured strategy, plots.
    ``during_training``: the figures come from ``strategy="auto"``'s windows of a training, and say so."""
    e = html.escape
    title = f"{e(profile.model.workload)} on {e(str(profile.cluster))}"
    heading = 'autosync auto (measured during training)' if during_training else "autosync tune"
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>autosync report: {title}</title>"
             f"<style>{CSS}</style></head><body>", f"<h1>{heading}: {title}</h1>",
             "<h2>Context</h2><table class='kv'>"
             + "".join(f"<tr><td><b>{e(k)}</b></td><td>{e(str(v))}</td></tr>" for k, v in _facts(result, profile))
             + "</table>",
             "<h2>Pick</h2><p" + ("" if result.strategy.is_lossless else " class='lossy'") + ">"
             + "<br>".join(e(v) for v in _verdict(result)) + "</p>"]
    for line in uncertainty_lines(result):   # interval, zero-shot rule, nearest contexts, out-of-distribution flags
        parts.append(f"<p class='note'>{e(line)}</p>")
    if result.why:
        parts.append(f"<p class='note'>Why not the fastest per step: {e(result.why)}</p>")
    if result.note:
        parts.append(f"<p class='note'>Note: {e(result.note)}</p>")
    parts += [f"<pre>{e(result.strategy.to_yaml())}</pre>", _measured_html(result), *_plots_html(result, profile, store),
              f"<p class='note'>Written by {heading}.</p></body></html>"]
    return "\n".join(p for p in parts if p)


def write_report(result: TuneResult, profile, path: str | Path, store=None, during_training: bool = False) -> Path:
    """Write :func:`render` to ``path`` atomically."""
    import os

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render(result, profile, store, during_training))
    os.replace(tmp, path)
    return path
