"""Shared fixtures: small hand-made workloads and envs."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import servegym
from servegym.workloads import FixedWorkload, RequestSpec


def fixed(arrival, prompt, output) -> FixedWorkload:
    return FixedWorkload(RequestSpec(np.asarray(arrival, dtype=float), np.asarray(prompt), np.asarray(output)))


def make(workload="low", max_episode_steps: int = 50_000, **kwargs) -> gym.Env:
    return gym.make(servegym.ENV_ID, workload=workload, max_episode_steps=max_episode_steps, **kwargs)


def admit_all(env: gym.Env) -> np.ndarray:
    return np.ones(env.unwrapped.queue_window, dtype=np.int64)


def no_action(env: gym.Env) -> np.ndarray:
    return np.zeros(env.unwrapped.queue_window, dtype=np.int64)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)
