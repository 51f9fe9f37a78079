"""Optuna tuning: search spaces, a tiny study that beats bad defaults, resume after kill, shared studies."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

optuna = pytest.importorskip("optuna")

from servegym.cli import main  # noqa: E402
from servegym.policies import POLICIES, make_policy  # noqa: E402
from servegym.runner import make_env  # noqa: E402
from servegym.tuning import (  # noqa: E402
    TuneConfig,
    TuningError,
    best_params,
    load_study,
    make_storage,
    read_params,
    tune,
    write_params,
)
from servegym.tuning import study as study_module  # noqa: E402
from servegym.tuning.report import report  # noqa: E402
from servegym.tuning.stopping import StopOnSignals, TuningInterrupted  # noqa: E402
from tests.stop_helpers import DEADLINE_S, kill_session, wait_until  # noqa: E402

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
        env = make_env(policy, workload="low", strict_actions=True, max_episode_steps=60) \
            if policy.decision == "admission" else make_env(policy, task="cluster-routing", max_episode_steps=60)
        obs, _ = env.reset(seed=0)
        for _ in range(60):
            obs, _, terminated, truncated, _ = env.step(policy.act(obs))
            if terminated or truncated:
                break
        study.tell(trial, 0.0)


@pytest.mark.slow
def test_tiny_study_beats_a_clearly_bad_default(tmp_path):
    # Flow control's default b = 1 activation per step starves a 7.5 req/s load; tuning b must fix it.
    cfg = TuneConfig(policy="flow-control", workload="high", objective="cost", trials=12, seeds=1, eval_seeds=2,
                     storage=f"sqlite:///{tmp_path}/s.db", pruner="none", sampler_seed=0)
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
    """A ``servegym tune`` worker in a session of its own (so :func:`kill_session` can end it); its stderr goes to
    a temporary file, never a pipe a long run could fill."""
    return start([*SERVEGYM, "tune", "--policy", "flow-control", "--workload", "low", "--trials", str(trials),
                  "--seeds", "1", "--max-steps", "100", "--storage", storage, "--study", "shared", "--pruner", "none",
                  "--no-report", "--quiet", *extra])


def start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=tempfile.TemporaryFile(),
                            cwd=Path(__file__).parents[1], start_new_session=True)


def stderr_of(proc: subprocess.Popen) -> str:
    proc.stderr.seek(0)
    return proc.stderr.read().decode()


def wait_for(predicate, timeout=DEADLINE_S):
    wait_until("the awaited state", predicate, timeout=timeout)


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGKILL, -signal.SIGKILL), (signal.SIGTERM, 143),
                                             (signal.SIGINT, 130)])
@pytest.mark.slow
def test_resume_after_kill_keeps_every_completed_trial(tmp_path, sig, status):
    # Rule: a stopped worker keeps every completed trial and exits 128 + the signal (a clean stop leaves no trial
    # running); a new worker asking for more trials adds only the missing ones. Waits are on trial counts in storage,
    # with generous deadlines.
    storage = f"sqlite:///{tmp_path}/resume.db"
    proc = tune_process(storage, trials=1000)
    try:
        wait_until("4 completed trials", lambda: len(completed(storage, "shared")) >= 4, proc)
        proc.send_signal(sig)
        sent = time.monotonic()
        proc.wait(timeout=DEADLINE_S)
        print(f"exit {proc.returncode} {time.monotonic() - sent:.2f} s after {signal.Signals(sig).name}")
    finally:
        kill_session(proc)  # never a `tune --trials 1000` left running, whatever failed above
    # An interrupted run is not a success: the shell sees 128 + the signal, as for a process it killed.
    assert proc.returncode == status, stderr_of(proc)
    before = {t.number for t in completed(storage, "shared")}
    if sig != signal.SIGKILL:  # a clean stop leaves no trial marked running
        study = optuna.load_study(study_name="shared", storage=study_module.make_storage(storage))
        assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    again = tune_process(storage, trials=len(before) + 3)  # the interrupted (or killed) trial does not count
    try:
        assert again.wait(timeout=DEADLINE_S) == 0, stderr_of(again)
    finally:
        kill_session(again)
    after = {t.number for t in completed(storage, "shared")}
    assert before <= after and len(after) == len(before) + 3


def run_workers(storage: str, workers: int, trials: int, extra=()) -> list:
    procs = [tune_process(storage, trials=trials, extra=extra) for _ in range(workers)]
    try:
        for proc in procs:
            assert proc.wait(timeout=DEADLINE_S) == 0, stderr_of(proc)
    finally:
        for proc in procs:
            kill_session(proc)
    return completed(storage, "shared")


def distinct_params(trials: list) -> int:
    return len({tuple(sorted(t.params.items())) for t in trials})


@pytest.mark.slow
@pytest.mark.parametrize(("workers", "kind"), [(2, "journal"), (4, "journal"), (4, "sqlite")])
def test_parallel_workers_sample_distinct_parameters(tmp_path, workers, kind):
    # The README's recipe: N workers on one study, no seed given, all asking for the study's total. Each draws its
    # own sampler seed. (How many trials each worker ran depends on when it started, so only the total is pinned.)
    storage = f"journal:{tmp_path}/s.journal" if kind == "journal" else f"sqlite:///{tmp_path}/s.db"
    trials = run_workers(storage, workers, trials=5 * workers)
    assert len(trials) == 5 * workers
    ran = {t.user_attrs["worker"] for t in trials}
    assert 1 <= len(ran) <= workers
    assert len({t.user_attrs["sampler_seed"] for t in trials}) == len(ran)
    assert distinct_params(trials) == 5 * workers


def test_workers_given_one_seed_sample_in_lockstep(tmp_path):
    # The old default (every worker seed 0) wasted workers; the distinctness test above can see it. The second
    # worker runs after the first (so each runs exactly 3 of the study's 6 trials) and repeats its 3 points.
    storage = f"journal:{tmp_path}/s.journal"
    run_workers(storage, 1, trials=3, extra=("--sampler-seed", "0"))
    trials = run_workers(storage, 1, trials=6, extra=("--sampler-seed", "0"))
    assert len(trials) == 6 and distinct_params(trials) == 3


def test_an_explicit_seed_makes_one_worker_reproducible(tmp_path):
    runs = []
    for name in ("a", "b"):
        cfg = TuneConfig(policy="flow-control", workload="low", trials=4, seeds=1, max_steps=50, pruner="none",
                         storage=f"sqlite:///{tmp_path}/{name}.db", sampler_seed=123)
        runs.append([t.params for t in tune(cfg, progress=False).trials])
    assert runs[0] == runs[1] and len({p["activation_budget"] for p in runs[0]}) == 4


def test_the_cma_evolution_strategy_samples_a_study_reproducibly(tmp_path):
    # CMA-ES proposes from its own search distribution after a first independent trial: a seeded worker is
    # reproducible, and the study records the sampler; an unknown sampler is refused by name.
    runs = []
    for name in ("a", "b"):
        cfg = TuneConfig(policy="scorer", workload="low", trials=5, seeds=1, max_steps=50, pruner="none",
                         storage=f"sqlite:///{tmp_path}/{name}.db", sampler="cmaes", sampler_seed=7)
        study = tune(cfg, progress=False)
        runs.append([t.params for t in study.trials])
        assert type(study.sampler).__name__ == "CmaEsSampler"
    assert runs[0] == runs[1] and len({p["output_weight"] for p in runs[0]}) == 5
    with pytest.raises(ValueError, match="sampler must be one of"):
        TuneConfig(policy="scorer", workload="low", sampler="random")


def tune_args(storage: str, *extra: str) -> list[str]:
    return ["tune", "--workload", "low", "--seeds", "1", "--eval-seeds", "1", "--max-steps", "50", "--pruner", "none",
            "--storage", storage, "--study", "shared", "--quiet", *extra]


def test_a_study_refuses_another_policy_and_objective(tmp_path, capsys):
    storage = f"sqlite:///{tmp_path}/s.db"
    assert main(tune_args(storage, "--policy", "flow-control", "--trials", "2", "--no-report")) == 0
    assert main(tune_args(storage, "--policy", "twp", "--trials", "2", "--no-report")) == 2
    err = capsys.readouterr().err
    assert "error: study 'shared'" in err and "policy 'flow-control'" in err and "policy 'twp'" in err
    assert main(tune_args(storage, "--policy", "flow-control", "--objective", "cost", "--trials", "0")) == 2
    assert "objective 'goodput'" in capsys.readouterr().err
    study = optuna.load_study(study_name="shared", storage=make_storage(storage))
    assert len(study.trials) == 2 and all(set(t.params) == {"activation_budget"} for t in study.trials)
    assert study.user_attrs == {"policy": "flow-control", "workload": "low", "objective": "goodput",
                                "env_id": "servegym/Serving-v2"}
    assert main(tune_args(storage, "--policy", "flow-control", "--trials", "0", "--out", str(tmp_path / "r"))) == 0


def test_a_study_begun_on_an_older_env_is_refused(tmp_path):
    # A v1 study (identity recorded, no env id) holds trials scored on another env: resuming it under v2 would mix
    # them into a file stamped Serving-v2.
    storage = f"sqlite:///{tmp_path}/v1.db"
    old = optuna.create_study(study_name="shared", storage=make_storage(storage), direction="maximize")
    for key, value in {"policy": "flow-control", "workload": "low", "objective": "goodput"}.items():
        old.set_user_attr(key, value)
    old.optimize(lambda trial: POLICIES["flow-control"].search_space(trial)["activation_budget"], n_trials=1)
    with pytest.raises(TuningError, match=r"on an env before servegym/Serving-v2, not of .* on servegym/Serving-v2"):
        load_study(TuneConfig(policy="flow-control", workload="low", storage=storage, study_name="shared"))


def test_a_study_from_before_identities_is_checked_by_its_parameters(tmp_path):
    storage = f"sqlite:///{tmp_path}/old.db"
    old = optuna.create_study(study_name="shared", storage=make_storage(storage), direction="maximize")
    old.optimize(lambda trial: POLICIES["twp"].search_space(trial)["gain"], n_trials=2)  # no user attributes
    with pytest.raises(TuningError, match="not over policy 'flow-control'"):
        load_study(TuneConfig(policy="flow-control", workload="low", storage=storage, study_name="shared"))
    study = load_study(TuneConfig(policy="twp", workload="low", storage=storage, study_name="shared"))
    assert study.user_attrs["policy"] == "twp"


@pytest.mark.parametrize(("setup", "args", "message"), [
    (None, ("--storage", "nonsense", "--trials", "1"), "cannot open Optuna storage 'nonsense'"),
    (None, ("--storage", "foo://host/db", "--trials", "1"), "cannot open Optuna storage 'foo://host/db'"),
    ("corrupt.db", ("--trials", "1"), "file is not a database"),
    ("corrupt.journal", ("--trials", "1"), "cannot open Optuna storage 'journal:"),
    (None, ("--trials", "0"), "no study storage at"),
    (None, ("--trials", "0", "--no-report"), "nothing to do"),
    (None, ("--storage", "sqlite:///:memory:", "--trials", "1"), "is an in-memory database"),
])
def test_bad_storage_and_trial_counts_give_one_clear_line(tmp_path, capsys, setup, args, message):
    storage = f"sqlite:///{tmp_path}/s.db"
    if setup:
        (tmp_path / setup).write_bytes(b"this is not a study\x00\x01\n{nor json\n" * 50)
        storage = f"journal:{tmp_path / setup}" if setup.endswith("journal") else f"sqlite:///{tmp_path / setup}"
    assert main(tune_args(storage, "--policy", "flow-control", *args)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_a_storage_that_cannot_be_opened_is_named_with_its_password_masked():
    with pytest.raises(TuningError) as caught:
        make_storage("postgresql+nosuchdriver://u:s3cret@h/db")  # no such SQLAlchemy dialect: fails offline
    message = str(caught.value)
    assert message.startswith("cannot open Optuna storage 'postgresql+nosuchdriver://u:***@h/db' (NoSuchModuleError")
    assert "s3cret" not in message


def test_no_completed_trial_to_report_is_a_clear_error(tmp_path, capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(study_module, "evaluate", broken)
    storage = f"sqlite:///{tmp_path}/s.db"
    assert main(tune_args(storage, "--policy", "flow-control", "--trials", "1", "--no-report")) == 0
    assert main(tune_args(storage, "--policy", "flow-control", "--trials", "0", "--out", str(tmp_path / "r"))) == 2
    assert "no completed trial to report on" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


KILL_MID_TRIAL = """
import os, signal, sys
from servegym.tuning import TuneConfig, tune, study
study.evaluate = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)
tune(TuneConfig(policy="flow-control", workload="low", trials=1, seeds=1, storage=sys.argv[1], study_name="shared",
                heartbeat_s=1), progress=False)
