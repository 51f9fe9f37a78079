"""Choosing the engine: :class:`~servegym.engine.engine.Engine` (Python, the specification) or
:class:`CompiledEngine` (the same iteration compiled with Cython, several times cheaper per step).

Both give the same episode, float for float: ``tests/test_compiled_engine.py`` and the golden replays compare them.
The compiled one is built by ``pip install`` when a C compiler is present; without one the package still installs
and runs on the Python engine. ``SERVEGYM_ENGINE=python|compiled|auto`` (default ``auto``: compiled when built)
picks one for a whole process; ``Cluster(..., engine=...)`` picks one for a pool.
"""

from __future__ import annotations

import os

from servegym.engine.engine import Engine, EngineBase

try:
    from servegym.engine import _core as CORE
except ImportError:  # installed without a C compiler, or not built in this checkout
    CORE = None
Core = CORE.Core if CORE is not None else None

ENGINES = ("auto", "python", "compiled")


if Core is not None:

    class CompiledEngine(Core, EngineBase):
        """An engine whose ``step`` is compiled (``servegym.engine._core.Core``); everything else is
        :class:`~servegym.engine.engine.EngineBase`'s Python, shared with :class:`Engine`."""

else:
    CompiledEngine = None


def compiled_available() -> bool:
    """Whether the compiled engine was built for this installation."""
    return CompiledEngine is not None


def engine_class(name: str | None = None) -> type:
    """The engine class for ``name`` (``None``: the ``SERVEGYM_ENGINE`` environment variable, else ``auto``)."""
    name = os.environ.get("SERVEGYM_ENGINE", "auto") if name is None else name
    if name not in ENGINES:
        raise ValueError(f"engine must be one of {list(ENGINES)}, got {name!r} (from SERVEGYM_ENGINE or engine=)")
    if name == "python" or (name == "auto" and CompiledEngine is None):
        return Engine
    if CompiledEngine is None:
        raise ImportError("the compiled engine (servegym.engine._core) is not built: reinstall with a C compiler "
                          "(pip install -e .) or use engine='python'")
    return CompiledEngine
