"""Stopping a tuning run on SIGINT or SIGTERM at a safe point, so that the storage is left consistent."""

from __future__ import annotations

import contextlib
import signal
import threading
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna


class TuningInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped :func:`~servegym.tuning.tune`; every finished trial is in the storage."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.study: optuna.Study | None = None

    @property
    def exit_status(self) -> int:
        """The shell's status for a process stopped by this signal: 130 for SIGINT, 143 for SIGTERM."""
        return 128 + self.signum


class StopOnSignals:
    """While active (``with``), SIGINT and SIGTERM ask for a stop; a second signal stops at once.

    The first signal only records itself and tells the study to start no new trial: raising at an arbitrary
    point could leave a storage lock held (the heartbeat thread then waits forever). The objective calls
    :meth:`checkpoint` between episodes and every few hundred steps within one (so a long episode stops within
    a fraction of a second), which raises :class:`TuningInterrupted` there; Optuna marks that trial failed.
    Handlers are installed from the main thread only, and a signal the process started with ignored (SIGINT of
    a background job in a script) stays ignored.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signum: int | None = None
        self.study: optuna.Study | None = None
        self._previous: dict[int, Any] = {}

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

    def __enter__(self) -> StopOnSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
