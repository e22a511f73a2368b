"""TuneConfig: every choice of a tune and its default, here and nowhere else.

The CLI (``autosync tune``), the Python API (:func:`autosync.api.tune`) and the in-job path build one
and hand it on; the tune pipeline (:mod:`autosync.search.tuner`) reads it. A config is a frozen,
validated value: a bad choice is one :class:`~autosync.errors.UserError` line when it is built,
before any profiling or measuring.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from autosync.errors import UserError

#: what a tune optimizes: time-to-loss = samples/s x statistical efficiency (lossy finalists' efficiency measured);
#: throughput = samples/s, blind to what lossy strategies cost in convergence; lossless = samples/s among
#: strategies that keep DDP's math
OBJECTIVES = ("time-to-loss", "throughput", "lossless")
#: --measure 0: pick by the point estimate or by the lower bound of the predicted interval; how outputs name them
ZERO_SHOT_RULES = {"point": "point estimate", "lower": "lower bound"}
DEFAULT_STORAGE = "sqlite:///autosync-tune.db"


def _choice(flag: str, kind: str, help: str, **more):
    """A field's command-line face: its flag, its kind (nonneg_int, positive_int, positive_float, str, path (a
    file), dir, storage, flag, or a tuple of choices) and its help; :mod:`autosync.cli` builds ``autosync tune``'s
    options from them, so a choice's meaning and default are written here only."""
    return {"flag": flag, "kind": kind, "help": help, **more}


def _f(default, flag: str, kind, help: str):
    return field(default=default, metadata=_choice(flag, kind, help))


@dataclass(frozen=True)
class TuneConfig:
    """One tune's choices; each field's metadata is its command-line option (flag, kind, help)."""

    measure: int = _f(8, "--measure", "nonneg_int", "strategies to measure for real, references included "
                      "(default %(default)s; 0 = predict only, for a cluster you do not have)")
    objective: str = _f("time-to-loss", "--objective", OBJECTIVES,
                        "what to optimize: time-to-loss (the default) = samples/s x statistical efficiency, with the "
                        "efficiency of lossy finalists measured against the DDP default before they can be picked; "
                        "throughput = samples/s, blind to what lossy strategies cost in convergence; lossless = "
                        "samples/s among strategies that keep DDP's math")
    candidates: int = _f(500, "--candidates", "positive_int", "candidates scored in the first round (default "
                         "%(default)s)")
    per_round: int = 3               # strategies measured per proposal round
    min_distance: float = 0.25       # share of differing choices between two strategies measured in one round
    confirm_rounds: int = _f(3, "--confirm-rounds", "nonneg_int",
                             "re-measure the two best and the DDP default interleaved this many rounds and pick by "
                             "medians; a winner must beat the runner-up beyond the spread, else the simpler wins "
                             "(default %(default)s; 0 = off)")
    finalists: int = 3               # the best by goodput whose lossy members get a measured efficiency
    zero_shot: str = _f("point", "--zero-shot", tuple(ZERO_SHOT_RULES),
                        "with --measure 0, pick by the point estimate (default) or by the lower bound of the predicted "
                        "80%% interval (conservative; how each did held out: bench/results/zero_shot.md); the output "
                        "shows the other rule's pick and every pick's interval")
    storage: str = _f(DEFAULT_STORAGE, "--storage", "storage",
                      "Optuna storage; share a PostgreSQL URL between workers (default %(default)s)")
    data: str | Path = _f("autosync-data", "--data", "dir", "where measurements are appended (default ./%(default)s)")
    seed: int = _f(0, "--seed", "nonneg_int", "seed of the search (default %(default)s)")
    trial_timeout_s: float = _f(90.0, "--timeout", "positive_float", "time limit of each measured trial; all its "
                                "ranks are killed past it (default %(default)s s)")
    batch_size: int | None = _f(None, "--batch-size", "positive_int", "per-rank batch size (default: the workload's)")
    cost_model: str | Path | None = _f(None, "--cost-model", "dir", "a model from `autosync train` (default: the "
                                       "shipped one, with calibrated 80%% intervals)")
    profile: str | Path | None = _f(None, "--profile", "path", "a profile from `autosync profile` of this workload "
                                    "and cluster, used instead of profiling (e.g. one measured in the real job by "
                                    "`autosync profile --in-job`, with --measure 0)")
    unshaped: bool = _f(False, "--unshaped", "flag", "measure on this host's loopback without shaping the links "
                        "(no root needed); the results are labelled unshaped and never mixed with shaped data")
    beyond_range: bool = _f(False, "--beyond-range", "flag", "measure even a cluster beyond what this machine "
                            "emulates faithfully (more than 2 ranks per core, or links faster than it carries); "
                            "results are labelled emulated-beyond")

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise UserError(f"objective {self.objective!r} is not one of {', '.join(OBJECTIVES)}")
        if self.zero_shot not in ZERO_SHOT_RULES:
            raise UserError(f"zero_shot {self.zero_shot!r} is not one of {', '.join(ZERO_SHOT_RULES)}")
        for name in ("measure", "confirm_rounds", "seed"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise UserError(f"{name} must be an integer >= 0, got {getattr(self, name)!r}")
        for name in ("candidates", "per_round", "finalists"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise UserError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if not self.trial_timeout_s > 0:
            raise UserError(f"trial_timeout_s must be positive, got {self.trial_timeout_s!r}")
        if self.batch_size is not None and (not isinstance(self.batch_size, int) or self.batch_size < 1):
            raise UserError(f"batch_size must be a positive integer, got {self.batch_size!r}")
        check_storage_url(self.storage)

    @classmethod
    def build(cls, lossless: bool = False, **choices) -> "TuneConfig":
        """A config from keyword choices; ``lossless=True`` is ``objective="lossless"`` (and contradicts another
        objective). Unknown choices are one line naming them."""
        unknown = sorted(set(choices) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise UserError(f"unknown tune option(s): {', '.join(unknown)}")
        if lossless:
            if choices.get("objective") not in (None, "lossless"):
                raise UserError(f"--lossless contradicts --objective {choices['objective']}")
            choices["objective"] = "lossless"
        elif choices.get("objective") is None:
            choices.pop("objective", None)
        return cls(**choices)

    def replace(self, **changes) -> "TuneConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def options(cls) -> list[tuple[str, dict]]:
        """(field name, its command-line metadata) of every field that has an option, in field order."""
        return [(f.name, dict(f.metadata)) for f in dataclasses.fields(cls) if f.metadata]

    @property
    def lossless(self) -> bool:
        return self.objective == "lossless"

    @property
    def settings(self):
        """How each measured trial runs (:class:`~autosync.search.trials.TrialSettings`; imported here: the CLI
        builds its parser from this module and must not wait for torch)."""
        from autosync.search.trials import TrialSettings

        return TrialSettings(timeout_s=self.trial_timeout_s)


def check_storage_url(url: str) -> None:
    """UserError unless ``url`` reads as a database URL (whether it can be opened is checked before the tune)."""
    from sqlalchemy.engine import make_url

    try:
        make_url(url)
    except Exception:  # noqa: BLE001 - sqlalchemy's ArgumentError and friends
        raise UserError(f"{url!r} is not a database URL (e.g. sqlite:///tune.db, "
                        "postgresql://user@host:5432/db)") from None
