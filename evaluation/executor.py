"""Run independent jobs in worker processes that stop on Ctrl-C, survive dead workers and keep what finished.

* **Ctrl-C**: workers ignore SIGINT; the parent, on the first one, kills every worker at once and raises
  :class:`Interrupted` with the results so far; a second Ctrl-C meets Python's default handler and kills the
  parent outright.
* **A dead worker** (killed by the OOM killer, say) costs its own job, not the grid: each worker has its own
  pipe, so the parent knows which job died with it, reports that one as failed and starts a fresh worker.
* **A run store** (:class:`RunStore`) keeps each finished result on disk as it arrives, so a re-run of the same
  command runs only what is missing.
* **Where the jobs run** (:class:`Executor`): this machine's worker processes, or Ray tasks on a Ray cluster
  (:mod:`servegym.evaluation.ray_executor`), with the same results, store, Ctrl-C and failure behaviour.
* **SIGTERM** stops the jobs as Ctrl-C does; :attr:`Interrupted.exit_status` is the shell's status for the signal
  (130 for SIGINT, 143 for SIGTERM).
* **One writer per folder** (:class:`FolderLock`): a second grid into a folder that one is writing is refused.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import multiprocessing
import os
import pickle
import signal
import traceback
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from servegym.signals import exit_status

POLL_S = 0.1
"""How often the parent checks its workers while it waits for results."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread where :class:`InterruptOnTerm` is active; stops work as Ctrl-C does."""

    signum = signal.SIGTERM


def signal_of(stop: KeyboardInterrupt) -> int:
    """The signal behind a ``KeyboardInterrupt``: SIGTERM for :class:`Terminated`, else SIGINT (Ctrl-C)."""
    return int(getattr(stop, "signum", signal.SIGINT))


class Interrupted(Exception):
    """Ctrl-C (or SIGTERM) stopped the jobs; ``results`` holds those that finished (index -> result), ``signum``
    the signal that stopped them."""

    def __init__(self, results: dict[int, Any], signum: int = signal.SIGINT) -> None:
        super().__init__(f"interrupted after {len(results)} finished jobs")
        self.results = results
        self.signum = int(signum)
        self.kept: int | None = None
        """Finished runs kept on disk, where a command's store holds more than these jobs (earlier grids')."""

    @property
    def exit_status(self) -> int:
        return exit_status(self.signum)


class JobFailed(RuntimeError):
    """A job raised, or its worker died; ``results`` holds the jobs that finished."""

    def __init__(self, message: str, results: dict[int, Any]) -> None:
        super().__init__(message)
        self.results = results


EXECUTORS = ("process", "ray")


@dataclass(frozen=True)
class Executor:
    """Where a grid's jobs run. ``Executor()`` is this machine's worker processes."""

    kind: str = "process"
    """``process``: worker processes on this machine; ``ray``: Ray tasks (extra ``scale``)."""
    address: str | None = None
    """With ``ray``: the Ray cluster to join (``HOST:6379``, ``ray://HOST:10001`` or ``auto``). None joins the
    cluster in ``RAY_ADDRESS`` if set, else starts a local Ray instance for the run and stops it afterwards."""

    def __post_init__(self) -> None:
        if self.kind not in EXECUTORS:
            raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}; got {self.kind!r}")
        if self.address is not None and self.kind != "ray":
            raise ValueError(f"address {self.address!r} names a Ray cluster; it needs executor 'ray', not "
                             f"{self.kind!r}")
        if self.address is not None and not self.address.strip():
            raise ValueError("a Ray address must not be empty")


PROCESSES = Executor()
"""The default: worker processes on this machine."""


