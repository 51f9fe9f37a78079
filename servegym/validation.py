"""Argument checks shared by every config and parameter class: one wording, one rule for bools and NaN.

Each check takes the field's name and value and raises ``ValueError`` naming both.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

Check = Callable[[str, Any], None]


def positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def non_negative_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")


def positive_number(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def non_negative_number(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def boolean(name: str, value: Any) -> None:
    """A real bool: YAML's ``"no"`` or a 0/1 int would otherwise pass as truthy or falsy by accident."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")


def in_range(low: float, high: float, high_open: bool = False) -> Check:
    """A check for a number in ``[low, high]`` (``[low, high)`` with ``high_open``)."""

    def check(name: str, value: Any) -> None:
        ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
        if not (ok and low <= value and (value < high if high_open else value <= high)):
            raise ValueError(f"{name} must be in [{low:g}, {high:g}{')' if high_open else ']'}, got {value!r}")

    return check


def optional(check: Check) -> Check:
    """``check``, or None."""
    return lambda name, value: None if value is None else check(name, value)


COUNT_LIMITS: dict[str, tuple[int, str]] = {
    "seeds": (10_000, "each seed is one episode per policy and workload"),
    "trials": (100_000, "each trial runs its seeds' episodes"),
    "containers": (1_024, "each container is an engine with its own KV cache"),
    "workers": (1_024, "each worker is a process"),
    "envs": (1_024, "each env is a process or an engine in memory"),
    "requests": (5_000_000, "an episode's expected arrivals: rate x duration"),
    "steps": (10**9, "env steps"),
    "slots": (65_536, "rows of the observation's visible queue"),
    "tokens": (100_000_000, "one request's prompt or output tokens; the longest context windows hold 10M"),
}
"""The most of each kind of count that any command, experiment file or ``gym.make`` accepts, and why: a count past
its limit is a typo (``--seeds 1000000000``), and one caught here fails before anything is allocated."""


def count(name: str, value: Any, kind: str, low: int = 1) -> int:
    """``value`` as a count of ``kind`` (a key of :data:`COUNT_LIMITS`), in ``[low, limit]``; else ``ValueError``
    naming ``name``. Checked before any list, array or process is made from it."""
    limit, why = COUNT_LIMITS[kind]
    whole = not isinstance(value, bool) and (isinstance(value, int) or (
        isinstance(value, float) and math.isfinite(value) and value.is_integer()))
    if not whole or not low <= value <= limit:
        shown = f"{value:,}" if whole else repr(value)
        raise ValueError(f"{name} must be a whole number in [{low:,}, {limit:,}] ({why}), got {shown}")
    return int(value)


def expected_requests(name: str, rate: float, duration_s: float) -> None:
    """Refuse a workload whose expected arrivals (``rate * duration_s``) exceed the ``requests`` limit, before any
    arrival time is drawn."""
    limit, why = COUNT_LIMITS["requests"]
    expected = rate * duration_s
    if not math.isfinite(expected) or expected > limit:
        raise ValueError(f"{name}: {rate:g} req/s for {duration_s:g} s is {expected:.3g} expected requests, more than "
                         f"{limit:,} ({why}); lower the rate or the duration")


def count_arg(kind: str, low: int = 1) -> Callable[[str], int]:
    """An argparse ``type`` for a count of ``kind``: the same rule and message as :func:`count`, as a usage error."""
    import argparse

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        try:
            return count("the value", value, kind, low)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err).replace("the value must be", "must be")) from None

    parse.__name__ = f"{kind} count"
    return parse
