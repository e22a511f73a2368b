"""The shared Optuna study of a tune: how workers claim, finish and share measurements.

The measured trials of a tune *are* an Optuna study, in ``storage`` (a SQLite file by default;
any RDB URL, e.g. PostgreSQL, lets several workers share one search), named after the context.
Every worker on one study:

- **claims** a strategy before measuring it: a RUNNING trial carrying its hash, created in one
  insert; when two workers claim the same hash, the lower trial id keeps it and the other moves
  on, so a strategy measured or being measured by one worker is not measured by another (a claim
  left by a dead process on this host is *stale* and released);
- **finishes** it: value = measured samples/s (FAIL for a failed trial); user attributes hold the
  strategy, its hash, whether it is lossless, the speedup over the default when known and the worker;
- **shares**: every worker reads the finished measurements of all (:meth:`SharedStudy.measurements`),
  so each refit learns from everything measured so far, and the DDP default one worker measured is
  the reference of all.
"""
from __future__ import annotations

import os
import random
import secrets
import socket
import time
import warnings
from typing import Callable

import optuna

from autosync.errors import UserError
from autosync.executor.launch import pid_alive
from autosync.strategy import Strategy


class SharedStudy:
    """The study of one context (``name``) in ``storage``, as this worker sees it."""

    def __init__(self, name: str, storage: str):
        self.name = name
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        self.study = _open_shared(name, storage)

    def record(self, strategy: Strategy, value: float | None, kind: str, **attrs) -> None:
        """Store one finished trial in the shared study (value None = failed)."""
        trial = optuna.trial.create_trial(
            state=optuna.trial.TrialState.COMPLETE if value is not None else optuna.trial.TrialState.FAIL,
            value=value, user_attrs=self._attrs(strategy, kind, **attrs))
        self.study.add_trial(trial)

    def _attrs(self, strategy: Strategy, kind: str, **extra) -> dict:
        return {"strategy": strategy.to_json(), "hash": strategy.hash, "kind": kind, "summary": strategy.summary(),
                "yaml": strategy.to_yaml(), "lossless": strategy.is_lossless, "worker": self.worker, **extra}

    def _measured_trials(self) -> list[optuna.trial.FrozenTrial]:
        return [t for t in self.study.get_trials(deepcopy=False) if t.user_attrs.get("kind") == "measured"]

    def claim(self, strategy: Strategy, source: str, peers_seen: int = 0) -> optuna.trial.FrozenTrial | None:
        """Claim ``strategy`` for measurement; the claim's trial, or None when another worker has it."""
        token = secrets.token_hex(8)
        self.study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState.RUNNING, user_attrs=self._attrs(
                strategy, "measured", source=source, claim=token, peer_measurements_seen=peers_seen)))
        same = [t for t in self._measured_trials() if t.user_attrs.get("hash") == strategy.hash]
        mine = next(t for t in same if t.user_attrs.get("claim") == token)
        rivals = [t for t in same if t is not mine and not _stale(t)
                  and (t.state != optuna.trial.TrialState.RUNNING or t._trial_id < mine._trial_id)]
        if rivals:
            optuna.trial.Trial(self.study, mine._trial_id).set_user_attr("kind", "yielded")
            self.study.tell(mine.number, state=optuna.trial.TrialState.PRUNED)
            return None
        return mine

    def finish(self, claim: optuna.trial.FrozenTrial, result, reference: float | None) -> None:
        """Store the outcome of a claimed measurement."""
        number = claim.number
        handle = optuna.trial.Trial(self.study, claim._trial_id)
        for key, value in (("samples_per_s", result.samples_per_s), ("status", result.status),
                           ("reason", result.reason[:500]),
                           ("speedup", result.samples_per_s / reference if result.ok and reference else None)):
            handle.set_user_attr(key, value)
        if result.ok:
            self.study.tell(number, result.samples_per_s)
        else:
            self.study.tell(number, state=optuna.trial.TrialState.FAIL)

    def annotate(self, measured: list, result) -> None:
        """What the end of a tune knows, as study attributes for Optuna's dashboard (a finished trial takes no new
        attributes): per measured strategy of this run its statistical efficiency and where it comes from, and the
        pick with its figures."""
        eff = dict(self.study.user_attrs.get("efficiency", {}))
        for m in measured:
            if m.status == "ok":
                eff[m.strategy.hash] = f"{m.efficiency:.3f} ({m.efficiency_source})"
        pick = {"hash": result.strategy.hash, "source": result.source, "summary": result.strategy.summary(),
                "speedup_over_default": result.speedup_over_default, "worker": self.worker}
        try:
            self.study.set_user_attr("efficiency", eff)
            self.study.set_user_attr("pick", pick)
        except Exception:  # noqa: BLE001 - labels only
            pass

    def measurements(self) -> list[dict]:
        """Every finished measurement in the shared study (all workers): source, strategy, status, samples/s."""
        out = []
        for t in self._measured_trials():
            if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL) and "status" in t.user_attrs:
                out.append({"source": t.user_attrs.get("source", "tune"), "strategy": t.user_attrs["strategy"],
                            "strategy_hash": t.user_attrs["hash"], "status": t.user_attrs["status"],
                            "samples_per_s": float(t.user_attrs.get("samples_per_s") or 0.0),
                            "reason": t.user_attrs.get("reason", ""), "worker": t.user_attrs.get("worker", "")})
        return out

    def busy_hashes(self) -> set[str]:
        """Hashes measured or being measured by any worker."""
        return {t.user_attrs.get("hash") for t in self._measured_trials()
                if t.state != optuna.trial.TrialState.PRUNED and not _stale(t)}

    def describe(self, profile, objective: str) -> None:
        """What Optuna's dashboard shows of the study: its context and objective, and the value's name (a trial's
        value is measured samples/s for ``kind: measured`` trials, the cost model's score for ``predicted`` ones)."""
        attrs = {"context": profile.context.label, "workload": profile.model.workload,
                 "batch_per_rank": profile.model.batch_size, "cluster": profile.cluster.spec(),
                 "network": profile.env.get("network", "emulated"), "objective": objective,
                 "space": "lossless only" if objective == "lossless" else "lossless and lossy",
                 "values": "measured samples/s (kind=measured); cost-model score (kind=predicted)"}
        try:
            for k, v in attrs.items():
                if self.study.user_attrs.get(k) != v:
                    self.study.set_user_attr(k, v)
            if self.study.metric_names != ["samples/s"]:
                with warnings.catch_warnings():      # experimental in Optuna 3.x and 4.x; what the dashboard reads
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    self.study.set_metric_names(["samples/s"])
        except Exception:  # noqa: BLE001 - labels only: a worker racing another on the same attribute is harmless
            pass

    def wait_for_default(self, timeout: float) -> None:
        """When another worker is measuring the DDP default (the reference of every speedup), wait for it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            running = [t for t in self._measured_trials() if t.user_attrs.get("source") == "ddp_default"
                       and t.state == optuna.trial.TrialState.RUNNING and not _stale(t)]
            if not running:
                return
            time.sleep(1.0)


def _stale(trial: optuna.trial.FrozenTrial) -> bool:
    """A RUNNING claim of a process on this host that is gone."""
    if trial.state != optuna.trial.TrialState.RUNNING:
        return False
    host, _, pid = str(trial.user_attrs.get("worker", "")).rpartition(":")
    return host == socket.gethostname() and pid.isdigit() and not pid_alive(int(pid))


def _with_storage(storage: str, open_: Callable, attempts: int = 5):
    """``open_()`` retried a few times, because workers starting together on an empty database race to create
    Optuna's tables (PostgreSQL then reports a unique violation); any other failure is one line (UserError)."""
    for attempt in range(attempts):
        try:
            return open_()
        except ImportError as e:
            raise UserError(f"cannot open Optuna storage {storage!r}: {e}") from None
        except Exception as e:  # noqa: BLE001 - SQLAlchemy/driver errors of many kinds
            if attempt + 1 < attempts and ("duplicate key" in str(e) or "already exists" in str(e)):
                time.sleep(0.2 + random.random())
                continue
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(f"cannot open Optuna storage {storage!r}: {first}") from None
    raise AssertionError("unreachable")


def check_storage(storage: str) -> None:
    """Open ``storage`` once before any long work (profiling, trials): a bad or unreachable URL is one line."""
    _with_storage(storage, lambda: optuna.storages.get_storage(storage))


def _open_shared(name: str, storage: str) -> optuna.Study:
    """The shared study (see :func:`_with_storage` for the retries)."""
    return _with_storage(storage, lambda: optuna.create_study(study_name=name, storage=storage, direction="maximize",
                                                              load_if_exists=True))
