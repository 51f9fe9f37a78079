"""Policy parameters: a frozen dataclass base whose fields carry their own help text and validator.

A policy declares ``Params`` (a :class:`PolicyParams` subclass) and ``search_space``; :class:`Policy`'s
constructor builds and validates the parameters, so a policy writes no ``__init__`` of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from servegym.engine.validation import (  # re-exported for policy files
    Check,
    in_range,
    non_negative_int,
    non_negative_number,
    optional,
    positive_int,
    positive_number,
)

__all__ = ["Check", "PolicyParams", "in_range", "non_negative_int", "non_negative_number", "optional", "param",
           "positive_int", "positive_number"]

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
