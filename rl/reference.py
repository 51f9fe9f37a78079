"""A latency reward relative to a reference policy's episode on the same seed (issue 27).

The latency reward is minus the request-seconds in the system over each step, and most of it comes from
arrivals no action changes: an episode with a burst pays more whatever the agent does. :class:`ReferenceReward`
plays a reference policy (a params file: the tuned scorer, say) on a copy of the env at every reset, so on the
same seed and the same arrivals, and adds back, over each step's stretch of simulated time, the request-seconds
the reference had in the system then. A step's reward is then how many request-seconds the agent saved against
the reference over that time (negative when it did worse), and the episode's return is the agent's latency
return minus the reference's: zero for an agent that acts as the reference does.
"""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import numpy as np

from servegym.engine import State
from servegym.policies import make_policy
from servegym.runner import env_profile, serving_env


class ReferenceReward(gym.Wrapper):
    """Rewards relative to ``policy`` (with ``params``) played on a copy of the env at each reset (a single
    engine, the latency reward)."""

    def __init__(self, env: gym.Env, policy: str, params: dict[str, Any] | None = None) -> None:
        super().__init__(env)
        self.policy, self.params = policy, dict(params or {})
        make_policy(policy, **self.params)  # a bad name or parameter fails here, not at the first reset
        self._arrival = self._end = np.zeros(0)
        self._seconds = 0.0

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        inner = serving_env(self.env)
        if inner.reward_name != "latency" or len(inner.cluster.engines) != 1:
            raise ValueError("ReferenceReward needs the latency reward on a single engine")
        self._reference_episode(obs)
        self._seconds = self.reference_seconds(inner.cluster.time)
        return obs, info

    def _reference_episode(self, obs: Any) -> None:
        """Play the reference from the reset state on a copy; keep each served request's time in the system."""
        twin = copy.deepcopy(self.env.unwrapped)
        reference = make_policy(self.policy, **self.params)
        reference.bind_profile(env_profile(twin))
        reference.reset()
        done = False
        while not done:
            obs, _, terminated, truncated, _ = twin.step(reference.act(obs))
            done = terminated or truncated
        log = serving_env(twin).cluster.log
        served = log.state != State.REJECTED
        end = serving_env(twin).cluster.time
        finish = np.where(log.state == State.FINISHED, log.finish_s, end)
        self._arrival, self._end = log.arrival_s[served], finish[served]

    def reference_seconds(self, until_s: float) -> float:
        """The reference's request-seconds in the system from the start until ``until_s``."""
        return float(np.clip(until_s - self._arrival, 0.0, self._end - self._arrival).sum())

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        seconds = self.reference_seconds(serving_env(self.env).cluster.time)
        reward += seconds - self._seconds
        self._seconds = seconds
        return obs, reward, terminated, truncated, info
