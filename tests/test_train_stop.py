"""Training tells the truth after any stop: Ctrl-C (130), SIGTERM (143) or a crash leaves ``config.json`` saying
``interrupted`` or ``failed`` with the steps done and the last checkpoint, no torn checkpoint, and no process.

The subprocess tests wait for what they can observe (a child process, a checkpoint file), never for a fixed
time (:mod:`tests.stop_helpers`); every process they start dies in a ``finally``, with its whole session.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("stable_baselines3")

from servegym.rl.stopping import StopOnSignals, TrainingInterrupted
from servegym.rl.train import TrainConfig, latest_checkpoint, resume, train
from tests.conftest import live_processes
from tests.stop_helpers import DEADLINE_S, kill_session, wait_for_exit, wait_until, wait_until_gone

ROOT = Path(__file__).resolve().parents[1]
TINY = {"n_steps": 64, "batch_size": 64, "n_epochs": 1}


def env_worker(args: str) -> bool:
    """Whether a command line is an env worker's or the forkserver's (multiprocessing's children), not the resource
    tracker's, which may start before the signal handlers, as may a git run for the provenance."""
    return "multiprocessing" in args and "resource_tracker" not in args


def train_command(out: Path, vec_env: str = "subprocess") -> list[str]:
    """A run far longer than any test waits: it ends only by the signal the test sends (its envs in worker
    processes unless ``vec_env="native"``)."""
    return [sys.executable, "-m", "servegym.cli", "train", "--task", "memory-tight", "--timesteps", "1000000",
            "--n-envs", "2", "--vec-env", vec_env, "--max-episode-steps", "100", "--eval-freq", "1000000",
            "--eval-episodes", "1",
            "--checkpoint-freq", "128", "--hyperparams", json.dumps(TINY), "--out", str(out), "--quiet"]


def start_training(out: Path, vec_env: str = "subprocess") -> subprocess.Popen:
    return subprocess.Popen(train_command(out, vec_env), cwd=ROOT, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def stop_and_wait(proc: subprocess.Popen, sig: signal.Signals, group: bool) -> str:
    """Send ``sig`` (to the whole group, as Ctrl-C in a terminal does, or to the process, as ``kill`` does), wait
    for the exit and for every process of its session to be gone; return stderr."""
    sent = time.monotonic()
    (os.killpg if group else os.kill)(proc.pid, sig)
    _, err = wait_for_exit(proc, sent)
    wait_until_gone("sid", proc.pid, sent)
    return err


def run_config(out: Path) -> tuple[Path, dict]:
    [config] = out.glob("*/config.json")
    return config.parent, json.loads(config.read_text())


def test_sigterm_during_env_setup_exits_143_and_leaves_no_process(tmp_path):
    # Rule: a SIGTERM while SubprocVecEnv starts its workers stops them, the forkserver and the resource tracker
    # with the run (they outlived it by ~30 s on a loaded machine), and config.json records the stop.
    out = tmp_path / "out"
    proc = start_training(out)
    try:
        # An env worker, not any child: the run's provenance runs git before the signal handlers are installed.
        wait_until("an env worker (env set-up)",
                   lambda: any(env_worker(row) for row in live_processes("sid", proc.pid)), proc)
        err = stop_and_wait(proc, signal.SIGTERM, group=False)
    finally:
        kill_session(proc)
    assert proc.returncode == 143, err
    run, config = run_config(out)
    assert config["status"] == "interrupted" and config["stopped_by"] == "SIGTERM", config
    assert config["interrupted"] is True and config["timesteps"] == 1_000_000
    assert config["timesteps_done"] == 0 and config["last_checkpoint"] is None  # stopped before learning
    assert not (run / "checkpoints").exists()  # nothing was learned, so nothing to keep
    assert (f"interrupted by SIGTERM after 0 timesteps ({run / 'config.json'} says so); continue with: servegym "
            f"train --resume {run} (no step was taken yet: it starts over)") in err


@pytest.mark.parametrize(("sig", "group", "status", "vec_env"),
                         [(signal.SIGINT, True, 130, "native"), (signal.SIGTERM, False, 143, "subprocess"),
                          (signal.SIGINT, True, 130, "sharded")],
                         ids=["ctrl-c-native", "sigterm-subprocess", "ctrl-c-sharded"])
def test_a_stop_while_learning_records_the_steps_and_checkpoint_and_resume_finishes(tmp_path, sig, group, status,
                                                                                    vec_env):
    # Rule: after a stop, config.json says interrupted, by which signal, the steps the model took and the last
    # checkpoint (whole: a resume loads it); the exit status is 128 + the signal; with the envs in this process
    # or in workers.
    out = tmp_path / "out"
    proc = start_training(out, vec_env)
    try:
        wait_until("the first checkpoint", lambda: any(out.glob("*/checkpoints/model_vecnormalize_*.pkl")), proc)
        err = stop_and_wait(proc, sig, group=group)
    finally:
        kill_session(proc)
    assert proc.returncode == status, err
    run, config = run_config(out)
    assert config["status"] == "interrupted" and config["stopped_by"] == sig.name, config
    assert config["interrupted"] is True
    checkpoint = latest_checkpoint(run)
    assert config["last_checkpoint"] == checkpoint.relative_to(run).as_posix()
    steps = int(checkpoint.name.split("_")[1])
    # The stop saved the steps taken as the latest checkpoint, not only the last periodic one (every 128 steps).
    assert steps == config["timesteps_done"] and 128 <= steps < 1_000_000
    assert (run / "checkpoints" / f"model_vecnormalize_{steps}_steps.pkl").is_file()
    assert not list(run.glob("checkpoints/*.tmp"))
    assert f"continue with: servegym train --resume {run}" in err
    config["timesteps"] = steps + 128  # finish soon after the checkpoint
    (run / "config.json").write_text(json.dumps(config))
    resume(run, progress=False, subprocess=False)
    _, after = run_config(out)
    assert after["status"] == "finished" and after["timesteps_done"] == steps + 128 and after["resumed_from"] == steps
    assert "stopped_by" not in after and after["last_checkpoint"] == f"checkpoints/model_{steps + 128}_steps.zip"


def tiny(tmp_path, **kw) -> TrainConfig:
    base = dict(algo="ppo", mode="count", task="memory-tight", timesteps=256, n_envs=2, max_episode_steps=100,
                eval_freq=10_000, eval_episodes=1, checkpoint_freq=128, hyperparams=TINY, out=str(tmp_path))
    return TrainConfig(**{**base, **kw})


def test_a_signal_during_a_checkpoint_waits_for_the_whole_checkpoint(tmp_path, monkeypatch):
    # Rule: a first signal never tears a checkpoint; the run stops right after it, recording it as the last.
    from stable_baselines3.common.callbacks import CheckpointCallback

    real = CheckpointCallback._on_step
    signalled, saved = [], []

    def signalled_while_saving(self) -> bool:
        if self.n_calls % self.save_freq == 0:
            signalled.append(self.num_timesteps)
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, before the files are written
        result = real(self)
        saved.append(self.num_timesteps)
        return result

    monkeypatch.setattr(CheckpointCallback, "_on_step", signalled_while_saving)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(TrainingInterrupted) as stop:
        train(tiny(tmp_path), progress=False, subprocess=False)
    assert signal.getsignal(signal.SIGTERM) is before
    assert stop.value.exit_status == 143
    run, config = run_config(tmp_path)
    assert config["status"] == "interrupted" and config["stopped_by"] == "SIGTERM"
    assert config["timesteps_done"] == 128 and config["last_checkpoint"] == "checkpoints/model_128_steps.zip"
    assert (run / "checkpoints" / "model_vecnormalize_128_steps.pkl").is_file()
    assert stop.value.progress == {"timesteps_done": 128, "last_checkpoint": "checkpoints/model_128_steps.zip"}
    # The save the signal landed in ran to its end (the stop's own checkpoint, written after, has the same name:
    # only this tells a finished save from one cut short and written again).
    assert signalled == [128] and saved[-1] == 128
    monkeypatch.setattr(CheckpointCallback, "_on_step", real)
    resume(run, progress=False, subprocess=False)  # the whole checkpoint loads; the record is of this call
    _, after = run_config(tmp_path)
    assert after["status"] == "finished" and after["timesteps_done"] == 256 and after["resumed_from"] == 128
    assert "stopped_by" not in after and after["last_checkpoint"] == "checkpoints/model_256_steps.zip"


def child_processes() -> dict[int, str]:
    """This process's children (pid -> command line), the process-wide resource tracker left out: multiprocessing
    starts it once and it ends with this process."""
    out = subprocess.run(["ps", "-ww", "-o", "pid=,stat=,args=", "--ppid", str(os.getpid())], capture_output=True,
                         text=True).stdout
    rows = [line.split(maxsplit=2) for line in out.splitlines()]
    return {int(pid): args for pid, stat, args in rows
            if not stat.startswith("Z") and "resource_tracker" not in args and not args.startswith("ps ")}


def test_a_stop_during_env_setup_ends_every_worker_it_started(tmp_path):
    # Rule: TrainingInterrupted leaves no process this call started: no worker and no forkserver (workers are
    # spawned children, each terminated) -- checked at once, without waiting for them to notice; multiprocessing
    # has reaped each worker it registered (none is left "alive" in its books, to be signalled by pid later).
    import multiprocessing

    before = child_processes()
    registered = set(multiprocessing.active_children())
    sent: list[float] = []

    def sigterm_at_setup() -> None:
        deadline = time.monotonic() + DEADLINE_S
        # An env worker, not any new child: a git run for the provenance comes first, before the handlers.
        while not any(env_worker(args) for pid, args in child_processes().items() if pid not in before) \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGTERM)  # always sent: the run below ends only by it

    threading.Thread(target=sigterm_at_setup, daemon=True).start()
    try:
        with pytest.raises(TrainingInterrupted):
            train(tiny(tmp_path, timesteps=1_000_000, vec_env="subprocess"), progress=False, subprocess=True)
        print(f"stopped {time.monotonic() - sent[0]:.2f} s after SIGTERM")
        left = {pid: args for pid, args in child_processes().items() if pid not in before}
        assert left == {}, "processes the stopped call started are still running"
        assert set(multiprocessing.active_children()) <= registered, "a worker was not joined by multiprocessing"
    finally:
        for pid in set(child_processes()) - set(before):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    _, config = run_config(tmp_path)
    assert config["status"] == "interrupted" and config["timesteps_done"] == 0


def test_a_crash_while_learning_is_recorded_as_failed_with_the_steps_done(tmp_path, monkeypatch):
    # Rule: an error records status failed, the error and the steps done, and propagates unchanged.
    from servegym.rl import evaluation

    def broken(*args, **kwargs):
        raise FloatingPointError("nan in the policy")

    monkeypatch.setattr(evaluation, "evaluate", broken)
    with pytest.raises(FloatingPointError):
        train(tiny(tmp_path, eval_freq=128), progress=False, subprocess=False)
    _, config = run_config(tmp_path)
    assert config["status"] == "failed" and config["error"] == "FloatingPointError: nan in the policy"
    assert config["timesteps_done"] == 128 and config["last_checkpoint"] == "checkpoints/model_128_steps.zip"


def test_a_first_signal_in_a_saving_block_waits_for_its_end_and_a_second_does_not():
    before = signal.getsignal(signal.SIGINT)
    with StopOnSignals() as stop:
        with pytest.raises(TrainingInterrupted) as first, stop.saving():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
            written = True  # the block goes on
        assert written and first.value.signal_name == "SIGINT" and first.value.exit_status == 130
        assert stop.pending is None  # raised once
        with pytest.raises(TrainingInterrupted) as second, stop.saving():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100):
                time.sleep(0.01)
            pytest.fail("the second signal did not stop the block")
        assert second.value.exit_status == 143
        with pytest.raises(TrainingInterrupted):  # outside a saving block: at once
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100):
                time.sleep(0.01)
    assert signal.getsignal(signal.SIGINT) is before


