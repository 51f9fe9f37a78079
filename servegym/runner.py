"""Run one policy through one env episode, with nothing but ``env.step``."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from servegym import ENV_ID
from servegym.backends import CalibratedBackend, Profile
from servegym.engine import STEP_FIELDS, EpisodeLog, State
from servegym.envs import MixtureEnv, ServingEnv
from servegym.envs.routing import RoutingEnv
from servegym.envs.tasks import TASKS, get_task
from servegym.metrics import summarize
from servegym.policies import Policy, deciding
from servegym.validation import positive_int


@dataclass
class EpisodeResult:
    log: EpisodeLog
    summary: dict[str, float]
    steps: int
    """Engine iterations the episode ran (one per ``step`` without the decision skip)."""
    truncated: bool
    total_reward: float


class IterationLimit(gym.Wrapper):
    """Gymnasium's ``TimeLimit`` counted in engine iterations: ``truncated`` once the episode has run
    ``max_iterations`` of them, however many one step advanced (``decision_steps``), so an episode with and
    without the decision skip ends at the same iteration."""

    def __init__(self, env: gym.Env, max_iterations: int) -> None:
        super().__init__(env)
        positive_int("max_iterations", max_iterations)
        self.max_iterations = max_iterations
        for inner in _serving_envs(env):
            inner.iteration_limit = self.max_iterations

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if serving_env(self.env).num_steps >= self.max_iterations:
            truncated = True
        return obs, reward, terminated, truncated, info


def _serving_envs(env: gym.Env) -> list[ServingEnv]:
    inner = env.unwrapped
    return list(inner.components.values()) if isinstance(inner, MixtureEnv) else [serving_env(env)]


def make_env(policy: Policy | None = None, max_episode_steps: int | None = None, apply_overrides: bool = True,
             skip_idle: bool | None = None, **env_kwargs: Any) -> gym.Env:
    """``gym.make`` the serving env with ``engine``/``pool`` settings, then the policy's own overrides on top.

    A policy's overrides are part of its definition (TWP's chunk size, flow control's LIFO eviction, the
    clairvoyant greedy packer's true lengths), so they win; change them through the policy's parameters. With
    ``apply_overrides=False`` the env is exactly the one the arguments describe (a benchmark's locked test track),
    and the policy only reads its profile.

    ``skip_idle`` (default: the policy's ``stateless``) turns on ``decision_steps``: a step runs through the
    iterations where nothing can be admitted, so a stateless policy is not asked what it would never change.
    The episode is the same iteration for iteration (``tests/test_decision_skip.py``); the episode limit
    (``max_episode_steps``, else the id's) then counts iterations (:class:`IterationLimit`), as it did steps.
    """
    if max_episode_steps is not None:
        positive_int("max_episode_steps", max_episode_steps)
    elif isinstance(env_kwargs.get("task"), str) and env_kwargs["task"] in TASKS:
        # A task's episodes run to its own limit (the id's 20,000 steps, unless the task says more).
        max_episode_steps = max(TASKS[env_kwargs["task"]].max_steps, gym.spec(ENV_ID).max_episode_steps)
    engine = dict(env_kwargs.pop("engine", None) or {})
    pool = dict(env_kwargs.pop("pool", None) or {})
    decision = _decision(env_kwargs)
    if policy is not None and policy.decision != decision:
        where = f"task {env_kwargs['task']!r}" if env_kwargs.get("task") is not None else "an env without a task"
        routing = sorted(name for name, task in TASKS.items() if task.decision == "route")
        hint = (f"run it on a routing task ({', '.join(routing)})" if policy.decision == "route"
                else f"pick one of {deciding(decision)}")
        raise ValueError(f"policy {policy.name!r} decides {policy.decision}, but {where} decides {decision}: {hint}")
    if policy is not None and apply_overrides:
        engine = {**engine, **policy.engine_overrides()}
        pool = {**pool, **policy.pool_overrides()}
        env_kwargs = {**policy.env_overrides(), **env_kwargs}
    skip = (policy is not None and policy.stateless) if skip_idle is None else bool(skip_idle)
    if decision == "route":
        skip = False  # the routing env steps once per arrival; its serving env skips what its admission allows
    if skip and not env_kwargs.get("decision_steps", True):
        skip = False  # the caller asked for one iteration a step
    if not skip:
        env = gym.make(ENV_ID, engine=engine, pool=pool, max_episode_steps=max_episode_steps, **env_kwargs)
    else:
        limit = gym.spec(ENV_ID).max_episode_steps if max_episode_steps is None else max_episode_steps
        env = gym.make(ENV_ID, engine=engine, pool=pool, max_episode_steps=-1,
                       **{**env_kwargs, "decision_steps": True})
        if limit is not None:
            env = IterationLimit(env, limit)
    if policy is not None:
        policy.bind_profile(env_profile(env))
    return env


def _decision(env_kwargs: dict[str, Any]) -> str:
    task = env_kwargs.get("task")
    return get_task(task).decision if task is not None else "admission"


def env_profile(env: gym.Env) -> Profile | None:
    """The latency profile of a serving env's calibrated backends; None for another backend or a mixture."""
    inner = env.unwrapped
    if isinstance(inner, RoutingEnv):
        inner = inner.serving
    if not isinstance(inner, ServingEnv):
        return None
    backend = inner.cluster.engines[0].backend
    return backend.profile if isinstance(backend, CalibratedBackend) else None


CHECKPOINT_STEPS = 256
"""Steps between calls of :func:`run_episode`'s ``checkpoint``."""


def run_episode(env: gym.Env, policy: Policy, seed: int, progress: bool = False,
                checkpoint: Callable[[], None] | None = None) -> EpisodeResult:
    """Reset with ``seed``, let ``policy`` act until the episode ends, and summarise it. ``checkpoint`` runs
    every :data:`CHECKPOINT_STEPS` steps (it may raise to abandon the episode, e.g. on a stop request)."""
    obs, _ = env.reset(seed=seed)
    policy.reset()
    bar = _progress_bar(env) if progress else None
    steps, total, terminated, truncated = 0, 0.0, False, False
    while not (terminated or truncated):
        obs, reward, terminated, truncated, info = env.step(policy.act(obs))
        steps += 1
        for r in info.get("iteration_rewards", (reward,)):  # in iteration order: the same float as step by step
            total += r
        if checkpoint is not None and steps % CHECKPOINT_STEPS == 0:
            checkpoint()
        if bar is not None and steps % 200 == 0:
            bar.set_postfix(t=f"{info['clock_s']:.1f}s", run=info["num_running"], wait=info["num_waiting"])
            bar.update(serving_env(env).num_steps - bar.n)
    if bar is not None:
        bar.close()
    inner = serving_env(env)
    # Iterations, not calls of step: the same count with and without the decision skip (an episode with
    # nothing to serve ends on one step that runs none).
    return EpisodeResult(inner.cluster.log, summarize(inner.cluster.log), max(steps, inner.num_steps), truncated,
                         total)


def serving_env(env: gym.Env) -> ServingEnv:
    inner = env.unwrapped
    if isinstance(inner, MixtureEnv):
        inner = inner.current
    if isinstance(inner, RoutingEnv):
        inner = inner.serving
    if not isinstance(inner, ServingEnv):
        raise TypeError(f"expected a ServingEnv, got {type(inner).__name__}")
    return inner


def _progress_bar(env: gym.Env):
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is optional: install servegym[cli]
        return None
    # disable=None: drawn only on a terminal (a log gets no stream of carriage returns).
    limit = env.max_iterations if isinstance(env, IterationLimit) else env.spec.max_episode_steps if env.spec \
        else None
    return tqdm(desc="iterations", unit="it", total=limit if limit and limit > 0 else None, leave=False,
                disable=None)


def write_summary(result: EpisodeResult, out_dir: str | Path, run: dict[str, Any]) -> Path:
    """Write ``summary.json`` (the episode's summary row: every metric of the registry by its name, NaN as null,
    ``episode_return`` the rewards' sum) and ``run.json`` (``run``: what produced it, with the package version)."""
    import json

    from servegym import __version__
    from servegym.metrics import METRICS

    out = Path(out_dir)
    values = {**result.summary, "episode_return": result.total_reward}
    row = {name: (None if math.isnan(float(values[name])) else float(values[name])) for name in METRICS}
    (out / "summary.json").write_text(json.dumps(row, indent=1) + "\n")
    (out / "run.json").write_text(json.dumps({**run, "servegym": __version__}, indent=1, default=str) + "\n")
    return out / "summary.json"


def write_csvs(log: EpisodeLog, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``requests.csv`` (one row per request) and ``steps.csv`` (one row per iteration)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    req_path, step_path = out / "requests.csv", out / "steps.csv"
    columns = {
        "request": np.arange(log.num_requests), "arrival_s": log.arrival_s, "num_prompt_tokens": log.num_prompt_tokens,
        "num_output_tokens": log.num_output_tokens, "output_lo": log.output_lo, "output_hi": log.output_hi,
        "state": [State(s).name.lower() for s in log.state], "admit_s": log.admit_s,
        "first_token_s": log.first_token_s, "finish_s": log.finish_s,
        "num_preemptions": log.num_preemptions, "reject_reason": log.reject_reason, "truncated": log.truncated,
        "container": log.container, "cold_start": log.cold_start, "load_wait_s": log.load_wait_s,
    }
    if log.prefix is not None:  # a workload with prefix chains: what each request found cached
        columns.update(cached_gpu_tokens=log.cached_gpu_tokens, cached_host_tokens=log.cached_host_tokens)
    with req_path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        writer.writerows(zip(*columns.values(), strict=True))
    with step_path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(STEP_FIELDS)
        writer.writerows(log.steps().tolist())
    return req_path, step_path
