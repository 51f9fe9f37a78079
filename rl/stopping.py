"""Stopping a training run on SIGINT or SIGTERM at once, but never half-way through writing a file.

Training holds no lock and no database transaction, so a signal may stop it anywhere: the handler raises
:class:`TrainingInterrupted` in the main thread as soon as it runs (env set-up included), except inside a
:meth:`StopOnSignals.saving` block (a checkpoint, the best model and its statistics), which finishes first so
that a resume never meets a torn file. A second signal raises at once, even there. The trainer then saves a checkpoint
of the steps taken (once learning has begun), writes the truth into the run's ``config.json`` and stops the env
workers it started (:mod:`servegym.rl.train`).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from servegym.signals import SignalScope, SignalStop


class TrainingInterrupted(SignalStop):
    """SIGINT or SIGTERM stopped training; the run's ``config.json`` says how far it got."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.run: Path | None = None
        """The run directory, once the trainer has recorded the stop there."""
        self.progress: dict[str, Any] = {}
        """What the trainer recorded: ``timesteps_done`` and ``last_checkpoint``."""

    def message(self) -> str:
        """One line for the user: where it stopped and how to go on (a resume always works: from the checkpoint
        saved at the stop, or from the start when the stop came before the first step)."""
        if self.run is None:
            return f"interrupted by {self.signal_name}"
        checkpoint = self.progress.get("last_checkpoint")
        then = f"continue with: servegym train --resume {self.run}" + (
            "" if checkpoint else " (no step was taken yet: it starts over)")
        return (f"interrupted by {self.signal_name} after {self.progress.get('timesteps_done', 0)} timesteps "
                f"({self.run / 'config.json'} says so); {then}")


class StopOnSignals(SignalScope):
    """While active (``with``), SIGINT and SIGTERM raise :class:`TrainingInterrupted` in the main thread (see
    :class:`~servegym.signals.SignalScope` for which handlers are installed)."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: int | None = None
        self._saving = 0

    @contextlib.contextmanager
    def saving(self) -> Iterator[None]:
        """A block a first signal does not cut short: it raises when the block ends."""
        self._saving += 1
        try:
            yield
        finally:
            self._saving -= 1
        if not self._saving and self.pending is not None:
            signum, self.pending = self.pending, None
            raise TrainingInterrupted(signum)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._saving and self.pending is None:
            self.pending = signum
            return
        raise TrainingInterrupted(signum)


def spawned_children() -> set[int]:
    """Pids of this process's children that multiprocessing spawned (Linux's /proc; empty elsewhere)."""
    pids = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == os.getpid() and fields[0] != "Z" and \
                    b"--multiprocessing-fork" in (stat.parent / "cmdline").read_bytes():
                pids.add(int(stat.parent.name))
        except (OSError, IndexError, ValueError):  # gone meanwhile, or not ours to read
            continue
    return pids


def end_processes(pids: set[int], grace_s: float = 30.0) -> None:
    """SIGTERM ``pids`` (children of this process), reap them, and SIGKILL those still there after ``grace_s``."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline, left = time.monotonic() + grace_s, set(pids)
    while left:
        for pid in list(left):
            try:
                done = os.waitpid(pid, os.WNOHANG)[0]
            except ChildProcessError:  # not (or no longer) ours to wait for
                done = pid
            if done:
                left.discard(pid)
        if left and time.monotonic() > deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            deadline = math.inf  # killed once; now only reap them
        if left:
            time.sleep(0.01)