"""


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_a_trial_of_a_killed_worker_is_failed_on_resume(tmp_path, kind):
    storage = f"journal:{tmp_path}/s.journal" if kind == "journal" else f"sqlite:///{tmp_path}/s.db"
    dead = subprocess.run([sys.executable, "-c", KILL_MID_TRIAL, storage], cwd=Path(__file__).parents[1])
    assert dead.returncode == -signal.SIGKILL
    running = optuna.trial.TrialState.RUNNING
    assert [t.state for t in optuna.load_study(study_name="shared", storage=make_storage(storage)).trials] == [running]
    cfg = TuneConfig(policy="flow-control", workload="low", storage=storage, study_name="shared")
    assert [t.state for t in load_study(cfg).trials] == [optuna.trial.TrialState.FAIL]  # its pid is gone


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_a_trial_silent_past_the_heartbeat_grace_is_failed(tmp_path):
    # A worker on another host: no pid to check, so Optuna's heartbeat (every 1 s, 2 s grace) decides.
    cfg = TuneConfig(policy="flow-control", workload="low", storage=f"sqlite:///{tmp_path}/s.db", study_name="shared",
                     heartbeat_s=1)
    storage = make_storage(cfg.storage_url())
    trial = load_study(cfg).ask()
    trial.set_user_attr("worker", "another-host:1")
    storage.record_heartbeat(storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name("shared"), trial.number))
    assert load_study(cfg).trials[0].state == optuna.trial.TrialState.RUNNING  # heartbeat fresh
    time.sleep(2.5)  # past the grace period; under load the check may need a little longer to see it
    wait_for(lambda: load_study(cfg).trials[0].state == optuna.trial.TrialState.FAIL, timeout=20.0)


def test_a_journal_trial_of_a_live_worker_stays_running(tmp_path):
    cfg = TuneConfig(policy="flow-control", workload="low", storage=f"journal:{tmp_path}/s.journal")
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        trial = load_study(cfg).ask()
        trial.set_user_attr("worker", f"{socket.gethostname()}:{worker.pid}")
        assert load_study(cfg).trials[0].state == optuna.trial.TrialState.RUNNING
    finally:
        worker.kill()
        worker.wait()
    assert load_study(cfg).trials[0].state == optuna.trial.TrialState.FAIL


def test_params_file_round_trip_and_errors(tmp_path):
    write_params("twp", {"initial_window": 900.0}, tmp_path / "p.json")
    assert read_params(tmp_path / "p.json") == ("twp", {"initial_window": 900.0})
    (tmp_path / "bad.json").write_text("{\"params\": 3}")
    with pytest.raises(ValueError, match="expected"):
        read_params(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="no search space"):
        TuneConfig(policy="fcfs", workload="low")


def test_reporting_on_a_missing_study_creates_nothing(tmp_path):
    storage = f"sqlite:///{tmp_path}/p.db"
    make_storage(storage)  # an Optuna database without that study
    with pytest.raises(TuningError, match="no study 'nope'"):
        load_study(TuneConfig(policy="twp", workload="low", storage=storage, study_name="nope"), create=False)
    assert optuna.get_all_study_names(make_storage(storage)) == []


@pytest.mark.slow
def test_pareto_objective_reports_a_front(tmp_path):
    cfg = TuneConfig(policy="twp", workload="low", objective="pareto", trials=6, seeds=1, eval_seeds=1,
                     storage=f"sqlite:///{tmp_path}/p.db", sampler_seed=0)
    study = tune(cfg, progress=False)
    assert len(study.directions) == 3 and study.best_trials
    report(cfg, study, tmp_path / "out")
    assert "Pareto front" in (tmp_path / "out" / "report.md").read_text()
    assert np.isfinite(load_study(cfg).best_trials[0].values[0])


def test_a_signal_asks_for_a_stop_and_a_second_stops_at_once():
    before = signal.getsignal(signal.SIGTERM)
    with StopOnSignals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here and raises nothing
        assert stop.signum == signal.SIGTERM
        with pytest.raises(TuningInterrupted) as first:
            stop.checkpoint()
        assert first.value.exit_status == 143
        with pytest.raises(TuningInterrupted):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1.0)
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_signal_mid_trial_prunes_that_trial_and_keeps_the_finished_ones(tmp_path, monkeypatch):
    calls = {"n": 0}
    real = study_module.evaluate

    def interrupted_in_the_third_episode(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # trial 1, first of its two episodes: the run stops before the second
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(study_module, "evaluate", interrupted_in_the_third_episode)
    cfg = TuneConfig(policy="flow-control", workload="low", trials=5, seeds=2, max_steps=50, pruner="none",
                     storage=f"sqlite:///{tmp_path}/s.db")
    with pytest.raises(TuningInterrupted) as stop:
        tune(cfg, progress=False)
    assert stop.value.exit_status == 130 and calls["n"] == 3
    trials = load_study(cfg).trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED]
    assert trials[1].user_attrs[study_module.NOT_COUNTED] == "stopped by SIGINT"
    assert study_module.finished_trials(load_study(cfg)) == 1


def test_a_stop_request_reaches_inside_an_episode():
    # Rule: tuning's episodes run the stop check every CHECKPOINT_STEPS steps, so a stop need not wait for the end
    # of a long episode (this one would run 1000 steps).
    calls = []

    def stop_now() -> None:
        calls.append(True)
        raise TuningInterrupted(signal.SIGINT)

    workload = study_module.make_workload("low")
    with pytest.raises(TuningInterrupted):
        study_module.evaluate("flow-control", {}, workload, [0], 1000, checkpoint=stop_now)
    assert calls == [True]


@pytest.mark.slow
def test_sigint_stops_a_long_episode_before_its_end(tmp_path):
    # Rule: the stop checks within an episode, not only between them. A serverless-burst episode of TWP runs for
    # tens of seconds: a SIGINT inside it leaves its trial PRUNED with no reported value (a stop that waited for the
    # episode's end would have reported the episode). Observable state, not a timing: it holds on a loaded machine.
    storage = f"sqlite:///{tmp_path}/long.db"
    study = "twp-serverless-burst-return"
    cmd = [sys.executable, "-m", "servegym.cli", "tune", "--policy", "twp", "--task", "serverless-burst",
           "--objective", "return", "--trials", "5", "--seeds", "1", "--storage", storage, "--no-report", "--quiet"]
    proc = start(cmd)
    try:
        wait_until("a running trial", lambda: Path(f"{tmp_path}/long.db").is_file() and running(storage, study), proc)
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        proc.wait(timeout=DEADLINE_S)
        print(f"exit {proc.returncode} {time.monotonic() - sent:.2f} s after SIGINT")
    finally:
        kill_session(proc)
    assert proc.returncode == 130, stderr_of(proc)
    trials = optuna.load_study(study_name=study, storage=study_module.make_storage(storage)).trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.PRUNED] and trials[0].intermediate_values == {}


def running(storage: str, name: str) -> bool:
    try:
        study = optuna.load_study(study_name=name, storage=study_module.make_storage(storage))
    except Exception:  # not created yet
        return False
    return any(t.state == optuna.trial.TrialState.RUNNING for t in study.trials)


def test_workers_racing_to_create_the_tables_retry_but_real_schema_errors_do_not(monkeypatch):
    # PostgreSQL reports two workers creating Optuna's tables at once as ProgrammingError (DuplicateTable): the
    # storage retries it; a ProgrammingError of another kind is raised at once.
    import optuna
    from sqlalchemy.exc import ProgrammingError

    from servegym.tuning import storage

    calls = []

    def flaky(url, **kwargs):
        calls.append(url)
        if len(calls) == 1:
            raise ProgrammingError("CREATE TABLE studies", {}, Exception('relation "studies" already exists'))
        return "opened"

    monkeypatch.setattr(optuna.storages, "RDBStorage", flaky)
    assert storage._rdb_storage("postgresql://x/db", None) == "opened" and len(calls) == 2

    def broken(url, **kwargs):
        raise ProgrammingError("SELECT", {}, Exception('permission denied for table studies'))

    monkeypatch.setattr(optuna.storages, "RDBStorage", broken)
    with pytest.raises(ProgrammingError, match="permission denied"):
        storage._rdb_storage("postgresql://x/db", None)
