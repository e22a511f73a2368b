"""Deciding: statistical efficiency of the lossy finalists, interleaved confirmation, and the recommendation.

The recommendation is the best measured strategy by the objective (goodput = samples/s x statistical
efficiency for time-to-loss: a lossy strategy needs a *measured* efficiency), and never one worse than the
measured DDP default. With ``measure=0`` nothing is measured and the pick is the cost model's
(:func:`zero_shot`).
"""
from __future__ import annotations

import math

from autosync.efficiency import EXTEND
from autosync.models import uncertainty
from autosync.search.config import ZERO_SHOT_RULES
from autosync.search.proposer import Proposer, predicted_speedup
from autosync.search.result import Measured, TuneResult
from autosync.strategy import Strategy


def predict_efficiency(tuner: Proposer, measured: list[Measured]) -> None:
    """Every lossy measured strategy's efficiency as the efficiency model predicts it (until it is measured)."""
    lossy = [m for m in measured if m.lossy]
    for m, eff in zip(lossy, tuner.predicted_efficiency([m.strategy for m in lossy])):
        m.efficiency = m.efficiency_lo = m.efficiency_hi = float(eff)
        m.efficiency_source = "predicted"


def apply_efficiency(m: Measured, row: dict) -> None:
    """Copy a measured efficiency row (:class:`~autosync.efficiency.EfficiencyMeter`) onto ``m``."""
    if row["status"] == "ok":
        m.efficiency, m.efficiency_lo, m.efficiency_hi = row["efficiency"], row["efficiency_lo"], row["efficiency_hi"]
        m.efficiency_raw, m.efficiency_band = row.get("efficiency_raw"), row.get("band")
        pairs = row.get("pairs")
        m.efficiency_pairs = int(pairs) if pairs is not None and pairs == pairs else 1
        m.within_noise = bool(row.get("within_noise")) and m.efficiency_raw is not None
        m.efficiency_source = "measured"
    else:
        m.efficiency_source = "flat" if row["status"] == "flat" else "failed"
        m.reason = m.reason or f"efficiency {row['status']}: {row.get('reason', '')}"[:300]


def settle_efficiency(measured: list[Measured], meter, k: int, on_progress=None) -> None:
    """Measure the efficiency of the lossy strategies among the ``k`` best by goodput (predicted efficiency for
    the rest), again until the ``k`` best have measured (or unmeasurable) efficiencies."""
    if meter is None:
        return
    for m in measured:          # what is stored already (this or an earlier tune, the shipped table) costs nothing
        if m.lossy and m.efficiency_source == "predicted":
            row = meter.stored(m.strategy)
            if row is not None:
                apply_efficiency(m, row)
    for _ in range(2 * k):
        ranked = sorted((m for m in measured if m.status == "ok"), key=lambda m: -m.value("time-to-loss"))
        todo = [m for m in ranked[:k] if m.lossy and m.efficiency_source == "predicted"]
        if not todo:
            return
        m = todo[0]
        if on_progress:
            on_progress(f"measuring the efficiency of lossy finalist {m.strategy.hash}")
        row = meter.measure(m.strategy)
        for other in measured:   # every measurement of the same lossy choices shares it
            if other.lossy and other.strategy.lossy_key() == m.strategy.lossy_key():
                apply_efficiency(other, row)


def confirm(measured: list[Measured], objective: str, rounds: int, run_one, on_progress=None, k: int = 2) -> None:
    """Re-measure the ``k`` best and the DDP default, interleaved (A B C A B C ...), ``rounds`` rounds."""
    ranked = sorted((m for m in measured if m.status == "ok" and m.value(objective, True) > 0),
                    key=lambda m: -m.value(objective, True))
    default = next((m for m in measured if m.source == "ddp_default" and m.status == "ok"), None)
    todo = [m for m in ranked if m is not default][:k] + ([default] if default else [])
    for r in range(rounds):
        for m in todo:
            if on_progress:
                on_progress(f"confirming: round {r + 1}/{rounds}, {m.source} {m.strategy.hash}")
            res = run_one(m.strategy)
            if res.ok:
                m.repeats.append(res.samples_per_s)


def _simpler(a: Measured, b: Measured) -> bool:
    """True when ``a`` is simpler than ``b``: lossless before lossy, then fewer groups."""
    return (a.lossy, len(a.strategy.groups)) < (b.lossy, len(b.strategy.groups))


def _describe(m: Measured, objective: str) -> str:
    eff = "" if not m.lossy else (f", efficiency {m.efficiency:.2f} ({m.efficiency_source})"
                                   if m.efficiency_source in ("measured", "predicted") else
                                   f", efficiency not measurable ({m.efficiency_source})")
    return f"{m.source} {m.strategy.hash} ({m.confirmed_samples_per_s:,.1f} samples/s{eff})"


