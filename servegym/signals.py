"""What every command's stop on SIGINT or SIGTERM shares: the shell's exit status for the signal, the stop
exception's fields, and handlers installed for the length of a block (training and tuning each decide what a
signal does inside it)."""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any


def exit_status(signum: int) -> int:
    """The shell's exit status of a command stopped by ``signum``: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + signum


class SignalStop(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped the work; ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        """The shell's status for a process stopped by this signal: 130 for SIGINT, 143 for SIGTERM."""
        return exit_status(self.signum)


class SignalScope:
    """While active (``with``), SIGINT and SIGTERM call :meth:`_handle`; the previous handlers come back on exit.

    Handlers are installed from the main thread only, and a signal the process started with ignored (SIGINT of a
    background job in a script) stays ignored.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        raise NotImplementedError

    def __enter__(self) -> SignalScope:
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
