"""Stopping a tuning run on SIGINT or SIGTERM at a safe point, so that the storage is left consistent."""

from __future__ import annotations

import contextlib
from types import FrameType
from typing import TYPE_CHECKING

from servegym.signals import SignalScope, SignalStop

if TYPE_CHECKING:
    import optuna


class TuningInterrupted(SignalStop):
    """SIGINT or SIGTERM stopped :func:`~servegym.tuning.tune`; every finished trial is in the storage."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.study: optuna.Study | None = None


class StopOnSignals(SignalScope):
    """While active (``with``), SIGINT and SIGTERM ask for a stop; a second signal stops at once.

    The first signal only records itself and tells the study to start no new trial: raising at an arbitrary
    point could leave a storage lock held (the heartbeat thread then waits forever). The objective calls
    :meth:`checkpoint` between episodes and every few hundred steps within one (so a long episode stops within
    a fraction of a second), which raises :class:`TuningInterrupted` there; :func:`~servegym.tuning.tune` stores
    that trial as pruned and not counted (never failed, never completed with a partial value).
    See :class:`~servegym.signals.SignalScope` for which handlers are installed.
    """

    def __init__(self) -> None:
        super().__init__()
        self.signum: int | None = None
        self.study: optuna.Study | None = None

    def checkpoint(self) -> None:
        """Raise :class:`TuningInterrupted` if a signal came."""
        if self.signum is not None:
            raise TuningInterrupted(self.signum)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            raise TuningInterrupted(self.signum)
        self.signum = signum
        if self.study is not None:
            with contextlib.suppress(RuntimeError):  # outside study.optimize the next checkpoint raises
                self.study.stop()  # no further trial once the running one ends