class RunStore:
    """Finished results on disk, one pickle per job key, each written atomically."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    def _file(self, key: Hashable) -> Path:
        return self.path / (hashlib.sha256(repr(key).encode()).hexdigest()[:24] + ".pkl")

    def get(self, key: Hashable) -> Any | None:
        path = self._file(key)
        if not path.is_file():
            return None
        try:
            stored_key, result = pickle.loads(path.read_bytes())
        except (pickle.UnpicklingError, EOFError, AttributeError, ValueError):
            return None  # a torn or foreign file: run the job again
        return result if stored_key == repr(key) else None

    def put(self, key: Hashable, result: Any) -> None:
        path = self._file(key)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps((repr(key), result)))
        os.replace(tmp, path)

    def clear(self) -> None:
        for path in self.path.glob("*.pkl"):
            path.unlink()

    def __len__(self) -> int:
        return sum(1 for _ in self.path.glob("*.pkl"))


STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})
"""Held back while a worker starts, so that a stop never lands between its spawn and its registration."""


def _worker(fn: Callable[[Any], Any], conn: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what Ctrl-C means
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # the spawn inherited the parent's held-back mask
    _die_with_parent()
    try:
        while (item := conn.recv()) is not None:
            index, job = item
            try:
                result = fn(job)
            except BaseException:  # any failure goes back to the parent, with its traceback
                conn.send((index, "error", traceback.format_exc()))
                continue
            try:
                conn.send((index, "done", result))
            except (EOFError, OSError):
                raise
            except Exception:  # a result that cannot be pickled: a failure of its own job
                conn.send((index, "error", traceback.format_exc()))
    except (EOFError, OSError):  # the parent is gone (killed outright): no one to report to, so end quietly
        return


def _die_with_parent() -> None:
    """Where the OS offers it (Linux's ``PR_SET_PDEATHSIG``), a worker is killed when its parent dies, even by
    SIGKILL, instead of running its job to the end for no one; elsewhere it ends quietly at its next message.
    (The signal follows the thread that started the worker: :func:`run_jobs` starts and ends its pool within
    the call.)"""
    parent = multiprocessing.parent_process()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: no such call
        return
    if parent is not None and os.getppid() != parent.pid:  # the parent died before the call: nothing would fire
        raise SystemExit(0)


def run_jobs(fn: Callable[[Any], Any], jobs: Sequence[Any], workers: int,
             on_result: Callable[[int, Any], None] | None = None, describe: Callable[[Any], str] = repr) -> list[Any]:
    """``[fn(job) for job in jobs]`` in ``workers`` processes (spawned, so a parent holding torch is safe).

    ``on_result(index, result)`` runs in the parent as each job finishes (store it, advance a bar). Raises
    :class:`Interrupted` on Ctrl-C/SIGTERM and :class:`JobFailed` when a job raises or its worker dies, after the
    other jobs have finished; both carry the finished results.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    results: dict[int, Any] = {}
    with InterruptOnTerm(), RestoreSigint():
        if workers == 1:
            _run_inline(fn, jobs, results, on_result, describe)
        else:
            _run_pool(fn, jobs, min(workers, len(jobs)), results, on_result, describe)
    return [results[i] for i in range(len(jobs))]


def run_stored(fn: Callable[[Any], Any], jobs: Sequence[Any], workers: int | None, store: RunStore | None,
               describe: Callable[[Any], str] = repr, bar: Any = None, executor: Executor = PROCESSES) -> list[Any]:
    """:func:`run_jobs` (or, for a Ray ``executor``, Ray tasks) over the jobs ``store`` does not hold yet, saving
    each result as it finishes; results come back in job order. ``workers`` caps the jobs running at once
    (default: all cores here; with Ray, every core of the cluster). ``bar`` (a tqdm-like progress bar) advances
    per job and starts at the stored ones. An :class:`Interrupted` or :class:`JobFailed` carries every finished
    result, stored ones included, by job index. Nothing starts (no Ray either) when the store holds every job."""
    have = {i: r for i, job in enumerate(jobs) if store is not None and (r := store.get(job)) is not None}
    missing_index = [i for i in range(len(jobs)) if i not in have]
    missing = [jobs[i] for i in missing_index]
    if bar is not None:
        bar.update(len(have))

    def finished(index: int, result: Any) -> None:
        if store is not None:
            store.put(missing[index], result)
        if bar is not None:
            bar.update(1)

    try:
        fresh = _run_missing(fn, missing, workers, finished, describe, executor) if missing else []
    except (Interrupted, JobFailed) as stop:
        stop.results = {**have, **{missing_index[i]: r for i, r in stop.results.items()}}
        raise
    finally:
        if bar is not None:
            bar.close()
    done = {**have, **dict(zip(missing_index, fresh, strict=True))}
    return [done[i] for i in range(len(jobs))]


def _run_missing(fn: Callable[[Any], Any], jobs: Sequence[Any], workers: int | None,
                 on_result: Callable[[int, Any], None], describe: Callable[[Any], str],
                 executor: Executor) -> list[Any]:
    if executor.kind == "ray":
        from servegym.evaluation.ray_executor import run_ray_jobs

        return run_ray_jobs(fn, jobs, workers, on_result, describe, executor.address)
    return run_jobs(fn, jobs, max(1, min(workers or os.cpu_count() or 1, len(jobs))), on_result, describe)


def _run_inline(fn: Callable[[Any], Any], jobs: Sequence[Any], results: dict[int, Any],
                on_result: Callable[[int, Any], None] | None, describe: Callable[[Any], str]) -> None:
    failed: list[str] = []
    try:
        for i, job in enumerate(jobs):
            try:
                results[i] = fn(job)
            except Exception:  # one failed job costs itself, as in the pool
                failed.append(f"{describe(job)} raised:\n{traceback.format_exc()}")
                continue
            if on_result is not None:
                on_result(i, results[i])
    except KeyboardInterrupt as stop:
        raise Interrupted(results, signal_of(stop)) from None
    if failed:
        raise JobFailed(f"{len(failed)} of {len(jobs)} jobs failed; the first: {failed[0]}", results)


def _run_pool(fn: Callable[[Any], Any], jobs: Sequence[Any], workers: int, results: dict[int, Any],
              on_result: Callable[[int, Any], None] | None, describe: Callable[[Any], str]) -> None:
    pool: _Pool | None = None
    failed: dict[int, str] = {}
    pending = list(range(len(jobs)))[::-1]
    try:
        pool = _Pool(fn, workers)  # stopped while starting, it kills the workers it started
        while len(results) + len(failed) < len(jobs):
            for worker in pool.idle():
                if pending:
                    index = pending.pop()
                    if not worker.give(index, jobs[index]):  # it died while idle: a fresh one takes the job
                        pool.replace(worker)
                        pending.append(index)
            for worker, message in pool.wait():
                if message is None:  # the worker died: its job is lost, a fresh worker takes its place
                    failed[worker.job] = f"{describe(jobs[worker.job])}: its worker died (exit code {worker.exitcode})"
                    pool.replace(worker)
                    continue
                index, kind, payload = message
                worker.job = None
                if kind == "error":
                    failed[index] = f"{describe(jobs[index])} raised:\n{payload}"
                    continue
                results[index] = payload
                if on_result is not None:
                    on_result(index, payload)
    except KeyboardInterrupt as stop:
        stop_outright_on_second_signal()
        if pool is not None:
            pool.kill()
        raise Interrupted(results, signal_of(stop)) from None
    pool.close()
    if failed:
        first = failed[min(failed)]
        raise JobFailed(f"{len(failed)} of {len(jobs)} jobs failed; the first: {first}", results)


class _Worker:
    """One spawned process with its own pipe, so a death breaks nothing but its own job."""

    def __init__(self, ctx: Any, fn: Callable[[Any], Any]) -> None:
        self.conn, self._child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(fn, self._child), daemon=True)
        self.job: int | None = None

    def start(self) -> None:
        """Spawn the process (the pool registers the worker first, so a stop during the spawn still kills it)."""
        self.proc.start()
        self._child.close()

    @property
    def started(self) -> bool:
        return self.proc.pid is not None

    @property
    def exitcode(self) -> int | None:
        return self.proc.exitcode

    def give(self, index: int, job: Any) -> bool:
        """Send a job; False when the worker is gone (nothing was started)."""
        if not self.proc.is_alive():
            return False
        try:
            self.conn.send((index, job))
        except OSError:
            return False
        self.job = index
        return True


