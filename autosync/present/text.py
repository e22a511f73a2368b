"""What a person reads of a tune, as text: the strategy file's comments, the rows of the measured table, the
lines on the prediction's uncertainty and on each strategy's statistical efficiency."""
from __future__ import annotations

import math

from autosync.efficiency import BAND_LIMIT
from autosync.models.uncertainty import LEVEL
from autosync.profiler import Profile
from autosync.search.config import ZERO_SHOT_RULES
from autosync.search.result import Measured, TuneResult


def interval_text(interval: tuple[float, float] | None, level: float = LEVEL) -> str:
    return f"{level:.0%} interval {interval[0]:.2f}-{interval[1]:.2f}x" if interval else "no interval"


def uncertainty_lines(result: TuneResult) -> list[str]:
    """What the output and the strategy file say about the prediction's uncertainty: the pick's interval and
    rule, the other rule's pick when it differs, the nearest dataset contexts, and the
    out-of-distribution flags."""
    lines = []
    what = "goodput" if result.objective == "time-to-loss" else "speedup"
    if result.source == "predicted":
        if result.interval:
            lines.append(f"predicted {what} {result.predicted_speedup:.2f}x the DDP default, "
                         f"{interval_text(result.interval, result.level)} (calibrated leave one workload out); "
                         f"picked by the {result.rule}")
        if result.alternative:
            rule, other, pred, iv = result.alternative
            lines.append(f"by the {ZERO_SHOT_RULES[rule]} (--zero-shot {rule}) the pick would be {other.summary()} "
                         f"({other.hash}), predicted {pred:.2f}x with {interval_text(iv, result.level)}")
    if result.nearest:
        lines.append("nearest dataset contexts: " + ", ".join(f"{w} on {c} (distance {d:.1f})"
                                                           for d, w, c in result.nearest))
    for reason in result.ood:
        lines.append(f"OUT OF DISTRIBUTION: {reason}; predictions here are extrapolations"
                     + ("" if result.source == "predicted" else
                        ", so the best-predicted lossless baseline was measured after the DDP default"))
    return lines


def _lower_bound(m: Measured) -> bool:
    """Whether a measured efficiency is its band's lower bound (the band stayed wider than BAND_LIMIT)."""
    return m.efficiency_band is not None and m.efficiency_band > BAND_LIMIT and bool(m.efficiency_raw)


def efficiency_text(m: Measured) -> str:
    """A strategy's efficiency as a person reads it, saying what it is: ``1 (lossless)``; ``0.88 [0.87-0.89]
    measured (1 seed pair)`` (the raw ratio, with raw x (1 -+ band)); where the band stayed wide, its lower bound
    decides and the text says so (``0.18 measured: the lower bound of raw 0.52 [0.18-0.86] (4 seed pairs; the band
    stayed wider than +-15%)``); ``0.80 predicted`` (the efficiency model's, not measured)."""
    if not m.lossy:
        return "1 (lossless)"
    if m.efficiency_source in ("flat", "failed"):
        return f"unknown ({'reference too flat' if m.efficiency_source == 'flat' else 'run failed'})"
    if m.efficiency_source != "measured":
        return f"{m.efficiency:.2f} {m.efficiency_source}"
    band = f"[{m.efficiency_lo:.2f}-{m.efficiency_hi:.2f}]"
    pairs = f"{m.efficiency_pairs} seed pair{'s' if m.efficiency_pairs > 1 else ''}"
    if _lower_bound(m):
        return (f"{m.efficiency:.2f} measured: the lower bound of raw {m.efficiency_raw:.2f} {band} ({pairs}; the "
                f"band stayed wider than +-{BAND_LIMIT:.0%})")
    return f"{m.efficiency:.2f} {band} measured ({pairs})"


def _efficiency_short(m: Measured) -> str:
    if not m.lossy:
        return "1 lossless"
    if m.efficiency_source in ("flat", "failed"):
        return "unknown"
    if m.efficiency_source == "predicted":
        return f"{m.efficiency:.2f} pred."
    if _lower_bound(m):
        return f"{m.efficiency:.2f} (lower bound; raw {m.efficiency_raw:.2f})"
    return f"{m.efficiency:.2f} [{m.efficiency_lo:.2f}-{m.efficiency_hi:.2f}]"


def measured_rows(result: TuneResult) -> list[dict]:
    """One row per measured strategy: what the table and the strategy file show."""
    rows = []
    for m in result.measured:
        sp, tt = result.speedup(m), result.time_speedup(m)
        rows.append({"source": m.source, "hash": m.strategy.hash, "lossy": "lossy" if m.lossy else "lossless",
                     "status": m.status, "samples_per_s": m.confirmed_samples_per_s if m.status == "ok" else None,
                     "spread": m.spread if m.repeats else None, "rounds": 1 + len(m.repeats),
                     "speedup": sp, "efficiency": efficiency_text(m), "efficiency_short": _efficiency_short(m),
                     "time_speedup": tt if (not m.lossy or m.efficiency_source in ("measured", "predicted")) else None,
                     "time_speedup_predicted": m.lossy and m.efficiency_source == "predicted",
                     "worker": m.worker, "predicted_speedup": m.predicted_speedup,
                     "predicted_interval": m.predicted_interval, "reason": m.reason,
                     "sent_bytes_per_step": m.sent_bytes_per_step})
    return rows


