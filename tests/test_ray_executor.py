"""Grids as Ray tasks (``--executor ray``): the process pool's results, run store, failures and Ctrl-C.

One local Ray instance serves the module (the commands join it, as they would join a cluster by address); the
slow test at the end lets a command start and stop its own.
"""

from __future__ import annotations

import csv
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import ray

from servegym.cli import main
from servegym.evaluation import ray_executor
from servegym.evaluation.executor import Executor, Interrupted, JobFailed, RunStore, run_stored
from tests.conftest import live_processes
from tests.stop_helpers import kill_session, wait_for_exit, wait_until, wait_until_gone

ROOT = Path(__file__).resolve().parents[1]
GRID = """
name: ray-grid
seeds: 3
max_steps: 400
engine: {length_mode: predicted}
policies: [fcfs, sarathi]
workloads: [medium, low]
"""
RAY = Executor("ray")
CANCEL_LIMIT_S = 120.0
"""How long cancelled tasks may take to give their CPUs back (seconds on a quiet machine)."""
SLEEP_S = 5 * CANCEL_LIMIT_S
"""How long a sleeping job sleeps: far past the limit, so only a cancel gives its CPU back in time."""


@pytest.fixture(scope="module")
def local_ray():
    sigterm = signal.getsignal(signal.SIGTERM)  # ray.init replaces it; the rest of the suite gets it back
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()
    signal.signal(signal.SIGTERM, sigterm)


@pytest.fixture
def ray_calls(monkeypatch) -> list[int]:
    """The number of jobs each call handed to Ray (proof that a run went through Ray, and how much of it)."""
    calls: list[int] = []
    real = ray_executor.run_ray_jobs

    def spy(fn, jobs, *args, **kwargs):
        calls.append(len(jobs))
        return real(fn, jobs, *args, **kwargs)

    monkeypatch.setattr(ray_executor, "run_ray_jobs", spy)
    return calls


def jobs_that(fail: int | None = None, die: int | None = None, sleep_from: int | None = None):
    """A job for Ray workers (a closure, so it travels by value): x -> x * x, except that ``fail`` raises,
    ``die`` kills its worker and jobs from ``sleep_from`` on sleep ``SLEEP_S`` (longer than any test waits)."""

    def job(x: int) -> int:
        if x == fail:
            raise ArithmeticError(f"{x} is bad")
        if x == die:
            os._exit(1)
        if sleep_from is not None and x >= sleep_from:
            time.sleep(SLEEP_S)
        return x * x

    return job


def compare_args(tmp_path: Path, out: str, *extra: str) -> list[str]:
    spec = tmp_path / "grid.yaml"
    spec.write_text(GRID)
    return ["compare", str(spec), "--out", str(tmp_path / out), "--workers", "2", "--no-plots", "--quiet", *extra]


def test_compare_on_ray_gives_the_process_pools_results(tmp_path, local_ray, ray_calls):
    assert main(compare_args(tmp_path, "pool")) == 0
    assert ray_calls == []
    assert main(compare_args(tmp_path, "ray", "--executor", "ray")) == 0
    assert ray_calls == [12]
    for name in ("results.csv", "summary.md"):
        assert (tmp_path / "ray" / name).read_text() == (tmp_path / "pool" / name).read_text()


def test_compare_on_ray_plays_a_routing_task_as_the_process_pool_does(tmp_path, local_ray, ray_calls):
    from tests.test_compare_routing import ROUTING_GRID

    spec = tmp_path / "routing.yaml"
    spec.write_text(ROUTING_GRID)
    rows = {}
    for executor in ("process", "ray"):
        argv = ["compare", str(spec), "--out", str(tmp_path / executor), "--workers", "2", "--no-plots", "--quiet",
                "--executor", executor]
        assert main(argv) == 0
        with (tmp_path / executor / "results.csv").open() as handle:
            rows[executor] = {tuple(row[:4]): row[4] for row in list(csv.reader(handle))[1:]}
    assert ray_calls == [2]  # two routers x one seed, both as Ray tasks
    assert rows["ray"].keys() == rows["process"].keys()
    assert {policy for policy, *_ in rows["ray"]} == {"router-round-robin", "router-least-loaded"}
    # To the last bit: no metric depends on the thread count (a Ray task runs with OMP_NUM_THREADS=1)
    assert rows["ray"] == rows["process"]


def test_bench_on_ray_gives_the_process_pools_leaderboard(tmp_path, local_ray, ray_calls):
    argv = ["bench", "--tasks", "memory-tight", "--policies", "random", "fcfs", "--seeds", "2", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "pool")]) == 0
    assert main([*argv, "--out", str(tmp_path / "ray"), "--executor", "ray"]) == 0
    assert ray_calls == [9]  # 2 policies x 2 test seeds, and FCFS on the 5 validation seeds
    board = (tmp_path / "ray" / "leaderboard.csv").read_text()
    assert board == (tmp_path / "pool" / "leaderboard.csv").read_text() and board.count("\n") == 10  # header + 9