def test_an_ignored_signal_stays_ignored():
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with StopOnSignals():
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_spawned_child_multiprocessing_never_registered_is_found_and_ended():
    # Rule: a signal inside Process.start() can leave a spawned worker that active_children() does not know; the
    # stop finds this process's spawned children by their command line and ends them.
    from servegym.rl.stopping import end_processes, spawned_children

    before = spawned_children()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "--multiprocessing-fork"])
    try:
        wait_until("the child to show in /proc", lambda: child.pid in spawned_children())
        assert spawned_children() - before == {child.pid}
        end_processes({child.pid}, grace_s=5.0)
        assert child.pid not in spawned_children()
        assert not Path(f"/proc/{child.pid}").exists() or child.poll() is not None
    finally:
        with contextlib.suppress(ProcessLookupError):
            child.kill()


def sigterm_at_step(monkeypatch, steps: int) -> None:
    """Send this process SIGTERM from the evaluation callback (called after every vectorised step) once the model
    has taken ``steps`` steps: a stop at a known step, between two periodic checkpoints."""
    from servegym.rl.evaluation import SeedListEval

    real = SeedListEval._on_step

    def on_step(self) -> bool:
        if self.num_timesteps == steps:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises here, in the main thread
        return real(self)

    monkeypatch.setattr(SeedListEval, "_on_step", on_step)


