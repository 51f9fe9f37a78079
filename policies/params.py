"""Policy parameters: a frozen dataclass base whose fields carry their own help text and validator.

A policy declares ``Params`` (a :class:`PolicyParams` subclass) and ``search_space``; :class:`Policy`'s
constructor builds and validates the parameters, so a policy writes no ``__init__`` of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

Check = Callable[[str, Any], None]


def positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def positive_number(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


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


def param(default: Any, help: str, check: Check | None = None) -> Any:
    """A parameter field: its default, a one-line help (shown by ``servegym policies``) and its validator."""
    return field(default=default, metadata={"help": help, "check": check})


@dataclass(frozen=True)
class PolicyParams:
    """Base of every policy's parameters: runs each field's check, then :meth:`validate`."""

    def __post_init__(self) -> None:
        for f in fields(self):
            check = f.metadata.get("check")
            if check is not None:
                check(f.name, getattr(self, f.name))
        self.validate()

    def validate(self) -> None:
        """Checks across fields (override); single-field checks belong in ``param(check=...)``."""
