"""Argument types and checks shared by the ``servegym`` subcommands: bad input fails before any work starts."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import typing
from pathlib import Path
from typing import Any

from servegym.evaluation.executor import EXECUTORS, Executor


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An argparse type: a whole number >= 0 (seeds)."""
    return _int_at_least(text, 0)


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
    return value


def writable_dir(path: Path) -> Path:
    """Create ``path`` (and parents) and check a file can be written there, before any work starts."""
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"output folder {path} is not writable: {existing} exists and is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".servegym-write-check-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise ValueError(f"output folder {path} is not writable: {err.strerror or err}") from None
    return path


def json_object(flag: str, text: str | None) -> dict[str, Any]:
    """A JSON object given on the command line (``{}`` when absent), or a clear error naming the flag."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{flag} must be a JSON object: {err}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{flag} must be a JSON object, got {text!r}")
    return value


def add_executor_args(parser: argparse.ArgumentParser) -> None:
    """``--executor`` and ``--address``, for the commands that run a grid (compare, bench, reproduce)."""
    parser.add_argument("--executor", choices=EXECUTORS, default="process",
                        help="where the runs go: worker processes on this machine, or Ray tasks on a Ray cluster "
                             "(pip install 'servegym[scale]'); the results are the same")
    parser.add_argument("--address", default=None,
                        help="with --executor ray: the Ray cluster to join (HOST:6379, ray://HOST:10001 or auto; "
                             "default: $RAY_ADDRESS, else a local Ray instance for this command)")


def executor_from_args(args: argparse.Namespace) -> Executor:
    """The executor ``--executor``/``--address`` ask for, checked before any work starts (Ray is installed)."""
    if args.address is not None and args.executor != "ray":
        raise ValueError(f"--address {args.address} names a Ray cluster: it needs --executor ray")
    if args.executor == "ray":
        from servegym.evaluation.ray_executor import MissingRayError, require_ray

        try:
            require_ray()
        except MissingRayError as err:
            raise ValueError(str(err)) from None
    return Executor(args.executor, args.address)


def add_config_args(parser: argparse.ArgumentParser, cls: type, names: tuple[str, ...]) -> None:
    """``--field-name`` for each of ``names``, a field of the dataclass ``cls``: its type, its default, and the
    help and choices of its ``metadata`` (``help``, optional ``choices`` and ``type``), so a flag that mirrors a
    config field is written once, on the field."""
    hints = typing.get_type_hints(cls)
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    for name in names:
        f = by_name[name]
        if "help" not in f.metadata:
            raise TypeError(f"{cls.__name__}.{name} has no metadata help to build --{name.replace('_', '-')} from")
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        kinds = [t for t in typing.get_args(hints[name]) if t is not type(None)] or [hints[name]]
        kind = f.metadata.get("type", kinds[0])
        shown = "" if default is None else f" (default {default})"
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=default,
                            choices=f.metadata.get("choices"), help=f.metadata["help"] + shown)


def config_args(args: argparse.Namespace, names: tuple[str, ...]) -> dict[str, Any]:
    """The parsed values of :func:`add_config_args`' flags, as config keyword arguments."""
    return {name: getattr(args, name) for name in names}
