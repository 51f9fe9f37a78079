"""``servegym tune`` stopped and run again: one line on stderr and 128 + the signal, the cut-short trial stored as
pruned (never failed, never completed with a partial value), and ``--trials N`` as the study's finished-trial count,
so the same command run again finishes it and workers sharing a study stop together at it."""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from servegym.tuning import TuneConfig, finished_trials, load_study, make_storage, tune  # noqa: E402
from servegym.tuning import study as study_module  # noqa: E402
from tests.stop_helpers import DEADLINE_S, kill_session, wait_for_exit, wait_until  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SERVEGYM = [sys.executable, "-m", "servegym.cli"]
STATE = optuna.trial.TrialState
NOT_COUNTED = study_module.NOT_COUNTED

# Trials of 20 burst episodes (about 0.1 s each here) with a fixed sampler seed: trial 1 has 19 episodes left when the
# test sees its first one reported, so the signal lands mid-trial however loaded the machine is.
STOPPED = ("tune", "--policy", "flow-control", "--workload", "burst", "--trials", "2", "--seeds", "20", "--pruner",
           "none", "--sampler-seed", "0", "--study", "stopped", "--no-report", "--quiet")


@functools.cache
def _reader(db: Path) -> optuna.storages.RDBStorage:
    return optuna.storages.RDBStorage(f"sqlite:///{db}", skip_table_creation=True, skip_compatibility_check=True)


def stored(db: Path, name: str) -> list:
    """The study's trials as stored ([] before the worker has made it), read without creating tables or failing
    any trial (which ``load_study`` would)."""
    if not db.is_file():
        return []
    try:
        return optuna.load_study(study_name=name, storage=_reader(db)).trials
    except Exception:  # the worker has not made the tables or the study yet
        return []


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stop_prunes_the_running_trial_and_the_same_command_finishes_the_count(tmp_path, sig, status):
    # Rule: a stop mid-trial prints exactly one line on stderr, exits 128 + the signal, and stores the cut-short trial
    # as PRUNED, marked not counted; the same command run again adds only the missing trials. The signal comes once
    # trial 1 has reported an episode, so trial 0 is COMPLETE: a trial stored FAIL, or COMPLETE with its partial mean,
    # fails the states below; a re-run that added --trials more ends with 3 complete trials, and one that counted the
    # pruned trial with 1.
    name = signal.Signals(sig).name
    db = tmp_path / "s.db"
    cmd = [*SERVEGYM, *STOPPED, "--storage", f"sqlite:///{db}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            start_new_session=True)
    try:
        wait_until("trial 1 running with an episode reported", lambda: any(
            t.number == 1 and t.state == STATE.RUNNING and t.intermediate_values for t in stored(db, "stopped")), proc)
        proc.send_signal(sig)
        _, err = wait_for_exit(proc, time.monotonic())
    finally:
        kill_session(proc)
    assert proc.returncode == status, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"servegym tune: stopped by {name}; study stopped at sqlite:///{db} keeps its 1 "
                               "finished trials"), err
    trials = stored(db, "stopped")
    assert [t.state for t in trials] == [STATE.COMPLETE, STATE.PRUNED]
    assert trials[1].user_attrs[NOT_COUNTED] == f"stopped by {name}"
    assert 1 <= len(trials[1].intermediate_values) < 20  # cut short mid-trial, after an episode

    again = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=DEADLINE_S)
    assert again.returncode == 0, again.stderr
    assert "holds 2 finished trials of the 2 wanted" in again.stdout
    trials = stored(db, "stopped")
    assert [t.state for t in trials] == [STATE.COMPLETE, STATE.PRUNED, STATE.COMPLETE]
    assert len(trials[2].intermediate_values) == 20


def test_workers_sharing_a_study_stop_together_at_the_count(tmp_path):
    # Rule: three workers each given --trials 6 on one study end with 6 finished trials between them, not 18 (each
    # adding its own 6) and not 6 each. Trials they started at the same moment past the count are pruned, not counted.
    storage = f"journal:{tmp_path}/s.journal"
    cmd = [*SERVEGYM, "tune", "--policy", "flow-control", "--workload", "low", "--trials", "6", "--seeds", "1",
           "--max-steps", "100", "--pruner", "none", "--storage", storage, "--study", "shared", "--no-report",
           "--quiet"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                              start_new_session=True) for _ in range(3)]
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=DEADLINE_S)
            assert proc.returncode == 0, err
    finally:
        for proc in procs:
            kill_session(proc)
    study = optuna.load_study(study_name="shared", storage=make_storage(storage))
    assert finished_trials(study) == 6
    assert [t.state for t in study.trials].count(STATE.COMPLETE) == 6
    assert all(t.state == STATE.COMPLETE or t.user_attrs[NOT_COUNTED].startswith("surplus") for t in study.trials)


def live_other_worker() -> str:
    """A ``host:pid`` worker id of a live process other than this one (pytest's parent), so its RUNNING trial is
    neither this worker's nor a dead worker's."""
    return f"{socket.gethostname()}:{os.getppid()}"


def config(tmp_path: Path, trials: int) -> TuneConfig:
    return TuneConfig(policy="flow-control", workload="low", trials=trials, seeds=1, max_steps=50, pruner="none",
                      storage=f"journal:{tmp_path}/s.journal", study_name="shared", sampler_seed=0)


