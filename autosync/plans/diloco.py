"""``diloco {period, outer_lr, outer_momentum, nesterov, warmup_steps, fragments, delay, mix, outer_compressor}``.

DiLoCo (Douillard et al. 2023) and its streaming variant (Douillard et al. 2025). The user's optimizer is the
*inner* one; its state stays on each rank. After ``warmup_steps`` bsp steps, gradients are averaged only
inside a host (as local SGD: ranks of one host stay equal, hosts drift), and every ``period`` steps the
hosts synchronize through an *outer* optimizer, torch's ``SGD(lr=outer_lr, momentum=outer_momentum,
nesterov=nesterov)`` on a copy of the global parameters ``theta_g``::

    delta  = theta_g - mean_r(theta_r)          (the pseudo-gradient, averaged over all ranks in fp32)
    b     <- mu b + delta                        (b = 0 at the first outer step; mu = outer_momentum)
    theta_g <- theta_g - eta (delta + mu b)      (nesterov; theta_g - eta b without it; eta = outer_lr)
    theta_r <- mix theta_r + (1 - mix) theta_g   (every rank)

With ``outer_lr 1, outer_momentum 0`` this is parameter averaging every ``period`` steps (torch's
``PeriodicModelAverager``, which ``local_sgd`` runs): ``theta_g - delta = mean_r theta_r``. ``theta_g`` starts
from the parameters at the end of the last bsp warm-up step (equal on every rank), and the first outer step
comes at step ``warmup_steps`` (0-based), where torch's averager first averages; without a warm-up the
parameters are averaged after the first step and ``theta_g`` starts there.

**Streaming** (``fragments`` F > 1): parameter ``i`` (in the optimizer's order) belongs to fragment
``i mod F``; fragment ``f`` synchronizes at the steps ``s >= warmup_steps`` with
``(s - warmup_steps - f * period // F) mod period == 0``, so each step moves at most one fragment's
bytes, not the whole model every ``period`` steps. ``delay`` (tau) inner steps overlap a fragment's
all-reduce: started at step s, it is waited for and applied (outer step, then the mix) after step
s + tau, to the parameters as they are then. ``delay`` < ``period / F`` so a fragment finishes before
the next one starts.

**Outer compression** (``outer_compressor``): the pseudo-gradient travels as ``fp16``, ``bf16``,
``int8`` or ``fp4`` (4-bit floats with a scale per block), is averaged in fp32 and the outer step runs
in fp32 (codecs and their error bounds: :mod:`autosync.plans.outer`, which runs the loop).

Within a host ranks keep bsp (the local steps all-reduce gradients over the host's ranks), and hosts
run DiLoCo across the slow links, the deployment the papers use: ``sync: {mode: diloco, period: 8}``
on a cluster with several ranks per host is that, no other spelling needed. Simulator::

    bucket cost = t_ar^intra(n)  (several ranks per host; 0 with one)                           lossy
    step cost  += max(0, t_outer(M_c / F) - tau * t_compute) / (period / F)     (autosync.plans.outer)
    t_outer(b)  = t_ar(b) uncompressed, t_ag(b) compressed       (M_c: the model's bytes as sent)

It cannot be combined with ZeRO (the outer step needs whole parameters on every rank).
"""
from __future__ import annotations

from typing import Any

from autosync import validation as v
from autosync.plans.base import Field
from autosync.plans.local_sgd import LocalSGD
from autosync.plans.outer import OUTER_CODECS, OUTER_COMPRESSOR, averager_class, codec_of, outer_cost

PERIODS = (4, 8, 16)            # 60, 30 and 15 outer rounds in the efficiency protocol's 240-step horizon
OUTER_LRS = (0.5, 0.7, 1.0)
SEARCH_WARMUP_STEPS = 2


def _fraction(value: Any, path: str) -> float:
    """A number in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        v.fail(path, f"expected a number in [0, 1), got {value!r}")
    return float(value)


class DiLoCo(LocalSGD):
    name = "diloco"
    fields = {"period": Field(8, 1, 100_000, unused=1),
              "outer_lr": Field(0.7, 0.0, 10.0, unused=1.0, traffic=False),
              "outer_momentum": Field(0.9, read=_fraction, unused=0.0, traffic=False),
              "nesterov": Field(True, unused=False, traffic=False),
              "warmup_steps": Field(10, 0, 1_000_000, unused=0, traffic=False),
              "fragments": Field(1, 1, 1024, unused=1),
              "delay": Field(0, 0, 100_000, unused=0),
              "mix": Field(0.0, read=_fraction, unused=0.0, traffic=False),
              "outer_compressor": OUTER_COMPRESSOR}
    features = {"diloco": 0.0, "diloco_period": 0.0, "diloco_outer_lr": 0.0, "diloco_outer_momentum": 0.0,
                "diloco_fragments": 0.0, "diloco_delay": 0.0, "diloco_mix": 0.0, "outer_bytes": 1.0}

    def check(self, values: dict, path: str) -> None:
        if values["fragments"] > values["period"]:
            v.fail(f"{path}.fragments", f"{values['fragments']} fragments need a period of at least as many steps "
                                        f"(period is {values['period']})")
        if values["delay"] and values["delay"] * values["fragments"] >= values["period"]:
            v.fail(f"{path}.delay", f"a fragment's all-reduce must finish before the next fragment starts: "
                                    f"delay * fragments < period ({values['delay']} * {values['fragments']} >= "
                                    f"{values['period']})")

    def suggest(self, trial, profile=None) -> dict:
        period = trial.suggest_categorical("diloco_period", PERIODS)
        fragments = trial.suggest_categorical("diloco_fragments", [1, 2, 4])
        delay = trial.suggest_categorical("diloco_delay", [0, 1]) if 1 < fragments < period else 0
        return {"warmup_steps": SEARCH_WARMUP_STEPS, "period": period,
                "outer_lr": trial.suggest_categorical("diloco_outer_lr", OUTER_LRS),
                "outer_momentum": trial.suggest_categorical("diloco_outer_momentum", [0.0, 0.9]),
                "nesterov": True, "fragments": fragments, "delay": delay,
                "mix": 0.5 if delay else 0.0,
                "outer_compressor": trial.suggest_categorical("diloco_outer_compressor", list(OUTER_CODECS))}

    def averager(self, sync, process_group):
        return averager_class()(sync, process_group)

    def step_cost(self, sim, sync, model_bytes: float) -> float:
        return outer_cost(sim, sync, model_bytes)

    def sync_features(self, sync) -> dict[str, float]:
        return {"diloco": 1.0, "diloco_period": float(sync.period), "diloco_outer_lr": sync.outer_lr,
                "diloco_outer_momentum": sync.outer_momentum, "diloco_fragments": float(sync.fragments),
                "diloco_delay": float(sync.delay), "diloco_mix": sync.mix,
                "outer_bytes": OUTER_CODECS[codec_of(sync)] / 4}


MODE = DiLoCo()
