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