def test_a_ray_grid_resumes_from_its_run_store(tmp_path, local_ray, ray_calls):
    argv = compare_args(tmp_path, "out", "--executor", "ray")
    assert main(argv) == 0
    first = (tmp_path / "out" / "results.csv").read_text()
    runs = sorted((tmp_path / "out" / "runs").glob("*.pkl"))
    assert len(runs) == 12  # each result was stored
    for path in runs[:3]:
        path.unlink()
    assert main(argv) == 0
    assert ray_calls == [12, 3]  # only the missing runs went to Ray
    assert (tmp_path / "out" / "results.csv").read_text() == first
    assert main(argv) == 0
    assert ray_calls == [12, 3]  # nothing missing: Ray is not even asked


def test_a_failing_job_costs_itself_and_is_reported_as_in_the_pool(tmp_path, local_ray):
    store = RunStore(tmp_path / "runs")
    with pytest.raises(JobFailed, match=r"1 of 4 jobs failed; the first: job 4 raised:(.|\n)*ArithmeticError: 4 is bad"
                       ) as caught:
        run_stored(jobs_that(fail=4), [0, 1, 4, 5], None, store, lambda x: f"job {x}", executor=RAY)
    assert caught.value.results == {0: 0, 1: 1, 3: 25}
    assert len(store) == 3 and store.get(5) == 25


def test_a_dead_ray_worker_costs_its_own_job(local_ray):
    with pytest.raises(JobFailed, match="job 3: its Ray worker died") as caught:
        ray_executor.run_ray_jobs(jobs_that(die=3), [1, 2, 3, 4], describe=lambda x: f"job {x}")
    assert caught.value.results == {0: 1, 1: 4, 3: 16}


def test_workers_runs_at_most_that_many_ray_tasks_at_once(local_ray):
    def timed(x: int) -> tuple[float, float]:
        start = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of this machine
        time.sleep(0.3)
        return start, time.monotonic()

    spans = ray_executor.run_ray_jobs(timed, [0, 1, 2, 3], workers=1)
    # One at a time: each task starts after the one before it ended, though Ray has 2 CPUs for two at once.
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_cancels_the_ray_tasks_and_keeps_what_finished(sig, tmp_path, local_ray):
    store = RunStore(tmp_path / "runs")

    # Rule: the stop keeps the finished result, raises Interrupted and cancels the running tasks (their CPUs come
    # back long before the jobs would end). Waits are on observable state, with generous deadlines.
    sent: list[float] = []

    def interrupt_after_first_result() -> None:
        try:
            wait_until("the first stored result", lambda: len(store) >= 1)
        finally:  # sent even after a timeout: the jobs below end only by it
            sent.append(time.monotonic())
            os.kill(os.getpid(), sig)  # handled in the main thread: Ctrl-C, or SIGTERM that stops jobs as Ctrl-C does

    previous = signal.getsignal(signal.SIGINT)
    threading.Thread(target=interrupt_after_first_result, daemon=True).start()
    try:
        with pytest.raises(Interrupted) as caught:
            run_stored(jobs_that(sleep_from=1), [0, 1, 2, 3], None, store, executor=RAY)
    finally:
        signal.signal(signal.SIGINT, previous)
    print(f"Interrupted {time.monotonic() - sent[0]:.2f} s after the signal")
    assert caught.value.results == {0: 0} and store.get(0) == 0
    # Cancelled tasks give their CPUs back; sleeping ones would hold them for SLEEP_S.
    wait_until("both CPUs back", lambda: ray.available_resources().get("CPU", 0) == 2, timeout=CANCEL_LIMIT_S)


class RecordingRay:
    """Ray's calls that run_ray_jobs makes, recorded: tasks never finish, and the first wait is a Ctrl-C."""

    class exceptions:  # the name of ray's module
        RayTaskError = RayError = RuntimeError

    def __init__(self, initialized: bool) -> None:
        self.initialized, self.calls = initialized, []

    def is_initialized(self) -> bool:
        return self.initialized

    def init(self, address=None, **options) -> None:
        self.calls.append(("init", address))

    def remote(self, **options):
        refs = itertools.count()
        task = type("Task", (), {"remote": staticmethod(lambda fn, job: f"ref{next(refs)}")})
        return lambda fn: task

    def wait(self, refs, **options):
        raise KeyboardInterrupt

    def cancel(self, ref, force=False) -> None:
        self.calls.append(("cancel", ref))

    def shutdown(self) -> None:
        self.calls.append(("shutdown", None))


CANCELS = [("cancel", "ref0"), ("cancel", "ref1")]


