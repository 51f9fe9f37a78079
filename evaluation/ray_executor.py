"""Run a grid's jobs as Ray tasks, on a local Ray instance or on any Ray cluster (extra ``scale``).

The contract is :func:`~servegym.evaluation.executor.run_jobs`'s, so ``servegym compare|bench|reproduce
--executor ray`` gives the same results as the process pool:

* each task runs ``fn(job)`` on one CPU and returns the result pickled, so the parent gets the same plain objects
  as from a worker process (not read-only views into Ray's object store);
* ``on_result`` runs in the parent as each task finishes (the run store saves it there, so resume works);
* Ctrl-C (or SIGTERM) stops every task still queued or running and raises
  :class:`~servegym.evaluation.executor.Interrupted` with the finished results: a local instance this call started
  goes down with its workers; on a Ray this call joined, each task is cancelled. (Cancelling on a local instance too
  would race the replies of its own workers, which a Ctrl-C in a terminal reaches too; Ray 2.60 can lose that race by
  aborting the driver with ``Check failed: it != submissible_tasks_.end()``, the race of ray-project/ray#54798.)
* a task that raises, or whose worker or node dies, costs its own job: :class:`JobFailed` once the others have
  finished, as in the pool. Tasks are not retried (``max_retries=0``); re-running the command runs them again.

On a cluster every node needs servegym installed, at the driver's version, with the driver's Python.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import socket
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from servegym.evaluation.executor import (
    POLL_S,
    Interrupted,
    InterruptOnTerm,
    JobFailed,
    RestoreSigint,
    signal_of,
    stop_outright_on_second_signal,
)


class MissingRayError(ImportError):
    """Ray is not installed."""


def require_ray() -> ModuleType:
    """The ``ray`` module, or :class:`MissingRayError` saying which extra to install."""
    try:
        import ray
    except ImportError:
        raise MissingRayError("--executor ray needs Ray: pip install 'servegym[scale]'") from None
    return ray


def _call(fn: Callable[[Any], Any], job: Any) -> bytes:
    """The Ray task: one job, its result pickled."""
    return pickle.dumps(fn(job), protocol=pickle.HIGHEST_PROTOCOL)


def run_ray_jobs(fn: Callable[[Any], Any], jobs: Sequence[Any], workers: int | None = None,
                 on_result: Callable[[int, Any], None] | None = None, describe: Callable[[Any], str] = repr,
                 address: str | None = None) -> list[Any]:
    """``[fn(job) for job in jobs]`` as Ray tasks, at most ``workers`` at a time (None: as many as Ray schedules).

    Joins the Ray this process is already connected to, else the cluster at ``address`` (or ``RAY_ADDRESS``),
    else starts a local Ray instance with ``workers`` CPUs (default: all cores) and stops it at the end.
    ``fn`` travels to the workers by cloudpickle: a module-level function of a package they have installed (by
    reference), or a closure (by value). Raises
    :class:`Interrupted` and :class:`JobFailed` as :func:`~servegym.evaluation.executor.run_jobs` does.
    """
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    ray = require_ray()
    results: dict[int, Any] = {}
    connection = _Connection(ray, address, workers)
    with connection, InterruptOnTerm(), RestoreSigint():
        _run_tasks(ray, fn, jobs, workers or len(jobs), results, on_result, describe,
                   cancel_on_stop=not connection.owns_local_instance)
    return [results[i] for i in range(len(jobs))]


def _run_tasks(ray: ModuleType, fn: Callable[[Any], Any], jobs: Sequence[Any], limit: int, results: dict[int, Any],
               on_result: Callable[[int, Any], None] | None, describe: Callable[[Any], str],
               cancel_on_stop: bool) -> None:
    task = ray.remote(num_cpus=1, max_retries=0)(_call)
    pending = list(range(len(jobs)))[::-1]
    running: dict[Any, int] = {}  # object ref -> job index
    failed: dict[int, str] = {}
    try:
        while pending or running:
            while pending and len(running) < limit:
                index = pending.pop()
                running[task.remote(fn, jobs[index])] = index
            done, _ = ray.wait(list(running), num_returns=len(running), timeout=POLL_S)
            for ref in done:
                index = running.pop(ref)
                try:
                    payload = ray.get(ref)
                except ray.exceptions.RayTaskError as err:  # the job raised; the message holds its traceback
                    failed[index] = f"{describe(jobs[index])} raised:\n{err}"
                    continue
                except ray.exceptions.RayError as err:  # its worker or node died
                    failed[index] = f"{describe(jobs[index])}: its Ray worker died ({type(err).__name__})"
                    continue
                results[index] = pickle.loads(payload)
                if on_result is not None:
                    on_result(index, results[index])
    except KeyboardInterrupt as stop:
        stop_outright_on_second_signal()
        for ref in running if cancel_on_stop else ():
            with contextlib.suppress(Exception):  # already finished, or the cluster is gone
                ray.cancel(ref, force=True)
        raise Interrupted(results, signal_of(stop)) from None
    if failed:
        first = failed[min(failed)]
        raise JobFailed(f"{len(failed)} of {len(jobs)} jobs failed; the first: {first}", results)


PROBE_S = 5.0
"""How long a cluster's address may take to accept a TCP connection before the run is refused."""


