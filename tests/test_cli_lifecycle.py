"""A grid command's life from start to stop: shipped experiments found by name, saved results read back with clear
errors, one writer per output folder, SIGTERM's exit status 143 with no worker left behind, no progress bar in logs,
and no decision-sensitivity verdict from fewer than three seeds.

Subprocess tests wait with generous deadlines (the time taken is printed, never asserted) and kill the whole
process group they started in a ``finally``, so a loaded machine makes them slower, not wrong.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import servegym.cli as cli
from servegym.benchmark.bench import BenchRow
from servegym.benchmark.board import boards
from servegym.benchmark.leaderboard import markdown
from servegym.cli import PAPER_EXPERIMENTS, main
from servegym.envs import TEST_SEEDS
from servegym.evaluation.executor import FolderInUse, FolderLock, Interrupted, Terminated
from servegym.evaluation.stats import MIN_VERDICT_SEEDS
from servegym.experiments import FOLDER, find_experiment, shipped_experiments
from tests.conftest import live_processes

ROOT = Path(__file__).resolve().parents[1]
SERVEGYM = [sys.executable, "-m", "servegym.cli"]
TINY = """
name: tiny
seeds: 2
max_steps: 300
engine: {length_mode: predicted}
policies: [fcfs]
workloads: [low]
"""
"""A grid of two short runs (a few seconds), for what needs a real grid but not a long one."""
LONG = """
name: long
seeds: 20
max_steps: 20000
engine: {length_mode: predicted}
policies: [fcfs, sarathi]
workloads: [medium]
"""
"""A grid that runs for minutes: it is still running when the test stops it."""


def _spec(tmp_path: Path, text: str) -> str:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return str(path)


def _default_sigint() -> None:
    """In the child before it starts: Ctrl-C's default action, even where this test runs with SIGINT ignored (a
    background job inherits that, and Python then leaves Ctrl-C ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def _started(cmd: list[str], cwd: Path = ROOT):
    """A command in a process group of its own, killed with its whole group whatever happens."""
    proc = subprocess.Popen(cmd, cwd=cwd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_default_sigint)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def _wait_for(condition, seconds: float, what: str) -> float:
    """Poll ``condition`` until it holds; the seconds it took (failing after a generous ``seconds``)."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < seconds, f"{what}: not within {seconds} s"
        time.sleep(0.05)
    return time.monotonic() - start


def _workers(pgid: int) -> list[str]:
    return [p for p in live_processes("pgid", pgid) if "spawn_main" in p]


# --- shipped experiments ----------------------------------------------------------------------------------------


def test_every_paper_experiment_is_shipped_and_found_by_name_file_name_or_checkout_path(tmp_path, monkeypatch):
    # Rule: a name that is not a file resolves to the shipped experiment of that name, from any folder.
    assert set(PAPER_EXPERIMENTS) | {"default"} <= set(shipped_experiments())
    monkeypatch.chdir(tmp_path)  # outside the checkout, as after a wheel install
    for text in ("twp_paper", "twp_paper.yaml", "experiments/twp_paper.yaml"):
        assert find_experiment(text) == FOLDER / "twp_paper.yaml"
    (tmp_path / "twp_paper.yaml").write_text("name: mine\n")
    assert find_experiment("twp_paper.yaml") == Path("twp_paper.yaml")  # an existing file always wins


def test_an_unknown_experiment_lists_the_shipped_ones_and_a_folder_says_it_is_one(tmp_path, capsys):
    assert main(["compare", "no_such_experiment"]) == 2
    err = capsys.readouterr().err
    assert "'no_such_experiment' is neither a file nor a shipped experiment" in err and "twp_paper_warm" in err
    assert main(["compare", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"experiment {tmp_path} is a folder" in err and "does not exist" not in err
    assert len(err.strip().splitlines()) == 1


def test_compare_by_name_runs_the_shipped_file(tmp_path, monkeypatch):
    import servegym.evaluation as evaluation

    ran = []

    def fake_compare(experiment, out, **kwargs):
        ran.append(experiment.name)
        (out / "summary.md").write_text("summary")
        return [], {"summary": out / "summary.md"}

    monkeypatch.setattr(evaluation, "compare", fake_compare)
    monkeypatch.chdir(tmp_path)
    assert main(["compare", "twp_paper", "--seeds", "1", "--out", str(tmp_path / "out"), "--quiet"]) == 0
    assert ran == ["twp_paper"]


def test_reproduce_reads_the_shipped_experiments_from_any_folder(tmp_path, monkeypatch):
    # Rule: without --experiments, reproduce loads the five paper experiments shipped with the package, so it
    # works from a folder that has no experiments/ (as after a wheel install).
    import servegym.evaluation.reproduction as reproduction

    read = []
    monkeypatch.setattr(cli, "_saved_results", lambda folder, name: (read.append(name) or [], 3))
    monkeypatch.setattr(reproduction, "write_reproduction", lambda results, seeds, doc, regimes: [])
    monkeypatch.chdir(tmp_path)
    assert main(["reproduce", "--from-results", "--results", "saved", "--out", "out"]) == 0
    assert read == list(PAPER_EXPERIMENTS)


def test_reproduce_from_results_with_nothing_saved_is_one_clear_line(tmp_path, capsys):
    assert main(["reproduce", "--from-results", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Errno" not in err
    assert f"{tmp_path / 'results' / 'twp_paper_warm' / 'results.csv'} does not exist" in err
    assert not (tmp_path / "REPRODUCTION.md").exists()


@pytest.mark.parametrize(("text", "match"), [
    ("a,b\n1,2\n", r"columns \['a', 'b'\] are not a results.csv's"),
    ("policy,workload,seed,metric,value\nfcfs,low,0,ttft_p99,0.5\nfcfs,low,zero,ttft_p99,0.5\n", "line 3"),
    ("policy,workload,seed,metric,value\nfcfs,low,0,ttft_p99\n", "line 2"),
])
def test_a_malformed_saved_results_file_names_itself_and_the_line(tmp_path, capsys, text, match):
    import re

    for name in PAPER_EXPERIMENTS:
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.csv").write_text(text)
    assert main(["reproduce", "--from-results", "--results", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "twp_paper_warm" / "results.csv") in err and re.search(match, err)


# --- one writer per folder --------------------------------------------------------------------------------------


def test_a_folder_lock_refuses_a_second_holder_and_a_dead_holder_releases_it(tmp_path):
    # Rule: while one process holds a folder's lock, another is refused at once with the folder and holder's pid;
    # the lock dies with its holder.
    holder = [sys.executable, "-c", "import sys, time; from servegym.evaluation.executor import FolderLock; "
              "lock = FolderLock(sys.argv[1]).__enter__(); print('locked', flush=True); time.sleep(600)", str(tmp_path)]
    with _started(holder) as proc:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(FolderInUse, match=rf"{tmp_path} is being written by another servegym run \(pid "
                                              rf"{proc.pid}\)"):
            FolderLock(tmp_path).__enter__()
        proc.kill()
        proc.wait(timeout=60)
    with FolderLock(tmp_path):  # released by the holder's death, though its lock file stays
        assert (tmp_path / FolderLock.FILE).read_text() == f"{os.getpid()}\n"
        with pytest.raises(FolderInUse):  # a second open in the same process is refused too
            FolderLock(tmp_path).__enter__()
    with FolderLock(tmp_path):  # and by a clean exit
        pass


@pytest.mark.parametrize("command", ["compare", "bench", "reproduce"])
def test_a_second_grid_into_a_locked_folder_is_refused_at_once(tmp_path, command):
    out = tmp_path / "out"
    locked = out / "results" if command == "reproduce" else out
    argv = {"compare": ["compare", _spec(tmp_path, TINY), "--workers", "1", "--no-plots"],
            "bench": ["bench", "--tasks", "relaxed", "--policies", "fcfs", "--seeds", "1", "--workers", "1"],
            "reproduce": ["reproduce", "--seeds", "3", "--workers", "1"]}[command]
    holder = [sys.executable, "-c", "import sys, time; from servegym.evaluation.executor import FolderLock; "
              "lock = FolderLock(sys.argv[1]).__enter__(); print('locked', flush=True); time.sleep(600)", str(locked)]
    with _started(holder) as proc:
        assert proc.stdout.readline().strip() == "locked"
        start = time.monotonic()
        second = subprocess.run([*SERVEGYM, *argv, "--out", str(out), "--quiet"], cwd=ROOT, capture_output=True,
                                text=True, timeout=300)
        print(f"the second {command} was refused after {time.monotonic() - start:.1f} s")
        assert second.returncode == 2, second.stderr
        assert f"{locked} is being written by another servegym run (pid {proc.pid})" in second.stderr
        assert "Traceback" not in second.stderr
        assert not list(out.rglob("*.pkl")) and not (out / "summary.md").exists()


# --- stopping: SIGTERM 143, SIGINT 130, no worker left ----------------------------------------------------------


def test_exit_status_names_the_signal(monkeypatch, capsys):
    # Rule: a command stopped by SIGTERM exits 143, by Ctrl-C 130, whether or not a grid was running.
    assert Interrupted({}, signal.SIGTERM).exit_status == 143 and Interrupted({}).exit_status == 130
    for raised, status in ((Terminated(), 143), (KeyboardInterrupt(), 130), (Interrupted({0: 1}, 15), 143),
                           (Interrupted({}, 2), 130)):
        def command(args, raised=raised):
            raise raised

        monkeypatch.setattr(cli, "cmd_policies", command)
        assert main(["policies"]) == status
        err = capsys.readouterr().err
        assert ("terminated (SIGTERM)" in err) == (status == 143)


def test_sigterm_stops_any_command_and_the_handler_is_put_back(monkeypatch, capsys):
    # Rule: while any command runs, SIGTERM raises in the main thread (so the command stops as Ctrl-C stops it,
    # with status 143); the previous handler is back afterwards. The handler is called as the system would call
    # it, so that a missing one fails this test instead of killing the test process.
    before = signal.getsignal(signal.SIGTERM)

    def command(args):
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler), f"no SIGTERM handler while a command runs: {handler!r}"
        handler(signal.SIGTERM, None)
        return 0

    monkeypatch.setattr(cli, "cmd_policies", command)
    assert main(["policies"]) == 143
    assert "servegym: terminated (SIGTERM)" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize(("command", "signum", "status"), [
    ("compare", signal.SIGTERM, 143), ("bench", signal.SIGTERM, 143), ("reproduce", signal.SIGTERM, 143),
    ("compare", signal.SIGINT, 130),
])
def test_a_signal_stops_a_running_grid_with_its_status_and_leaves_no_process(tmp_path, command, signum, status):
    argv = {"compare": ["compare", _spec(tmp_path, LONG), "--no-plots"],
            "bench": ["bench", "--tasks", "relaxed", "--policies", "fcfs", "sarathi"],
            "reproduce": ["reproduce"]}[command]
    with _started([*SERVEGYM, *argv, "--workers", "2", "--quiet", "--out", str(tmp_path / "out")]) as proc:
        waited = _wait_for(lambda: len(_workers(proc.pid)) >= 2 or proc.poll() is not None, 180, "two workers")
        assert proc.poll() is None, f"{command} ended before it could be stopped: {proc.communicate()}"
        os.kill(proc.pid, signum)  # the parent only: it must stop its workers itself
        sent = time.monotonic()
        _, err = proc.communicate(timeout=120)
        print(f"workers up after {waited:.1f} s; {command} exited {time.monotonic() - sent:.1f} s after the signal")
        assert proc.returncode == status, err
        assert "finished runs kept" in err and "Traceback" not in err
        left = _wait_for(lambda: not live_processes("pgid", proc.pid), 60, f"the processes {command} started")
        print(f"no process left {left:.1f} s after exit")


def test_the_pool_kills_what_it_started_when_stopped_while_starting(monkeypatch):
    from servegym.evaluation import executor

    started = []
    real = executor._Worker

    class StopOnThird(real):
        def __init__(self, ctx, fn):
            if len(started) == 2:
                raise Terminated
            super().__init__(ctx, fn)
            started.append(self)

    monkeypatch.setattr(executor, "_Worker", StopOnThird)
    with pytest.raises(Interrupted) as caught:
        executor.run_jobs(abs, [1, 2, 3, 4], workers=3)
    assert caught.value.exit_status == 143
    assert len(started) == 2 and not any(w.proc.is_alive() for w in started)


def _pid(_: object) -> int:
    return os.getpid()


def test_a_signal_during_a_workers_spawn_waits_until_the_pool_can_kill_it(monkeypatch):
    # Bug caught: SIGTERM landing between a worker's spawn and its registration left a half-started child that no
    # one killed; it died later with an EOFError traceback on the parent's stderr (a flaky CI failure). The pool
    # registers a worker before it spawns, and holds the signal back while it does.
    from servegym.evaluation import executor

    started = []
    real = executor._Worker

    class SignalMidStart(real):
        def start(self):
            super().start()
            started.append(self)
            if len(started) == 2:
                os.kill(os.getpid(), signal.SIGTERM)  # the child exists, mid-start

    monkeypatch.setattr(executor, "_Worker", SignalMidStart)
    with pytest.raises(Interrupted) as caught:
        executor.run_jobs(abs, [1, 2, 3, 4], workers=3)
    assert caught.value.exit_status == 143
    assert len(started) == 2 and not any(w.proc.is_alive() for w in started)


def test_a_signal_pending_as_the_pool_holds_signals_back_leaves_none_blocked(monkeypatch):
    # Bug caught (a CI failure): pthread_sigmask changes the mask, then runs Python's handlers; a Ctrl-C already
    # pending raised from the blocking call itself, before the code that restores the mask, so SIGINT and SIGTERM
    # stayed blocked in the process and in every child it started afterwards.
    from servegym.evaluation import executor

    real = signal.pthread_sigmask
    before = real(signal.SIG_BLOCK, [])
    calls = []

    def pending_interrupt(how, mask):
        result = real(how, mask)
        calls.append(how)
        if how == signal.SIG_BLOCK and set(mask) == executor.STOP_SIGNALS and calls.count(how) <= 2:
            raise KeyboardInterrupt  # what the pending signal's handler does, after the mask changed
        return result

    monkeypatch.setattr(signal, "pthread_sigmask", pending_interrupt)
    try:
        with pytest.raises(Interrupted):
            executor.run_jobs(abs, [1, 2, 3], workers=2)
        assert real(signal.SIG_BLOCK, []) == before
    finally:
        real(signal.SIG_SETMASK, before)  # never leave a broken mask to the tests that follow


def test_workers_do_not_inherit_the_signals_held_back_while_they_start():
    from servegym.evaluation import executor

    held = executor.run_jobs(functools.partial(signal.pthread_sigmask, signal.SIG_BLOCK), [[], []], workers=2)
    assert held == [set(), set()]
    assert os.getpid() not in executor.run_jobs(_pid, [0, 1], workers=2)  # they ran in workers, not inline


# --- progress bars ----------------------------------------------------------------------------------------------


def test_no_progress_bar_is_drawn_into_a_log(tmp_path):
    # Rule: with stderr not a terminal, the grid's progress bar stays silent (no stream of carriage returns).
    start = time.monotonic()
    done = subprocess.run([*SERVEGYM, "compare", _spec(tmp_path, TINY), "--workers", "1", "--no-plots", "--out",
                           str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    print(f"compare took {time.monotonic() - start:.1f} s")
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr and "compare tiny" not in done.stderr


# --- verdicts need three seeds ----------------------------------------------------------------------------------


def _board_rows(seeds: int) -> list[BenchRow]:
    """A task where twp is 50% faster than random and FCFS: decision-sensitive, given enough seeds."""
    latency = {"random": 2.0, "fcfs": 2.0, "twp": 1.0, "clairvoyant-greedy": 1.0}
    return [BenchRow("relaxed", policy, seed, -100.0, 1.0, value, 0.5, 0, False, 10)
            for policy, value in latency.items() for seed in TEST_SEEDS[:seeds]]


def test_bench_gives_no_verdict_from_fewer_than_three_seeds():
    # Rule: a decision-sensitivity verdict needs MIN_VERDICT_SEEDS (3) seeds, the same count reproduce needs.
    rankings = {"relaxed": "e2e_mean_all_s"}
    assert MIN_VERDICT_SEEDS == 3
    assert boards(_board_rows(3), rankings)[0].verdict == "decision-sensitive"
    for seeds in (1, 2):
        (board,) = boards(_board_rows(seeds), rankings)
        assert board.verdict == "undetermined"
        text = markdown(_board_rows(seeds), rankings=rankings)
        assert "- **Decision-sensitive:** none" in text and "fewer than 3 seeds): relaxed" in text


# --- joining a Ray cluster ------------------------------------------------------------------------------------


class _UnreachableRay:
    """Just enough of the ``ray`` module for a join that fails."""

    @staticmethod
    def is_initialized() -> bool:
        return False

    @staticmethod
    def init(**options) -> None:
        raise RuntimeError("Failed to connect to Ray cluster at 10.0.0.1:6379\nmore detail")


def test_a_failed_join_says_to_set_token_authentication_when_it_is_not_set(monkeypatch):
    # Rule: a failed join by address, with RAY_AUTH_MODE not 'token' here, names the setting (with current Ray a
    # node or driver without it is refused by a cluster that uses tokens); a local instance gets no such hint.
    from servegym.evaluation import ray_executor
    from servegym.evaluation.ray_executor import _Connection

    monkeypatch.setattr(ray_executor, "probe_address", lambda address: None)  # no traffic to 10.0.0.1
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ConnectionError, match=r"at '10.0.0.1:6379': Failed to connect .*; if the cluster's nodes run "
                                              r"with RAY_AUTH_MODE=token, set RAY_AUTH_MODE=token here too"):
        _Connection(_UnreachableRay, "10.0.0.1:6379", None).__enter__()
    with pytest.raises(ConnectionError) as local:
        _Connection(_UnreachableRay, None, 2).__enter__()
    assert "RAY_AUTH_MODE" not in str(local.value)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    with pytest.raises(ConnectionError) as with_token:
        _Connection(_UnreachableRay, "10.0.0.1:6379", None).__enter__()
    assert "RAY_AUTH_MODE" not in str(with_token.value)


def test_workers_of_a_parent_killed_outright_die_with_it_and_print_nothing(tmp_path):
    # Rule: SIGKILL of compare's parent (no handler runs) leaves no worker running its job for no one, and no
    # worker prints a BrokenPipeError or EOFError traceback on the way out.
    cmd = [*SERVEGYM, "compare", _spec(tmp_path, LONG), "--no-plots", "--workers", "2", "--quiet",
           "--out", str(tmp_path / "out")]
    with _started(cmd) as proc:
        waited = _wait_for(lambda: len(_workers(proc.pid)) >= 2 or proc.poll() is not None, 180, "two workers")
        assert proc.poll() is None, f"compare ended before it could be killed: {proc.communicate()}"
        os.kill(proc.pid, signal.SIGKILL)  # the parent only
        gone = _wait_for(lambda: not live_processes("pgid", proc.pid), 120, "the workers' exit")
        _, err = proc.communicate(timeout=60)
        print(f"workers up after {waited:.1f} s; all gone {gone:.1f} s after the kill")
    assert proc.returncode == -signal.SIGKILL
    assert "Traceback" not in err and "BrokenPipeError" not in err and "EOFError" not in err, err


def test_a_worker_busy_with_a_job_dies_with_its_killed_parent(tmp_path):
    # Rule: a worker whose parent was killed outright does not run its job to the end for no one. The jobs sleep
    # an hour, so without the rule the workers would outlive the 120 s deadline by far.
    flags = [str(tmp_path / f"job{i}") for i in range(2)]
    code = ("from servegym.evaluation.executor import run_jobs; from tests.stop_helpers import touch_then_sleep; "
            f"run_jobs(touch_then_sleep, {flags!r}, workers=2)")
    with _started([sys.executable, "-c", code]) as proc:
        _wait_for(lambda: all(Path(f).exists() for f in flags) or proc.poll() is not None, 180, "both jobs")
        assert proc.poll() is None, proc.communicate()
        os.kill(proc.pid, signal.SIGKILL)
        gone = _wait_for(lambda: not live_processes("pgid", proc.pid), 120, "the busy workers' exit")
        print(f"both busy workers gone {gone:.1f} s after the kill")
