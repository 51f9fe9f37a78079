"""Choosing how the engine runs: compiled (``servegym.engine.engine``, built by ``pip install`` where a C compiler
is present) or interpreted (the same source run as Python; :mod:`servegym.engine.engine` says how both are kept
equal). ``SERVEGYM_ENGINE=python|compiled|auto`` (default ``auto``: compiled when built) picks one for a whole
process; ``Cluster(..., engine=...)`` picks one for a pool."""

from __future__ import annotations

import os

from servegym.engine import engine as _loaded

ENGINES = ("auto", "python", "compiled")
CompiledEngine = _loaded.Engine if _loaded.COMPILED else None
"""The compiled engine class, or None where it was not built."""


def interpreted_engine() -> type:
    """The engine class run as Python: ``servegym.engine.engine`` itself when it is not compiled, else the same
    source executed by ``servegym.engine._interpreted``."""
    if not _loaded.COMPILED:
        return _loaded.Engine
    from servegym.engine import _interpreted

    return _interpreted.Engine


def compiled_available() -> bool:
    """Whether the compiled engine was built for this installation."""
    return CompiledEngine is not None


def engine_class(name: str | None = None) -> type:
    """The engine class for ``name`` (``None``: the ``SERVEGYM_ENGINE`` environment variable, else ``auto``)."""
    name = os.environ.get("SERVEGYM_ENGINE", "auto") if name is None else name
    if name not in ENGINES:
        raise ValueError(f"engine must be one of {list(ENGINES)}, got {name!r} (from SERVEGYM_ENGINE or engine=)")
    if name == "python" or (name == "auto" and CompiledEngine is None):
        return interpreted_engine()
    if CompiledEngine is None:
        raise ImportError("the compiled engine (servegym.engine.engine) is not built: reinstall with a C compiler "
                          "(pip install -e .) or use engine='python'")
    return CompiledEngine
