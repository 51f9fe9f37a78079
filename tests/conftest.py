"""Shared fixtures: small hand-made workloads and envs."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import gymnasium as gym
import numpy as np
import pytest

import servegym
from servegym.workloads import FixedWorkload, RequestSpec

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module, registered in ``sys.modules`` (where its dataclasses look their module
    up), with ``benchmarks/`` importable while it loads (a script imports its neighbours)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


def fixed(arrival, prompt, output) -> FixedWorkload:
    return FixedWorkload(RequestSpec(np.asarray(arrival, dtype=float), np.asarray(prompt), np.asarray(output)))


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C as a terminal gives it, whatever started pytest: a job started in the background of a non-interactive
    shell inherits SIGINT ignored, and then neither this process's stop handlers (they leave an ignored signal
    ignored) nor the children that the stop tests interrupt would see the SIGINT those tests send. A Python handler
    resets to the default action across exec, so every child starts with Ctrl-C's default too."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True, scope="session")
def sb3_logs_in_tmp(tmp_path_factory: pytest.TempPathFactory):
    """Stable-Baselines3 makes an empty ``SB3-<time>`` folder in the system's temp directory for every ``learn()``
    without a log folder; the tests' go into pytest's own temp directory instead, which pytest prunes."""
    before = os.environ.get("SB3_LOGDIR")
    os.environ["SB3_LOGDIR"] = str(tmp_path_factory.mktemp("sb3"))
    yield
    if before is None:
        os.environ.pop("SB3_LOGDIR", None)
    else:
        os.environ["SB3_LOGDIR"] = before


PAPER = "paper-v100-llama3.2-3b"
"""The profile hand-computed expectations in the tests use (l_min 43 ms, B0 8, 8 s cold start)."""


def make(workload="low", max_episode_steps: int = 50_000, **kwargs) -> gym.Env:
    """The env on the paper profile (unless ``profile=`` says otherwise), whose numbers the tests compute by hand."""
    kwargs.setdefault("profile", PAPER)
    return gym.make(servegym.ENV_ID, workload=workload, max_episode_steps=max_episode_steps, **kwargs)


def admit_all(env: gym.Env) -> np.ndarray:
    return np.ones(env.unwrapped.queue_window, dtype=np.int64)


def no_action(env: gym.Env) -> np.ndarray:
    return np.zeros(env.unwrapped.queue_window, dtype=np.int64)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def flat_profile(alpha_s: float = 0.0, saturation_batch: int = 10**6, num_kv_blocks: int = 12_000,
                 block_size: int = 16, prefill_s_per_token: float = 0.0):
    """A test profile: l_min = 43 ms, optional slope beyond B0, no prefill cost unless asked."""
    from servegym.backends import LatencyModel, Profile

    latency = LatencyModel(l_min_s=0.043, saturation_batch=saturation_batch, alpha_s=alpha_s,
                           prefill_s_per_token=prefill_s_per_token)
    return Profile("test", latency, num_kv_blocks, block_size, 0.0,
                   {"hardware": "none", "model": "none", "method": "test fixture", "date": "2026-11-29"})


def live_processes(column: str, value: int) -> list[str]:
    """Live processes whose ``ps`` column (``pgid``: process group, ``sid``: session) is ``value``; zombies,
    already dead and waiting to be reaped, are left out. A command's Ray workers sit in process groups of their
    own but in its session."""
    out = subprocess.run(["ps", "-eww", "-o", f"{column}=,pid=,stat=,args="], capture_output=True, text=True,
                         check=True).stdout
    rows = [line.split(maxsplit=3) for line in out.splitlines()]
    return [" ".join(row) for row in rows if int(row[0]) == value and not row[2].startswith("Z")]