def test_a_stop_before_the_first_checkpoint_keeps_the_steps_and_resume_reaches_the_total(tmp_path, monkeypatch,
                                                                                          capsys):
    # Rule (issue 48): a stop saves the model and its statistics at the steps taken, so a run stopped before its
    # first periodic checkpoint resumes from there (not from zero, not refused) and finishes its timesteps.
    from stable_baselines3 import PPO

    from servegym.cli import main

    sigterm_at_step(monkeypatch, 130)  # 65 steps of 2 envs: in the second rollout of 64 x 2 = 128, no checkpoint yet
    with pytest.raises(TrainingInterrupted) as stop:
        train(tiny(tmp_path, checkpoint_freq=10_000), progress=False, subprocess=False)
    assert stop.value.exit_status == 143
    run, config = run_config(tmp_path)
    assert (config["status"], config["interrupted"], config["stopped_by"]) == ("interrupted", True, "SIGTERM")
    assert (config["timesteps_done"], config["timesteps"]) == (130, 256)
    assert config["last_checkpoint"] == "checkpoints/model_130_steps.zip"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["model_130_steps.zip",
                                                                       "model_vecnormalize_130_steps.pkl"]
    assert PPO.load(run / "checkpoints" / "model_130_steps.zip", device="cpu").num_timesteps == 130
    stats = pickle.loads((run / "checkpoints" / "model_vecnormalize_130_steps.pkl").read_bytes())
    # The statistics of the stop, not of the start: VecNormalize's count starts at 1e-4 and grows by one per
    # observation, 2 at the reset and 2 per vectorised step.
    assert stats.obs_rms["engine"].count == pytest.approx(1e-4 + 2 + 130)
    assert "continue with: servegym train --resume" in stop.value.message()

    monkeypatch.undo()
    assert main(["train", "--resume", str(run), "--quiet"]) == 0
    assert f"resuming {run} from model_130_steps.zip" in capsys.readouterr().out
    _, after = run_config(tmp_path)
    # From 130 steps to the 256 asked, in whole rollouts of 128: one rollout, 130 -> 258 (from zero it would end at
    # 256, and 256 more steps at 386).
    assert (after["status"], after["interrupted"], after["resumed_from"]) == ("finished", False, 130)
    assert after["timesteps_done"] == 258 and "stopped_by" not in after
    assert PPO.load(run / "model.zip", device="cpu").num_timesteps == 258


