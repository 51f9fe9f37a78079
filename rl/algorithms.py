"""An algorithm's class, and its arguments as a run gives them (``--hyperparams`` JSON, a ``--zoo`` file's entry),
checked against the algorithm's own signature before any env or worker exists: an unknown name or a value of the
wrong type is one clear line, not an assertion deep inside stable-baselines3 after the workers started.

Only what JSON or YAML can hold is checked: a number where the algorithm takes a ``float``, a whole number for an
``int``, ``true``/``false`` for a ``bool``, a string, a mapping, ``null`` where ``None`` is allowed. Arguments that
only code can give (a schedule function, a buffer class) accept nothing else from a file.
"""

from __future__ import annotations

import difflib
import inspect
import math
import types
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm

SET_BY_SERVEGYM = {"policy": "servegym picks the network per action mode", "env": "the task's envs",
                   "seed": "use --seed", "verbose": "servegym trains quietly",
                   "tensorboard_log": "the run's tb/ folder", "_init_setup_model": "the model is always built"}
"""Arguments ``servegym train`` sets itself, and why a run may not."""


def algorithm_class(name: str) -> type[BaseAlgorithm]:
    """The stable-baselines3 (or sb3-contrib, for ``maskable-ppo``) class of an algorithm name."""
    if name == "maskable-ppo":
        from sb3_contrib import MaskablePPO

        return MaskablePPO
    import stable_baselines3

    return getattr(stable_baselines3, name.upper())


def check_hyperparams(algo: str, hyperparams: Any, where: str = "--hyperparams") -> None:
    """Raise ``ValueError`` naming ``where`` and the argument when ``hyperparams`` is not a mapping of ``algo``'s
    own arguments to values of their types."""
    if not isinstance(hyperparams, dict):
        raise ValueError(f"{where} must be a mapping of {algo}'s argument names to values, got {hyperparams!r}")
    cls = algorithm_class(algo)
    parameters = inspect.signature(cls.__init__).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    known = sorted(name for name in parameters if name != "self" and name not in SET_BY_SERVEGYM)
    for name, value in hyperparams.items():
        if name in SET_BY_SERVEGYM:
            raise ValueError(f"{where}: {name!r} is set by servegym train ({SET_BY_SERVEGYM[name]})")
        if name not in parameters:
            if takes_any:
                continue
            close = difflib.get_close_matches(str(name), known, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"it takes {', '.join(known)}"
            raise ValueError(f"{where}: {cls.__name__} has no argument {name!r}; {hint}")
        annotation = parameters[name].annotation
        if annotation is inspect.Parameter.empty or isinstance(annotation, str | typing.ForwardRef):
            continue  # unannotated or unresolved: the algorithm checks it itself
        if not fits(value, annotation):
            wanted = describe(annotation)
            what = f"must be {wanted}" if wanted else "is set in code, not in a file"
            raise ValueError(f"{where}: {name} {what}, got {value!r}")


def fits(value: Any, annotation: Any) -> bool:
    """Whether a value read from JSON or YAML is of type ``annotation``."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, member) for member in typing.get_args(annotation))
    if annotation is Any:
        return True
    check = _JSON_CHECKS.get(origin or annotation)
    if check is not None:
        return check[0](value)
    base = origin or annotation
    return isinstance(base, type) and isinstance(value, base)


def describe(annotation: Any) -> str:
    """What a file may give for ``annotation`` (``"a finite number or null"``); empty when nothing."""
    origin = typing.get_origin(annotation)
    members = typing.get_args(annotation) if origin in (typing.Union, types.UnionType) else (annotation,)
    words = [_JSON_CHECKS[typing.get_origin(m) or m][1] for m in members if (typing.get_origin(m) or m) in _JSON_CHECKS]
    return " or ".join(dict.fromkeys(words))


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


_JSON_CHECKS: dict[Any, tuple[Callable[[Any], bool], str]] = {
    type(None): (lambda value: value is None, "null"),
    bool: (lambda value: isinstance(value, bool), "true or false"),
    int: (lambda value: isinstance(value, int) and not isinstance(value, bool), "a whole number"),
    float: (_number, "a finite number"),
    str: (lambda value: isinstance(value, str), "a string"),
    dict: (lambda value: isinstance(value, dict), "a mapping"),
    list: (lambda value: isinstance(value, list), "a list"),
}
"""The annotations a JSON or YAML value can satisfy: each one's check and its words in a message."""
