"""Waiting and cleaning up in the tests that stop commands with signals, so that they hold on a busy machine.

They wait for what they can observe (a file, a child process, a trial in storage), never for a fixed time; a
deadline is minutes, only there to end a hung test, and the time actually taken is printed (``pytest -s``).
Every process a test starts dies in its ``finally`` with its whole session (:func:`kill_session`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable

from tests.conftest import live_processes

DEADLINE_S = 300.0
"""The longest any of these tests waits for one thing: generous, as a loaded machine (load 8 on 2 cores) needs."""


def wait_until(what: str, predicate: Callable[[], bool], proc: subprocess.Popen | None = None,
               timeout: float = DEADLINE_S) -> float:
    """Poll until ``predicate()``; fail if ``proc`` ends first or ``timeout`` passes. Returns the seconds waited."""
    started = time.monotonic()
    while not predicate():
        if proc is not None and proc.poll() is not None:
            _, err = proc.communicate()  # stderr when it is a pipe, else None
            raise AssertionError(f"the command ended (status {proc.returncode}) before {what}: {err or ''}")
        if time.monotonic() - started > timeout:
            raise AssertionError(f"no {what} after {timeout:.0f} s")
        time.sleep(0.05)
    waited = time.monotonic() - started
    print(f"{what} after {waited:.1f} s")
    return waited


def wait_for_exit(proc: subprocess.Popen, since: float, what: str = "exit") -> tuple[str, str]:
    """``communicate`` with the deadline; print how long after ``since`` the process ended."""
    out, err = proc.communicate(timeout=DEADLINE_S)
    print(f"{what} with status {proc.returncode} {time.monotonic() - since:.2f} s after the signal")
    return out, err


def wait_until_gone(column: str, value: int, since: float) -> None:
    """Wait until no live process has ``ps`` column ``column`` (``pgid``, ``sid``) equal to ``value``."""
    while live_processes(column, value) and time.monotonic() - since < DEADLINE_S:
        time.sleep(0.1)
    print(f"no process of {column} {value} left {time.monotonic() - since:.2f} s after the signal")
    assert live_processes(column, value) == [], f"processes of {column} {value} outlived the stopped command"


def kill_session(proc: subprocess.Popen) -> None:
    """Clean-up for a ``finally``: ``proc`` (started with ``start_new_session=True``) and every live process of its
    session die. Safe to call on a process that already ended."""
    for row in live_processes("sid", proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(row.split()[1]), signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    proc.wait()


def touch_then_sleep(path: str) -> None:
    """A job for worker processes: say it started (the file), then outlast any test."""
    open(path, "w").close()
    time.sleep(3600)
