"""``engine/engine.py`` run as Python beside its compiled build: this module executes the same source, so its
``Engine`` is the interpreted one (``SERVEGYM_ENGINE=python``). A real module, so that a pickled interpreted engine
unpickles in any process. Where nothing was compiled, :mod:`servegym.engine.compiled` uses ``engine`` itself."""

from pathlib import Path

_SOURCE = Path(__file__).with_name("engine.py")
exec(compile(_SOURCE.read_text(), str(_SOURCE), "exec"))  # the engine's own source, run once
