"""``ssp {staleness: s}``: stale synchronous parallel with a fixed delay (delayed-gradient SGD).

Every step, every bucket is averaged by its groups' plans as under bsp, but asynchronously: the
average of step ``t``'s gradients is sent while steps ``t+1 .. t+s`` compute, and it is what
the optimizer applies at step ``t+s``. With ``g_r(t)`` the gradient rank ``r`` computes at step
``t`` from its parameters ``theta(t)``::

    theta(t+1) = opt_step(theta(t), (1/W) sum_r g_r(t - s))       (t >= s; nothing is applied for t < s)

the same on every rank, so the ranks' parameters stay identical (no drift, no averaging).
Exactly ``s`` steps stale, never more: the bound of Ho et al. (2013) with every update at the
bound. A rank can run ahead of the slowest by at most ``s`` steps: at step ``t`` it waits for
the average of step ``t - s``, which needs every rank's gradient of that step. So a straggler
that falls behind by less than ``s`` steps costs nothing; one slower for good still sets the
pace. The last ``s`` gradients of a run are computed but never applied. Memory: ``s`` extra
copies of the gradients (the averages in flight). ::

    bucket cost  = its plans' cost, overlapped with the next s steps        lossy (stale)
    step cost    = max(0, bucket costs - s x compute)  (simulator: exposed only past the window)

It composes with every plan and compressor (compressors' error feedback sees the same
stream of gradients); not with ZeRO (ZeRO's sharded step needs this step's gradients).
"""
from __future__ import annotations

from autosync.plans.base import Field, SyncModeDef

STALENESS = (1, 2, 4)


class StaleSynchronous(SyncModeDef):
    name = "ssp"
    same_step = False
    lossy = True
    allows_zero = False
    fields = {"staleness": Field(1, 1, 64, unused=0)}
    features = {"ssp": 0.0, "ssp_staleness": 0.0}

    def suggest(self, trial, profile=None) -> dict:
        return {"staleness": trial.suggest_categorical("ssp_staleness", STALENESS)}

    def delay(self, sync) -> int:
        return sync.staleness

    def window(self, sync) -> float:
        return float(sync.staleness + 1)

    def sync_features(self, sync) -> dict[str, float]:
        return {"ssp": 1.0, "ssp_staleness": float(sync.staleness)}


MODE = StaleSynchronous()