def strategy_file_text(result: TuneResult, profile: Profile) -> str:
    """The recommended strategy as YAML, with what was predicted and measured as comments."""
    lines = [f"# autosync tune: {profile.model.workload} (batch {profile.model.batch_size}/rank) on {profile.cluster}",
             f"# objective: {result.objective}; source: {result.source}, strategy {result.strategy.hash}",
             f"# where: {profile.context.label}" + "".join(
                 f", {k} {profile.env[k]}" for k in ("device_name", "hosts", "ranks_per_host", "nccl")
                 if profile.env.get(k) is not None and profile.context.network == "real")]
    if not math.isnan(result.predicted_speedup):
        lines.append(f"# predicted speedup over the DDP default: {result.predicted_speedup:.2f}x")
    lines += [f"# {line}" for line in uncertainty_lines(result)]
    if result.measured_samples_per_s:
        lines.append(f"# measured: {result.measured_samples_per_s:,.1f} samples/s"
                     + (f" (median of {1 + len(result.pick.repeats)} interleaved measurements)"
                        if result.pick and result.pick.repeats else ""))
    if result.speedup_over_default:
        lines.append(f"# measured speedup over the DDP default: {result.speedup_over_default:.2f}x")
    if result.speedup_over_best_baseline and result.best_baseline:
        lines.append(f"# measured speedup over the best hand-crafted baseline ({result.best_baseline[0]}): "
                     f"{result.speedup_over_best_baseline:.2f}x")
    if result.pick and result.pick.lossy:
        tt = result.time_speedup(result.pick)
        lines.append(f"# LOSSY: statistical efficiency {efficiency_text(result.pick)}"
                     + (f"; time to the target loss {tt:.2f}x the DDP default's" if tt else ""))
    if result.why:
        lines.append(f"# why not the fastest per step: {result.why}")
    if result.note:
        lines.append(f"# note: {result.note}")
    rows = measured_rows(result)
    if rows:
        lines.append("# measured (speedup = throughput over the DDP default; time = speedup x efficiency, to the "
                     "target loss):")
        for r in rows:
            sp = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
            tt = ("never" if r["time_speedup"] == 0 else f"{r['time_speedup']:.2f}x") if r["time_speedup"] is not None else "-"
            spread = f" +-{r['spread'] / 2:.0%} over {r['rounds']}" if r["spread"] is not None else ""
            lines.append(f"#   {r['source']:<18} {r['hash']}  {r['lossy']:<8} {r['status']:<7} speedup {sp:>7}"
                         f"{spread}  efficiency {r['efficiency']}  time {tt}")
    lines.append(f"# lossless: {str(result.strategy.is_lossless).lower()}")
    return "\n".join(lines) + "\n" + result.strategy.to_yaml()


def online_file_text(strategy, tuner) -> str:
    """The strategy ``strategy="auto"`` committed to, as YAML, with its windows (measured during training) as
    comments. ``tuner``: the :class:`~autosync.search.online.OnlineTuner` (its profile, windows and costs)."""
    profile = tuner.profile
    where = f"{profile.model.workload} (batch {profile.model.batch_size}/rank) on {profile.cluster}" if profile \
        else tuner.name
    lines = [f"# autosync auto (measured during training): {where}",
             f"# strategy {strategy.hash}, committed at step {tuner.steps}; exploration: "
             f"{tuner.exploration_steps()} steps by candidates not chosen "
             f"({tuner.lost_s():.2f} s lost against the best), "
             f"{tuner.overhead_s:.1f} s outside steps",
             *([f"# why: {tuner.committed_why}"] if tuner.committed_why else []),
             f"# loss guard: {tuner.guard_words()}",
             "# windows (median step of the slowest rank, its spread; speedup over the default's):"]
    default = tuner.default_step_s()
    for w in tuner.windows:
        if w.median_s is None or not w.steps_s:
            lines.append(f"#   {w.source:<9} {w.strategy.hash}  {w.outcome}  ({w.strategy.summary()})")
            continue
        sp = f"{default / w.median_s:.2f}x" if default else "-"
        pred = f", predicted {w.predicted_speedup:.2f}x" if w.predicted_speedup else ""
        busy = ", while predicting: not compared" if w.busy else ""
        lines.append(f"#   {w.source:<9} {w.strategy.hash}  {w.median_s:.4f} s +-{w.spread / 2:.0%}  {sp}{pred}  "
                     f"{w.outcome}{busy}  ({w.strategy.summary()})")
    lines.append(f"# lossless: {str(strategy.is_lossless).lower()}")
    return "\n".join(lines) + "\n" + strategy.to_yaml()