def store(tmp_path: Path, trials: list[tuple[str, dict]]) -> optuna.Study:
    """A study holding trials of the given states (and user attributes), in that order."""
    study = load_study(config(tmp_path, 1))
    for state, attrs in trials:
        trial = study.ask({"activation_budget": optuna.distributions.FloatDistribution(0.05, 20.0, log=True)})
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        if state == "COMPLETE":
            study.tell(trial, 1.0)
        elif state != "RUNNING":
            study.tell(trial, state=STATE[state])
    return study


@pytest.mark.parametrize(("held", "added"), [
    ([], 2),
    ([("COMPLETE", {}), ("PRUNED", {})], 0),  # pruned by the pruner: finished
    ([("COMPLETE", {}), ("PRUNED", {NOT_COUNTED: "stopped by SIGINT"})], 1),  # cut short by a stop: redone
    ([("COMPLETE", {}), ("FAIL", {})], 1),  # failed: retried
    ([("COMPLETE", {}), ("RUNNING", {"worker": "LIVE"})], 0),  # another worker is finishing it
    ([("COMPLETE", {}), ("RUNNING", {})], 1),  # never named its worker, which died asking for it: redone
    ([("COMPLETE", {}), ("COMPLETE", {}), ("COMPLETE", {})], 0),  # more than asked: nothing run, nothing removed
])
def test_a_run_adds_only_the_trials_the_count_is_missing(tmp_path, monkeypatch, held, added):
    # Rule: --trials 2 means two finished trials (COMPLETE, or PRUNED by the pruner) in the study: the counts here
    # are worked out by hand from that rule for each stored history.
    monkeypatch.setattr(study_module, "UNNAMED_WAIT_S", 0.2)
    held = [(state, {k: live_other_worker() if v == "LIVE" else v for k, v in attrs.items()}) for state, attrs in held]
    before = len(store(tmp_path, held).trials)
    study = tune(config(tmp_path, 2), progress=False)
    assert len(study.trials) == before + added
    assert all(t.state == STATE.COMPLETE for t in study.trials[before:])


def test_a_trial_started_when_the_count_is_claimed_is_pruned_unrun(tmp_path):
    # Rule: workers order trials by number; a trial whose predecessors (finished or running) already make the count
    # is surplus: pruned before it samples or runs anything, not counted, and its worker stops. Here trial 1 is
    # another worker's, still running, when trial 2 starts on a study asking for 2.
    study = store(tmp_path, [("COMPLETE", {}), ("RUNNING", {"worker": live_other_worker()})])
    ran = []

    def objective(trial: optuna.Trial) -> float:
        ran.append(trial.number)
        return 1.0

    study.optimize(study_module._Filling(study, objective, 2), n_trials=3, catch=())
    assert ran == []  # stopped after the surplus trial, not three of them
    assert [t.state for t in study.trials] == [STATE.COMPLETE, STATE.RUNNING, STATE.PRUNED]
    assert study.trials[2].user_attrs[NOT_COUNTED] == "surplus: the study already had 2 trials"
    assert study.trials[2].params == {} and finished_trials(study) == 1


def test_the_report_says_which_pruned_trials_are_not_counted(tmp_path):
    from servegym.tuning.report import report

    study = store(tmp_path, [("COMPLETE", {}), ("PRUNED", {NOT_COUNTED: "stopped by SIGTERM"}), ("PRUNED", {})])
    report(dataclasses.replace(config(tmp_path, 1), eval_seeds=1), study, tmp_path / "out")
    text = (tmp_path / "out" / "report.md").read_text()
    assert "Trials: {'complete': 1, 'pruned': 2} (not counted: 1 pruned by a stop or as surplus)" in text


def test_a_signal_just_before_the_first_trial_prunes_one_trial_and_stops(tmp_path, monkeypatch):
    # Rule: a signal that lands after the study opened but before Optuna's loop began (where the loop cannot yet be
    # told to stop) still ends the run at its first trial: one trial, pruned, not five.
    real = study_module._stop_when_full  # made just before the loop starts

    def signalled(target: int):
        os.kill(os.getpid(), signal.SIGINT)  # the handler only records it
        return real(target)

    monkeypatch.setattr(study_module, "_stop_when_full", signalled)
    with pytest.raises(study_module.TuningInterrupted) as stop:
        tune(config(tmp_path, 5), progress=False)
    assert stop.value.exit_status == 130
    trials = load_study(config(tmp_path, 5)).trials
    assert [t.state for t in trials] == [STATE.PRUNED]
    assert trials[0].user_attrs[NOT_COUNTED] == "stopped by SIGINT"


def test_a_trial_that_names_its_worker_late_is_waited_for(tmp_path):
    # Rule: a RUNNING trial without its worker's name is one another worker asked for a moment ago (or one whose
    # worker died at once): the next trial's check waits for the name, so two workers starting the last trial at the
    # same moment do not both run it. Here trial 1 names its (live) worker 0.3 s late: trial 2 must then be surplus.
    import threading

    study = store(tmp_path, [("COMPLETE", {})])
    late = study.ask()  # trial 1: RUNNING, no worker named yet
    namer = threading.Timer(0.3, late.set_user_attr, ("worker", live_other_worker()))
    namer.start()
    ran = []
    try:
        study.optimize(study_module._Filling(study, lambda trial: ran.append(trial.number) or 1.0, 2), n_trials=1,
                       catch=())
    finally:
        namer.join()
    assert ran == []
    assert study.trials[2].state == STATE.PRUNED and study.trials[2].user_attrs[NOT_COUNTED].startswith("surplus")