def recommend(tuner: Proposer, measured: list[Measured], base: dict[str, Strategy],
               rule: str = "point") -> TuneResult:
    """The best measured strategy by the objective (goodput for time-to-loss: a lossy strategy needs a measured
    efficiency), never one worse than the measured DDP default. Noise rule: when both the winner and the
    runner-up were re-measured, the winner must beat it beyond the spread (its lowest goodput above the
    runner-up's highest), else the simpler of the two wins (lossless, then fewer groups)."""
    objective = tuner.objective
    if not measured:
        return zero_shot(tuner, rule)
    ok = [m for m in measured if m.status == "ok"]
    default = next((m for m in measured if m.source == "ddp_default" and m.status == "ok"), None)
    base_hashes = {s.hash for n, s in base.items() if n != "ddp_default"}
    baselines_ok = [m for m in ok if m.strategy.hash in base_hashes]
    best_baseline = max(((m.source, m.confirmed_samples_per_s) for m in baselines_ok), key=lambda t: t[1],
                        default=None)
    default_sps = default.confirmed_samples_per_s if default else None
    eligible = sorted((m for m in ok if m.value(objective, True) > 0), key=lambda m: -m.value(objective, True))
    if not eligible:
        return TuneResult(Strategy.default(), "ddp_default", 1.0, measured, None, best_baseline,
                          note="every measured trial failed; recommending the DDP default", objective=objective)
    best = eligible[0]
    note, why = "", ""
    if len(eligible) > 1:
        runner = eligible[1]
        if best.repeats and runner.repeats:
            eff_b = best.value(objective, True) / best.confirmed_samples_per_s
            eff_r = runner.value(objective, True) / runner.confirmed_samples_per_s
            lo_best = min([best.samples_per_s, *best.repeats]) * eff_b
            hi_runner = max([runner.samples_per_s, *runner.repeats]) * eff_r
            if lo_best <= hi_runner and _simpler(runner, best):
                why = (f"{_describe(best, objective)} did not beat the simpler {_describe(runner, objective)} beyond "
                       f"the measured spread ({best.spread:.0%} / {runner.spread:.0%})")
                best = runner
    if default is not None and best.value(objective, True) <= default.value(objective, True):
        best = default
        note = "nothing measured beat the DDP default: recommending the default"
    fastest = max(ok, key=lambda m: m.confirmed_samples_per_s)
    if not why and fastest is not best:
        if objective == "time-to-loss" and fastest.lossy:
            if fastest.efficiency_source == "measured" and fastest.efficiency == 0:
                why = (f"the fastest per step, {_describe(fastest, objective)}, never reached the target loss within "
                       f"{EXTEND}x the efficiency horizon")
            elif fastest.efficiency_source == "measured":
                why = (f"the fastest per step, {_describe(fastest, objective)}, reaches the target loss "
                       f"{fastest.value(objective) / max(best.value(objective), 1e-9):.2f}x as soon as the pick "
                       f"(throughput x efficiency)")
            elif fastest.efficiency_source == "predicted":
                why = (f"the fastest per step, {_describe(fastest, objective)}, is lossy and its predicted goodput "
                       f"kept it out of the finalists whose efficiency was measured: unmeasured, it is not recommended")
            else:
                why = (f"the fastest per step, {_describe(fastest, objective)}, is lossy and its convergence cost "
                       f"could not be measured, so it is not recommended")
        elif objective == "lossless":
            why = f"the fastest per step is {_describe(fastest, objective)}"
    failed_default = next((m for m in measured if m.source == "ddp_default" and m.status != "ok"), None)
    if failed_default:
        reason = (failed_default.reason or "no reason given").splitlines()[0]
        note = (f"the DDP default {failed_default.status} ({reason}), so no speedup over it was measured; "
                f"check it with `autosync run`")
    return TuneResult(best.strategy, best.source, best.predicted_speedup, measured, default_sps, best_baseline,
                      note=note, objective=objective, why=why)


def zero_shot(tuner: Proposer, rule: str) -> TuneResult:
    """--measure 0: the candidate with the best point estimate (``rule="point"``, the default) or with the best
    lower bound of its interval (``"lower"``: a confident prediction beats one with a wide interval). Held out
    (bench/results/zero_shot.md, 18 contexts, each pick / a measured tune of 8) the point estimate reached a
    median 0.98 and at worst 0.46, the lower bound 0.73 and 0.31, the lower bound only out of distribution 0.98
    and 0.43: the lower bound prefers candidates close to what the dataset knows, which are rarely the fast ones.
    The other rule's pick, when it differs, is reported as ``alternative``."""
    objective = tuner.objective
    ranked = tuner.ranked()
    picks = {"point": ranked[0]}
    if tuner.intervals is not None:
        lower = [(tuner.bounds[s.hash][0], sc, s) for sc, s in ranked if not math.isnan(sc)
                 and not math.isnan(tuner.bounds.get(s.hash, (float("nan"),))[0])]
        if lower:
            _, sc, st = max(lower, key=lambda t: (t[0], t[1]))
            picks["lower"] = (sc, st)
    rule = rule if rule in picks else "point"
    score, strategy = picks[rule]
    other = next((k for k in picks if k != rule), None)
    alternative = None
    if other and picks[other][1].hash != strategy.hash:
        o_score, o = picks[other]
        alternative = (other, o, predicted_speedup(tuner.model, o_score), tuner.interval(o))
    pred = predicted_speedup(tuner.model, score)
    note = "nothing was measured (--measure 0): this is the cost model's prediction only"
    if objective == "time-to-loss" and not strategy.is_lossless:
        note += f" (goodput: predicted speedup x predicted efficiency {tuner.predicted_efficiency([strategy])[0]:.2f})"
    return TuneResult(strategy, "predicted", pred, note=note, objective=objective, interval=tuner.interval(strategy),
                      level=tuner.intervals.level if tuner.intervals else uncertainty.LEVEL, rule=ZERO_SHOT_RULES[rule],
                      alternative=alternative)