class _Pool:
    def __init__(self, fn: Callable[[Any], Any], workers: int) -> None:
        self.fn = fn
        self.ctx = multiprocessing.get_context("spawn")
        self.workers: list[_Worker] = []
        try:
            for _ in range(workers):
                self._start(len(self.workers))
        except BaseException:  # Ctrl-C or SIGTERM while starting: no worker outlives the pool
            self.kill()
            raise

    def _start(self, slot: int) -> None:
        """Start a worker into ``slot`` with Ctrl-C and SIGTERM held back until it is registered: a signal in the
        middle of a spawn would otherwise leave a half-started child that no one kills (it then dies with an
        ``EOFError`` traceback on the parent's stderr). A held-back signal arrives once the mask is restored."""
        # Read the mask first: a signal already pending raises from this call with nothing changed, whereas one
        # raised from the blocking call would leave the signals blocked for good (the mask changes first).
        held = signal.pthread_sigmask(signal.SIG_BLOCK, ())
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            worker = _Worker(self.ctx, self.fn)
            if slot == len(self.workers):
                self.workers.append(worker)
            else:
                self.workers[slot] = worker
            worker.start()  # registered first: in a process with other threads a stop can still land here
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

    def idle(self) -> list[_Worker]:
        return [w for w in self.workers if w.job is None]

    def wait(self) -> list[tuple[_Worker, tuple[int, str, Any] | None]]:
        """Messages from busy workers that have one (None for a worker that died), waiting up to POLL_S."""
        busy = {w.conn: w for w in self.workers if w.job is not None}
        ready = wait(list(busy), timeout=POLL_S)
        out = []
        for conn in ready:
            worker = busy[conn]
            try:
                out.append((worker, conn.recv()))
            except (EOFError, OSError):
                worker.proc.join(timeout=1)
                out.append((worker, None))
        return out

    def replace(self, worker: _Worker) -> None:
        worker.conn.close()
        self._start(self.workers.index(worker))

    def close(self) -> None:
        for worker in self.workers:
            with contextlib.suppress(OSError):
                worker.conn.send(None)
        for worker in self.workers:
            worker.proc.join(timeout=5)
        self.kill()

    def kill(self) -> None:
        for worker in self.workers:
            if worker.started and worker.proc.is_alive():
                worker.proc.kill()
        for worker in self.workers:
            if worker.started:
                worker.proc.join(timeout=2)
            worker.conn.close()


