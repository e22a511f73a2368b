"""Validation helpers shared by the strategy schema and the plan registry.

Every failure is a :class:`StrategyError` whose message starts with the field path
(``groups[1].compressor.rank: ...``) and names the allowed values, in the manner of
scikit-learn's parameter validation.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from autosync.errors import UserError


class StrategyError(UserError):
    """A strategy that is malformed, or does not fit the model or the world it is used with."""


def fail(path: str, msg: str) -> None:
    raise StrategyError(f"{path}: {msg}")


def choice(path: str, value: Any, allowed: Iterable[str]) -> str:
    allowed = tuple(allowed)
    if value not in allowed:
        fail(path, f"{value!r} is not one of {', '.join(allowed)}")
    return value


def integer(path: str, value: Any, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        fail(path, f"expected an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        fail(path, f"{value} is out of range [{lo}, {hi if hi is not None else 'inf'}]")
    return value


def number(path: str, value: Any, lo: float, hi: float) -> float:
    """A number in the half-open range (lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(path, f"expected a number, got {value!r}")
    if not lo < value <= hi:
        fail(path, f"{value} is out of range ({lo}, {hi}]")
    return float(value)


def boolean(path: str, value: Any) -> bool:
    if not isinstance(value, bool):
        fail(path, f"expected true or false, got {value!r}")
    return value


def mapping(path: str, value: Any, keys: Iterable[str]) -> Mapping[str, Any]:
    keys = tuple(keys)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        fail(path, f"expected a mapping, got {type(value).__name__}")
    unknown = sorted(set(value) - set(keys))
    if unknown:
        fail(f"{path}.{unknown[0]}", f"unknown field; allowed: {', '.join(keys)}")
    return value
