"""Training tells the truth after any stop: Ctrl-C (130), SIGTERM (143) or a crash leaves ``config.json`` saying
``interrupted`` or ``failed`` with the steps done and the last checkpoint, no torn checkpoint, and no process.

The subprocess tests wait for what they can observe (a child process, a checkpoint file), never for a fixed
time; their deadlines are minutes, and each prints the time it measured. Every process they start is killed in
a ``finally``, with its whole session.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("stable_baselines3")

from servegym.rl.stopping import StopOnSignals, TrainingInterrupted
from servegym.rl.train import TrainConfig, latest_checkpoint, resume, train
from tests.conftest import live_processes

ROOT = Path(__file__).resolve().parents[1]
TINY = {"n_steps": 64, "batch_size": 64, "n_epochs": 1}
DEADLINE_S = 300.0
"""For anything a subprocess test waits on: generous, as a loaded machine (load 8 on 2 cores) needs."""


def train_command(out: Path) -> list[str]:
    """A run far longer than any test waits: it ends only by the signal the test sends."""
    return [sys.executable, "-m", "servegym.cli", "train", "--task", "memory-tight", "--timesteps", "1000000",
            "--n-envs", "2", "--max-episode-steps", "100", "--eval-freq", "1000000", "--eval-episodes", "1",
            "--checkpoint-freq", "128", "--hyperparams", json.dumps(TINY), "--out", str(out), "--quiet"]


def wait_until(what: str, predicate, proc: subprocess.Popen) -> float:
    """Poll until ``predicate()``; fail if the process ends first or the deadline passes. Returns the wait."""
    started = time.monotonic()
    while not predicate():
        if proc.poll() is not None:
            pytest.fail(f"train ended (status {proc.returncode}) before {what}: {proc.stderr.read()}")
        if time.monotonic() - started > DEADLINE_S:
            pytest.fail(f"no {what} after {DEADLINE_S:.0f} s")
        time.sleep(0.05)
    waited = time.monotonic() - started
    print(f"{what} after {waited:.1f} s")
    return waited


def kill_session(proc: subprocess.Popen) -> None:
    """The test's clean-up: whatever is left of the command's session dies."""
    for row in live_processes("sid", proc.pid):
        try:
            os.kill(int(row.split()[1]), signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.kill()
    proc.wait()


def stop_and_wait(proc: subprocess.Popen, sig: signal.Signals, group: bool) -> str:
    """Send ``sig`` (to the whole group, as Ctrl-C in a terminal does, or to the process, as ``kill`` does), wait
    for the exit and for every process of its session to be gone; return stderr."""
    sent = time.monotonic()
    (os.killpg if group else os.kill)(proc.pid, sig)
    _, err = proc.communicate(timeout=DEADLINE_S)
    print(f"exit {proc.returncode} {time.monotonic() - sent:.2f} s after {sig.name}")
    while live_processes("sid", proc.pid) and time.monotonic() - sent < DEADLINE_S:
        time.sleep(0.1)
    print(f"session empty {time.monotonic() - sent:.2f} s after {sig.name}")
    assert live_processes("sid", proc.pid) == [], "processes outlived the stopped run"
    return err


def run_config(out: Path) -> tuple[Path, dict]:
    [config] = out.glob("*/config.json")
    return config.parent, json.loads(config.read_text())


def test_sigterm_during_env_setup_exits_143_and_leaves_no_process(tmp_path):
    # Rule: a SIGTERM while SubprocVecEnv starts its workers stops them, the forkserver and the resource tracker
    # with the run (they outlived it by ~30 s on a loaded machine), and config.json records the stop.
    out = tmp_path / "out"
    proc = subprocess.Popen(train_command(out), cwd=ROOT, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_until("a child process (env set-up)", lambda: len(live_processes("sid", proc.pid)) > 1, proc)
        err = stop_and_wait(proc, signal.SIGTERM, group=False)
    finally:
        kill_session(proc)
    assert proc.returncode == 143, err
    run, config = run_config(out)
    assert config["status"] == "interrupted" and config["stopped_by"] == "SIGTERM", config
    assert config["timesteps_done"] == 0 and config["last_checkpoint"] is None  # stopped before learning
    assert f"interrupted by SIGTERM after 0 timesteps ({run / 'config.json'} says so)" in err


@pytest.mark.parametrize(("sig", "group", "status"), [(signal.SIGINT, True, 130), (signal.SIGTERM, False, 143)],
                         ids=["ctrl-c", "sigterm"])
def test_a_stop_while_learning_records_the_steps_and_checkpoint_and_resume_finishes(tmp_path, sig, group, status):
    # Rule: after a stop, config.json says interrupted, by which signal, the steps the model took and the last
    # checkpoint (whole: a resume loads it); the exit status is 128 + the signal.
    out = tmp_path / "out"
    proc = subprocess.Popen(train_command(out), cwd=ROOT, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_until("the first checkpoint", lambda: any(out.glob("*/checkpoints/model_vecnormalize_*.pkl")), proc)
        err = stop_and_wait(proc, sig, group=group)
    finally:
        kill_session(proc)
    assert proc.returncode == status, err
    run, config = run_config(out)
    assert config["status"] == "interrupted" and config["stopped_by"] == sig.name, config
    checkpoint = latest_checkpoint(run)
    assert config["last_checkpoint"] == checkpoint.relative_to(run).as_posix()
    steps = int(checkpoint.name.split("_")[1])
    assert steps >= 128 and steps <= config["timesteps_done"] < 1_000_000
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

    def signalled_while_saving(self) -> bool:
        if self.n_calls % self.save_freq == 0:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, before the files are written
        return real(self)

    monkeypatch.setattr(CheckpointCallback, "_on_step", signalled_while_saving)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(TrainingInterrupted) as stop:
        train(tiny(tmp_path), progress=False, subprocess=False)
    assert signal.getsignal(signal.SIGTERM) is before
    assert stop.value.exit_status == 143
    run, config = run_config(tmp_path)
    assert config["status"] == "interrupted" and config["timesteps_done"] == 128
    assert config["last_checkpoint"] == "checkpoints/model_128_steps.zip"
    assert (run / "checkpoints" / "model_vecnormalize_128_steps.pkl").is_file()
    assert stop.value.progress == {"timesteps_done": 128, "last_checkpoint": "checkpoints/model_128_steps.zip"}


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
        with pytest.raises(TrainingInterrupted) as first:
            with stop.saving():
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