def test_a_stop_before_learning_keeps_no_checkpoint_and_resume_starts_over(tmp_path, monkeypatch):
    # Rule: a stop before the model took a step has nothing to keep; the run's record says so and a resume trains
    # it from the start in the same folder (it is never a dead end).
    import servegym.rl.train as train_module

    real = train_module.policy_for

    def stopped(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(train_module, "policy_for", stopped)
    with pytest.raises(TrainingInterrupted) as stop:
        train(tiny(tmp_path), progress=False, subprocess=False)
    assert stop.value.exit_status == 130
    run, config = run_config(tmp_path)
    assert (config["status"], config["stopped_by"], config["timesteps_done"]) == ("interrupted", "SIGINT", 0)
    assert config["last_checkpoint"] is None and latest_checkpoint(run) is None
    with pytest.raises(ValueError, match="already holds a run; continue it with --resume"):
        train(tiny(tmp_path), progress=False, subprocess=False)
    monkeypatch.undo()
    resume(run, progress=False, subprocess=False)
    _, after = run_config(tmp_path)
    assert (after["status"], after["timesteps_done"], after["interrupted"]) == ("finished", 256, False)
    assert "resumed_from" not in after and "stopped_by" not in after  # a fresh start: 0 -> 128 -> 256


def test_resuming_a_finished_run_is_refused_and_a_failed_resume_keeps_the_record(tmp_path, monkeypatch):
    import servegym.rl.train as train_module

    run = tmp_path / "r"
    run.mkdir()
    record = {"algo": "ppo", "task": "memory-tight", "timesteps": 256, "status": "finished", "timesteps_done": 256}
    (run / "config.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="finished its 256 timesteps already"):
        resume(run, progress=False)
    # An interrupted run with no checkpoint starts over; when that start fails, its record is left as it was.
    record.update(status="interrupted", timesteps_done=0, stopped_by="SIGTERM")
    (run / "config.json").write_text(json.dumps(record))

    def broken(*args, **kwargs):
        raise ValueError("no policy today")

    monkeypatch.setattr(train_module, "policy_for", broken)
    with pytest.raises(ValueError, match="no policy today"):
        resume(run, progress=False, subprocess=False)
    assert json.loads((run / "config.json").read_text()) == record