class RestoreSigint:
    """Put the caller's SIGINT handler back when the jobs end (the pool sets the default one while it stops, so
    that a second Ctrl-C kills at once; a notebook should not keep that afterwards)."""

    def __enter__(self) -> None:
        self.previous = signal.getsignal(signal.SIGINT)

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None and multiprocessing.current_process().name == "MainProcess":
            with contextlib.suppress(ValueError):  # not the main thread
                signal.signal(signal.SIGINT, self.previous)


class InterruptOnTerm:
    """Within the block, SIGTERM raises KeyboardInterrupt (in the main thread), so it stops jobs as Ctrl-C does."""

    def __enter__(self) -> None:
        self.previous = None
        if multiprocessing.current_process().name == "MainProcess":
            try:
                self.previous = signal.signal(signal.SIGTERM, _raise_interrupt)
            except ValueError:  # not the main thread
                self.previous = None

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise Terminated


def stop_outright_on_second_signal() -> None:
    """While the jobs stop, a second Ctrl-C or SIGTERM kills the parent at once (main thread only)."""
    with contextlib.suppress(ValueError):  # not the main thread
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


class FolderInUse(ValueError):
    """Another process holds the folder's :class:`FolderLock`."""


class FolderLock:
    """An exclusive lock on a run folder while a grid writes it (``with FolderLock(out): ...``).

    A second process that asks for the same folder gets :class:`FolderInUse` at once, naming the folder and the
    holder's pid. The lock is ``flock`` on ``<folder>/.servegym.lock``, so the system releases it when its holder
    exits, a crash or ``kill -9`` included; the file stays (removing it would race with a new holder).
    """

    FILE = ".servegym.lock"

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.handle: Any = None

    def __enter__(self) -> FolderLock:
        self.folder.mkdir(parents=True, exist_ok=True)
        handle = (self.folder / self.FILE).open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise FolderInUse(f"{self.folder} is being written by another servegym run (pid {holder}); wait for it "
                              "to finish or choose another output folder") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self.handle = handle
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.truncate(0)
        fcntl.flock(self.handle, fcntl.LOCK_UN)
        self.handle.close()
        self.handle = None


def progress_bar(total: int, desc: str, unit: str) -> Any:
    """A tqdm bar that draws only on a terminal (a log gets no stream of carriage returns), or None without tqdm
    (``servegym[eval]``)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    tqdm.monitor_interval = 0  # no monitor thread: a signal then lands in the main thread, where workers start
    return tqdm(total=total, desc=desc, unit=unit, disable=None)  # None: off when stderr is not a terminal
