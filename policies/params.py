"""Policy parameters: a frozen dataclass base whose fields carry their own help text and validator.

A policy declares ``Params`` (a :class:`PolicyParams` subclass) and ``search_space``; :class:`Policy`'s
constructor builds and validates the parameters, so a policy writes no ``__init__`` of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from servegym.validation import (  # re-exported for policy files
    Check,
    in_range,
    non_negative_int,
    non_negative_number,
    optional,
    positive_int,
    positive_number,
)

__all__ = ["Check", "PolicyParams", "in_range", "non_negative_int", "non_negative_number", "optional", "paper_symbol",
           "param", "positive_int", "positive_number"]

def param(default: Any, help: str, check: Check | None = None) -> Any:
    """A parameter field: its default, a one-line help (shown by ``servegym policies``) and its validator."""
    return field(default=default, metadata={"help": help, "check": check})


def paper_symbol(help: str) -> str:
    """The paper's symbol a help text opens with (``"H0: base token window"`` -> ``"H0"``), or ``""``."""
    head, colon, _ = help.partition(":")
    return head if colon and head and " " not in head else ""


@dataclass(frozen=True)
class PolicyParams:
    """Base of every policy's parameters: refuses unknown names, runs each field's check, then :meth:`validate`.

    Parameters have one name each, the descriptive one; a paper's symbol (the start of the help text, e.g.
    TWP's ``H0``) is refused with the name to use instead.
    """

    def __new__(cls, *args: Any, **params: Any) -> PolicyParams:
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(params) - set(names))
        if unknown:
            symbols = {paper_symbol(f.metadata.get("help", "")): f.name for f in fields(cls)}
            hints = [f"{name!r} is the paper's symbol for {symbols[name]!r}" for name in unknown if name in symbols]
            raise ValueError(f"{cls.__name__}: unknown parameter(s) {unknown}" + (f" ({'; '.join(hints)})" if hints
                             else "") + f"; valid: {names}")
        return super().__new__(cls)

    def __post_init__(self) -> None:
        for f in fields(self):
            check = f.metadata.get("check")
            if check is not None:
                check(f.name, getattr(self, f.name))
        self.validate()

    def validate(self) -> None:
        """Checks across fields (override); single-field checks belong in ``param(check=...)``."""