@pytest.mark.parametrize("initialized, address, expected", [
    (True, None, CANCELS),
    (False, "head:6379", [("init", "head:6379"), *CANCELS, ("shutdown", None)]),
    (False, None, [("init", None), ("shutdown", None)]),
], ids=["connected", "joins-a-cluster", "starts-its-own"])
def test_ctrl_c_cancels_tasks_only_on_a_ray_it_did_not_start(initialized, address, expected, monkeypatch):
    # Rule: on a Ray it joined, the stop cancels each running task (they would run on); on a local instance it
    # started, the shutdown stops them, and a cancel would race the workers' own replies (a Ray bug that aborts the
    # driver).
    fake = RecordingRay(initialized)
    monkeypatch.setattr(ray_executor, "require_ray", lambda: fake)
    monkeypatch.setattr(ray_executor, "probe_address", lambda address: None)  # no traffic to "head"
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(Interrupted) as caught:
        ray_executor.run_ray_jobs(abs, [1, 2, 3], workers=2, address=address)
    assert caught.value.results == {}
    assert fake.calls == expected


@pytest.mark.parametrize("command", [["compare"], ["bench"], ["reproduce"]])
def test_missing_ray_is_one_clear_line_before_any_work(command, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    monkeypatch.chdir(tmp_path)
    assert main([*command, "--executor", "ray", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err == "servegym: error: --executor ray needs Ray: pip install 'servegym[scale]'\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["compare"], ["bench"], ["reproduce"]])
def test_an_address_needs_the_ray_executor(command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([*command, "--address", "head:6379", "--out", str(tmp_path / "out")]) == 2
    assert "--address head:6379 names a Ray cluster: it needs --executor ray" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_executor_choices_are_checked():
    with pytest.raises(ValueError, match="executor must be one of process, ray; got 'dask'"):
        Executor("dask")
    with pytest.raises(ValueError, match="needs executor 'ray'"):
        Executor("process", "head:6379")
    with pytest.raises(ValueError, match="must not be empty"):
        Executor("ray", " ")


@pytest.mark.slow
def test_a_command_starts_its_own_ray_and_ctrl_c_stops_it_with_partial_results(tmp_path):
    spec = tmp_path / "grid.yaml"
    spec.write_text(GRID.replace("seeds: 3", "seeds: 40").replace("max_steps: 400", "max_steps: 3000"))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "servegym.cli", "compare", str(spec), "--out", str(out), "--workers", "2",
           "--no-plots", "--quiet", "--executor", "ray"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    runs = out / "runs"
    try:
        wait_until("two stored runs", lambda: runs.is_dir() and len(list(runs.glob("*.pkl"))) >= 2, proc)
        # The check at the end can see Ray's processes.
        assert any("raylet" in row for row in live_processes("sid", proc.pid))
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: the whole foreground group
        sent = time.monotonic()
        _, err = wait_for_exit(proc, sent)
        assert proc.returncode == 130 and "interrupted" in err, err
        wait_until_gone("sid", proc.pid, sent)  # the Ray instance the command started went with it
    finally:
        kill_session(proc)
    kept = len(list(runs.glob("*.pkl")))
    assert 2 <= kept < 160
    assert (out / "summary.md").read_text().startswith("> **PARTIAL RESULTS**")


def test_an_address_where_nothing_listens_is_refused_at_once_without_ray_init(monkeypatch, tmp_path, capsys):
    # Rule: a HOST:PORT that refuses TCP connections fails with one line before ray.init, which would retry it for
    # minutes; port 1 on the loopback is closed on any test machine.
    fake = RecordingRay(False)
    monkeypatch.setattr(ray_executor, "require_ray", lambda: fake)
    with pytest.raises(ConnectionError, match=r"cannot join the Ray cluster at '127.0.0.1:1': 127.0.0.1:1 does not "
                                              r"accept connections \("):
        ray_executor.run_ray_jobs(abs, [1], workers=1, address="127.0.0.1:1")
    with pytest.raises(ConnectionError, match=r"at 'ray://127\.0\.0\.1:1'"):
        ray_executor.run_ray_jobs(abs, [1], workers=1, address="ray://127.0.0.1:1")
    assert fake.calls == []  # ray.init never ran
    for bad in ("nonsense", "host:", ":6379", "host:99999", "ray://host:x"):
        with pytest.raises(ValueError, match="is not HOST:PORT, ray://HOST:PORT or auto"):
            ray_executor.probe_address(bad)
    ray_executor.probe_address("auto")  # left to Ray
    monkeypatch.setattr(ray_executor, "require_ray", lambda: fake)
    assert main(["compare", "--executor", "ray", "--address", "127.0.0.1:1", "--seeds", "1", "--quiet",
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("servegym: error: cannot join the Ray cluster")


def test_an_address_that_accepts_connections_passes_the_probe():
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        ray_executor.probe_address(f"127.0.0.1:{server.getsockname()[1]}")
