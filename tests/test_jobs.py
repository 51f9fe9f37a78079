"""Long jobs that stop, resume and never mislead: Ctrl-C, dead workers, the run store, early argument checks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servegym.cli import main
from servegym.evaluation.executor import Interrupted, JobFailed, RunStore, run_jobs, run_stored
from tests.stop_helpers import DEADLINE_S, kill_session, wait_for_exit, wait_until, wait_until_gone

ROOT = Path(__file__).resolve().parents[1]


def square_or_die(x: int) -> int:
    """A job for spawned workers: 3 kills its own worker (as the OOM killer would), 4 raises."""
    if x == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    if x == 4:
        raise ArithmeticError("four is bad")
    return x * x


def test_a_dead_worker_costs_its_own_job_not_the_grid():
    with pytest.raises(JobFailed) as caught:
        run_jobs(square_or_die, list(range(12)), workers=2, describe=lambda x: f"job {x}")
    message = str(caught.value)
    assert "2 of 12 jobs failed" in message and "job 3: its worker died" in message
    assert caught.value.results == {x: x * x for x in range(12) if x not in (3, 4)}


def test_a_raising_job_reports_its_traceback_and_keeps_the_others():
    with pytest.raises(JobFailed, match=r"job 4 raised:(.|\n)*ArithmeticError: four is bad"):
        run_jobs(square_or_die, [0, 1, 4, 5], workers=2, describe=lambda x: f"job {x}")
    with pytest.raises(JobFailed) as caught:
        run_jobs(square_or_die, [0, 4, 5], workers=1 + 1)
    assert caught.value.results == {0: 0, 2: 25}


def test_inline_runs_match_the_pool():
    assert run_jobs(square_or_die, [0, 1, 2, 5], workers=1) == run_jobs(square_or_die, [0, 1, 2, 5], workers=2)
    with pytest.raises(ValueError, match="workers must be >= 1"):
        run_jobs(square_or_die, [1], workers=0)


def test_inline_interrupt_keeps_finished_results():
    def job(x: int) -> int:
        if x == 2:
            raise KeyboardInterrupt
        return x

    previous = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(Interrupted) as caught:
            run_jobs(job, [0, 1, 2, 3], workers=1)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert caught.value.results == {0: 0, 1: 1}


def test_run_store_round_trip_and_torn_files(tmp_path):
    store = RunStore(tmp_path)
    store.put(("a", 1), {"x": 1.5})
    assert store.get(("a", 1)) == {"x": 1.5} and store.get(("a", 2)) is None and len(store) == 1
    next(tmp_path.glob("*.pkl")).write_bytes(b"\x80\x04torn")
    assert store.get(("a", 1)) is None  # a torn file is run again, not trusted
    store.clear()
    assert len(store) == 0


def test_run_stored_runs_only_the_missing_jobs_and_stores_each_under_its_own_job(tmp_path):
    store = RunStore(tmp_path)
    store.put(1, 100)  # job 1's result from an earlier run (not 1 * 1, so a re-run would show)
    assert run_stored(square_or_die, [0, 1, 2, 5], 1, store) == [0, 100, 4, 25]
    assert [store.get(x) for x in (0, 1, 2, 5)] == [0, 100, 4, 25] and len(store) == 4


def test_a_failure_after_a_resume_reports_stored_and_fresh_results_by_job_index(tmp_path):
    store = RunStore(tmp_path)
    store.put(1, 100)
    # Jobs 0, 4, 5 run (4 raises); their indices in the job list are 0, 2 and 3, not 0, 1, 2.
    with pytest.raises(JobFailed, match="1 of 3 jobs failed") as caught:
        run_stored(square_or_die, [0, 1, 4, 5], 1, store, describe=lambda x: f"job {x}")
    assert caught.value.results == {0: 0, 1: 100, 3: 25}


STOP_LIMIT_S = 60.0
"""How long a stopped grid may take to exit: far above the 0.2-0.3 s measured on a quiet machine."""
EXPERIMENT = """
name: sigint
seeds: 8
max_steps: 4000
engine: {length_mode: predicted}
policies: [fcfs, sarathi]
workloads: [medium]
"""


@pytest.mark.slow
def test_sigint_stops_compare_promptly_and_the_rerun_finishes_only_the_rest(tmp_path):
    # Rule: Ctrl-C keeps the finished runs, exits 130 with no worker left, and the rerun runs only the others.
    # Waits are on files and processes, with generous deadlines (tests/stop_helpers.py): a loaded machine passes.
    spec = tmp_path / "sigint.yaml"
    spec.write_text(EXPERIMENT)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "servegym.cli", "compare", str(spec), "--out", str(out), "--workers", "2",
           "--no-plots", "--quiet"]
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    runs = out / "runs"
    try:
        wait_until("two stored runs", lambda: runs.is_dir() and len(list(runs.glob("*.pkl"))) >= 2, proc)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
        sent = time.monotonic()
        _, err = wait_for_exit(proc, sent)
        # A hang guard, not a speed test: a stop that let the grid finish shows in the count of kept runs below.
        assert time.monotonic() - sent < STOP_LIMIT_S
        assert proc.returncode == 130 and "interrupted" in err
        wait_until_gone("pgid", proc.pid, sent)  # no worker outlives the parent
    finally:
        kill_session(proc)
    kept = {p.name: p.stat().st_mtime_ns for p in runs.glob("*.pkl")}
    assert 2 <= len(kept) < 16
    assert (out / "summary.md").read_text().startswith("> **PARTIAL RESULTS**")
    rerun = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=2 * DEADLINE_S)
    assert rerun.returncode == 0, rerun.stderr
    assert "not run again" in rerun.stdout
    after = {p.name: p.stat().st_mtime_ns for p in runs.glob("*.pkl")}
    assert len(after) == 16 and all(after[name] == mtime for name, mtime in kept.items())
    assert "PARTIAL" not in (out / "summary.md").read_text()


@pytest.mark.parametrize("argv", [["compare", "--seeds", "0"], ["compare", "--seeds", "-2"],
                                  ["compare", "--workers", "0"], ["run", "--seed", "-1"],
                                  ["reproduce", "--workers", "0"]])
def test_bad_numbers_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as caught:
        main(argv)
    err = capsys.readouterr().err
    assert caught.value.code == 2 and ("must be >=" in err or "must be a whole number in [1, " in err), err


def test_unwritable_output_is_refused_before_any_run(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["compare", "--seeds", "1", "--out", str(blocker / "sub"), "--quiet"]) == 2
    assert "not writable" in capsys.readouterr().err


def test_reproduce_refuses_a_verdict_from_fewer_than_three_seeds(tmp_path, capsys):
    assert main(["reproduce", "--seeds", "2", "--out", str(tmp_path)]) == 2
    assert "at least 3 seeds" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before writing anything


BASE = {"name": "x", "seeds": 2, "policies": ["fcfs"], "workloads": ["low"]}


@pytest.mark.parametrize(("change", "match"), [
    ({"policies": ["fcfs", {"name": "twp", "label": "fcfs"}]}, r"labels must be unique.*\['fcfs'\]"),
    ({"policies": ["fcfs", "fcfs"]}, "labels must be unique"),
    ({"seeds": [0, 1, 1]}, r"seeds must be distinct.*\[1\]"),
    ({"seeds": [-1, 2]}, "seeds must be >= 0"),
    ({"seeds": 0}, "seeds must be a positive int"),
    ({"engine": {"foo": 1}}, r"engine: unknown key\(s\) \['foo'\]"),
    ({"engine": {"max_num_seqs": 0}}, "engine: max_num_seqs"),
    ({"pool": {"num_containers": 2, "warmth": 1}}, r"pool: unknown key\(s\) \['warmth'\]"),
    ({"pool": {"router": "nearest"}}, "pool: "),
    ({"profile": "no-such-profile"}, "profile: "),
    ({"name": "../../x"}, "plain folder name"),
    ({"max_steps": True}, "max_steps must be a positive int"),
    ({"ttft_slo_s": 0}, "ttft_slo_s must be a number > 0"),
])
def test_bad_experiments_fail_at_load_naming_the_file_and_key(change, match, tmp_path):
    import yaml

    from servegym.evaluation import ExperimentError, load_experiment

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**BASE, **change}))
    with pytest.raises(ExperimentError, match=match) as caught:
        load_experiment(path)
    assert str(path) in str(caught.value)


def test_relative_trace_paths_resolve_against_the_experiment_file(tmp_path, monkeypatch):
    from servegym.evaluation import load_experiment
    from servegym.workloads import bundled_trace

    folder = tmp_path / "exp"
    folder.mkdir()
    (folder / "t.csv").write_text(bundled_trace().read_text())
    (folder / "e.yaml").write_text("name: t\nseeds: 1\npolicies: [fcfs]\n"
                                   "workloads: [{label: t, trace: {path: t.csv, max_requests: 5}}]\n")
    monkeypatch.chdir(tmp_path)  # the working directory holds no t.csv
    experiment = load_experiment("exp/e.yaml")
    assert experiment.workloads[0].source["trace"]["path"] == str(folder / "t.csv")


def test_one_worker_keeps_going_past_a_failing_job():
    with pytest.raises(JobFailed) as caught:
        run_jobs(square_or_die, [0, 4, 5], workers=1, describe=lambda x: f"job {x}")
    assert caught.value.results == {0: 0, 2: 25} and "job 4 raised" in str(caught.value)


def test_the_callers_sigint_handler_is_restored():
    def handler(signum, frame):
        pass

    previous = signal.signal(signal.SIGINT, handler)
    try:
        run_jobs(square_or_die, [1, 2], workers=2)
        assert signal.getsignal(signal.SIGINT) is handler
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_missing_trace_file_fails_at_load(tmp_path):
    from servegym.evaluation import ExperimentError, load_experiment

    path = tmp_path / "e.yaml"
    path.write_text("name: t\nseeds: 1\npolicies: [fcfs]\nworkloads: [{label: t, trace: {path: nope.csv}}]\n")
    with pytest.raises(ExperimentError, match=r"trace file .*nope.csv does not exist"):
        load_experiment(path)


def test_reproduce_writes_to_its_output_folder_and_docs_only_when_asked(tmp_path, monkeypatch):
    import servegym.evaluation as evaluation
    import servegym.evaluation.reproduction as reproduction

    folders, docs = [], []
    monkeypatch.setattr(evaluation, "compare", lambda experiment, out, **kw: (folders.append(out) or [], {}))
    monkeypatch.setattr(reproduction, "write_reproduction", lambda results, seeds, doc, regimes: docs.append(doc) or [])
    assert main(["reproduce", "--seeds", "3", "--out", str(tmp_path), "--quiet",
                 "--experiments", str(ROOT / "experiments")]) == 0
    assert docs == [tmp_path / "REPRODUCTION.md"]
    assert folders and all(f.parent == tmp_path / "results" for f in folders)
    folders.clear()
    docs.clear()
    monkeypatch.chdir(tmp_path)  # --update-docs writes docs/ under the working directory
    assert main(["reproduce", "--seeds", "3", "--update-docs", "--quiet",
                 "--experiments", str(ROOT / "experiments")]) == 0
    assert docs == [Path("docs/REPRODUCTION.md")] and all(f.parent == Path("docs/results") for f in folders)


def test_stability_sees_compute_overload_at_the_nominal_rate():
    from servegym.backends import load_profile
    from servegym.engine import EngineConfig
    from servegym.stability import workload_stability
    from servegym.workloads import make_workload

    high = workload_stability(make_workload("high"), load_profile("a100-llama3-8b"), EngineConfig())
    assert high.rate_per_s == 47.0 and high.rate_source == "the workload's nominal rate"
    assert high.load_ratio < 0.1 and high.compute_load > 1.0 and not high.stable
    medium = workload_stability(make_workload("medium"), load_profile("a100-llama3-8b"), EngineConfig())
    assert medium.stable and medium.compute_load < 1.0