def probe_address(address: str, timeout_s: float = PROBE_S) -> None:
    """Refuse at once a Ray address (``HOST:PORT`` or ``ray://HOST:PORT``) where nothing accepts a connection:
    ``ray.init`` would retry it for minutes, printing a log line per try. ``auto`` (the local cluster) is left to
    Ray."""
    if address == "auto":
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"Ray address {address!r} is not HOST:PORT, ray://HOST:PORT or auto")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as err:
        reason = "no answer" if isinstance(err, TimeoutError) else (err.strerror or str(err) or type(err).__name__)
        raise ConnectionError(f"cannot join the Ray cluster at {address!r}: {host}:{port} does not accept "
                              f"connections ({reason}, {timeout_s:g} s allowed)") from None


class _Connection:
    """Connect to Ray for the block unless already connected; stop what it started, and put back the SIGTERM
    handler ``ray.init`` replaces."""

    def __init__(self, ray: ModuleType, address: str | None, workers: int | None) -> None:
        self.ray, self.address, self.workers = ray, address or os.environ.get("RAY_ADDRESS"), workers
        self.started = False
        self.sigterm: Any = None

    def __enter__(self) -> None:
        if self.ray.is_initialized():
            return
        if threading.current_thread() is threading.main_thread():
            self.sigterm = signal.getsignal(signal.SIGTERM)
        options: dict[str, Any] = {"log_to_driver": False, "configure_logging": False}
        if self.address is None:
            options |= {"num_cpus": self.workers or os.cpu_count() or 1, "include_dashboard": False}
        if self.address is not None:
            probe_address(self.address)  # Ray itself retries an address that does not answer for minutes
        try:
            self.ray.init(address=self.address, **options)
        except Exception as err:
            where = f"the Ray cluster at {self.address!r}" if self.address else "a local Ray instance"
            raise ConnectionError(f"cannot start or join {where}: {str(err).strip().splitlines()[0]}"
                                  f"{self._auth_hint()}") from None
        self.started = True

    @property
    def owns_local_instance(self) -> bool:
        """Whether this block started the local Ray instance it runs on (and stops it, with every task, at the end)."""
        return self.started and self.address is None

    def _auth_hint(self) -> str:
        """What to check when joining a cluster fails without token authentication set here (Ray >= 2.52)."""
        if self.address is None or os.environ.get("RAY_AUTH_MODE") == "token":
            return ""
        return ("; if the cluster's nodes run with RAY_AUTH_MODE=token, set RAY_AUTH_MODE=token here too, with the "
                "cluster's token in RAY_AUTH_TOKEN or ~/.ray/auth_token (docs/SCALE.md)")

    def __exit__(self, *exc: object) -> None:
        if not self.started:
            return
        self.ray.shutdown()
        if self.sigterm is not None:
            signal.signal(signal.SIGTERM, self.sigterm)
