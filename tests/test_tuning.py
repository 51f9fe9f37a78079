"""Optuna tuning: search spaces, a tiny study that beats bad defaults, resume after kill, shared studies."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

optuna = pytest.importorskip("optuna")

from servegym.policies import POLICIES, make_policy  # noqa: E402
from servegym.runner import make_env  # noqa: E402
from servegym.tuning import TuneConfig, best_params, load_study, read_params, tune, write_params  # noqa: E402
from servegym.tuning import study as study_module  # noqa: E402
from servegym.tuning.report import report  # noqa: E402

TUNABLE = sorted(name for name, cls in POLICIES.items() if cls.search_space is not None)
SERVEGYM = [sys.executable, "-m", "servegym.cli"]


def test_tunable_policies_are_the_issue_list():
    assert set(TUNABLE) >= {"twp", "flow-control", "dynamic-batch", "alpha-protection", "vllm"}


@pytest.mark.parametrize("name", TUNABLE)
def test_search_space_produces_valid_parameters(name):
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(15):
        trial = study.ask()
        params = POLICIES[name].search_space(trial)
        policy = make_policy(name, **params)
        env = make_env(policy, workload="low", strict_actions=True, max_episode_steps=60)
        obs, _ = env.reset(seed=0)
        for _ in range(60):
            obs, _, terminated, truncated, _ = env.step(policy.act(obs))
            if terminated or truncated:
                break
        study.tell(trial, 0.0)


def test_tiny_study_beats_a_clearly_bad_default(tmp_path):
    # Flow control's default b = 1 activation per step starves a 7.5 req/s load; tuning b must fix it.
    cfg = TuneConfig(policy="flow-control", workload="high", objective="cost", trials=12, seeds=1, eval_seeds=2,
                     storage=f"sqlite:///{tmp_path}/s.db", pruner="none")
    study = tune(cfg, progress=False)
    summary = report(cfg, study, tmp_path / "out")
    assert best_params(study)["activation_budget"] > 1.0
    assert summary["tuned"]["ttft_p99"] < summary["default"]["ttft_p99"]
    name, params = read_params(tmp_path / "out" / "best_params.json")
    assert name == "flow-control" and params == best_params(study)
    assert (tmp_path / "out" / "optimization_history.png").stat().st_size > 1000
    assert "held-out seeds 0..1" in (tmp_path / "out" / "report.md").read_text()


def test_failing_trial_is_recorded_and_the_study_goes_on(tmp_path, monkeypatch):
    calls = {"n": 0}
    real = study_module.evaluate

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")
        return real(*args, **kwargs)

    monkeypatch.setattr(study_module, "evaluate", flaky)
    cfg = TuneConfig(policy="flow-control", workload="low", trials=3, seeds=1, storage=f"sqlite:///{tmp_path}/f.db")
    states = [t.state for t in tune(cfg, progress=False).trials]
    assert states.count(optuna.trial.TrialState.FAIL) == 1
    assert states.count(optuna.trial.TrialState.COMPLETE) == 2


def completed(storage: str, name: str) -> list:
    try:
        study = optuna.load_study(study_name=name, storage=study_module.make_storage(storage))
    except KeyError:  # the worker has not created the study yet
        return []
    return [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]


def tune_process(storage: str, trials: int, extra=()) -> subprocess.Popen:
    cmd = [*SERVEGYM, "tune", "--policy", "flow-control", "--workload", "low", "--trials", str(trials), "--seeds",
           "1", "--storage", storage, "--study", "shared", "--pruner", "none", "--no-report", "--quiet", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=Path(__file__).parents[1])


def wait_for(predicate, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError("timed out")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_resume_after_kill_keeps_every_completed_trial(tmp_path, sig):
    storage = f"sqlite:///{tmp_path}/resume.db"
    proc = tune_process(storage, trials=1000)
    try:
        wait_for(lambda: len(completed(storage, "shared")) >= 4)
    finally:
        proc.send_signal(sig)
        proc.wait(timeout=60)
    before = {t.number for t in completed(storage, "shared")}
    if sig == signal.SIGTERM:  # a clean stop leaves no trial marked running
        study = optuna.load_study(study_name="shared", storage=study_module.make_storage(storage))
        assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    again = tune_process(storage, trials=3)
    assert again.wait(timeout=120) == 0, again.stderr.read().decode()
    after = {t.number for t in completed(storage, "shared")}
    assert before <= after and len(after) >= len(before) + 3


def test_two_processes_share_one_journal_study(tmp_path):
    storage = f"journal:{tmp_path}/journal.log"
    workers = [tune_process(storage, trials=4) for _ in range(2)]
    for w in workers:
        assert w.wait(timeout=180) == 0, w.stderr.read().decode()
    trials = completed(storage, "shared")
    assert len(trials) == 8
    assert len({t.user_attrs["worker"] for t in trials}) == 2


def test_params_file_round_trip_and_errors(tmp_path):
    write_params("twp", {"initial_window": 900.0}, tmp_path / "p.json")
    assert read_params(tmp_path / "p.json") == ("twp", {"initial_window": 900.0})
    (tmp_path / "bad.json").write_text("{\"params\": 3}")
    with pytest.raises(ValueError, match="expected"):
        read_params(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="no search space"):
        TuneConfig(policy="fcfs", workload="low")


def test_pareto_objective_reports_a_front(tmp_path):
    cfg = TuneConfig(policy="twp", workload="low", objective="pareto", trials=6, seeds=1, eval_seeds=1,
                     storage=f"sqlite:///{tmp_path}/p.db")
    study = tune(cfg, progress=False)
    assert len(study.directions) == 3 and study.best_trials
    report(cfg, study, tmp_path / "out")
    assert "Pareto front" in (tmp_path / "out" / "report.md").read_text()
    assert np.isfinite(load_study(cfg).best_trials[0].values[0])
