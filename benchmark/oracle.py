"""The oracle: a clairvoyant rollout planner over a frozen set of base policies, the board's fixed 100.

It plans on copies of the task's env, so it knows every future arrival and every true output length (the
engine's, whatever the task reveals to policies). Its *base policies* are frozen per board version
(:data:`FROZEN_BASES`: the hand-coded policies at their default parameters, or every router on a routing task, and
the task's tuned parameter sets frozen in :data:`TUNED_BASES`),
never the board's other contestants, so its score does not move when a contestant joins and can anchor the
normalized scores. It is the best the search found, not the optimum: a policy tuned since, or a trained agent, may
beat it on a seed, and the leaderboard says so. On one seed:

1. **Sweep.** From the reset, each base policy plays the whole episode on a copy of the env. The best return
   is the plan: its actions are what the oracle follows.
2. **Replan.** At ``replans`` decision points spread evenly over the plan's steps, the ``width`` base policies
   that did best in the sweep each finish the episode on a copy of the env from the state reached (each has
   watched the episode so far, so its own state, a smoothed latency or a token window, is as if it had been
   acting). When one finishes with a higher return than the plan, its actions from here on become the plan.
3. **Follow** the plan to the episode's end.

The plan's return never drops (a switch needs a higher complete return), so the oracle's return is at least
every base policy's on the same seed: Bertsekas' rollout with several base heuristics, in its *fortified* form
that never does worse than its start. Episodes are deterministic given the seed and the actions, so following
a plan reproduces its return to the last bit; the planner checks that and raises when it does not.

Search budget per seed (:class:`Budget`, stated on the board): one whole episode per base policy, then at most
``replans x width`` episode tails (16 x 8 by default). It is at or above each of its own bases on every seed.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np

from servegym.metrics import summarize
from servegym.policies import Policy
from servegym.runner import EpisodeResult, serving_env
from servegym.validation import positive_int

ORACLE = "oracle"
"""The oracle's name and leaderboard label."""
BOARD_VERSION = 2
"""The version of the oracle's base set and budget: boards of one version share their 100."""
FROZEN_BASES = {
    "admission": ("fcfs", "twp", "flow-control", "sarathi", "mc-sf", "mc", "amin", "vllm", "lpm", "priority",
                  "scorer"),
    "route": ("router-round-robin", "router-least-loaded", "router-least-kv", "router-power-of-two",
              "router-prefix-affinity", "router-kv-aware"),
}
"""The oracle's base policies per task decision (``Task.decision``), at their default parameters, for
:data:`BOARD_VERSION`; :func:`frozen_bases` adds the task's tuned parameter sets."""
TUNED_BASES = Path(__file__).with_name("oracle_bases.json")
"""The tuned parameter sets of :data:`BOARD_VERSION`, per task, copied from ``docs/tuning`` when the version was
made: frozen with the package, so a board run with other ``--tuned`` files (or none) plans over the same bases."""


def frozen_bases(task: str, decision: str) -> tuple[tuple[str, str, dict], ...]:
    """``(label, policy, params)`` of the oracle's bases on ``task``: :data:`FROZEN_BASES` at default parameters,
    then the task's frozen tuned sets, labelled ``<policy> (frozen tuned)``."""
    data = json.loads(TUNED_BASES.read_text())
    if data["board_version"] != BOARD_VERSION:
        raise ValueError(f"{TUNED_BASES} is for board version {data['board_version']}, not {BOARD_VERSION}")
    tuned = tuple((f"{row['policy']} (frozen tuned)", row["policy"], dict(row["params"]))
                  for row in data["tuned"].get(task, ()))
    return tuple((name, name, {}) for name in FROZEN_BASES[decision]) + tuned



@dataclass(frozen=True)
class Budget:
    """How much the oracle searches on one seed."""

    replans: int = 16
    """Decision points, evenly spaced over the sweep's best episode, where the plan may switch policy (0: the
    oracle is the best base policy of the sweep)."""
    width: int = 8
    """Base policies tried at each decision point: the best ``width`` of the sweep on this seed."""

    def __post_init__(self) -> None:
        if isinstance(self.replans, bool) or not isinstance(self.replans, int) or self.replans < 0:
            raise ValueError(f"replans must be an integer >= 0, got {self.replans!r}")
        positive_int("width", self.width)


@dataclass(frozen=True)
class OracleEpisode:
    """The oracle's episode and how it was found."""

    result: EpisodeResult
    sweep: dict[str, float]
    """Each base policy's return over the whole episode, from the reset."""
    switches: tuple[str, ...]
    """``<base>@<step>`` for the sweep's winner (at step 0) and each later switch, in order."""
    tails: int
    """Episode tails rolled out at decision points."""


@dataclass
class _Plan:
    actions: list[np.ndarray]
    """Every action of the episode, from step 0."""
    total: float
    """The episode's return when it follows ``actions``, summed step by step as the env pays it."""


def play_to_end(env: gym.Env, obs: dict, policy: Policy, total: float) -> tuple[list[np.ndarray], float]:
    """Let ``policy`` play ``env`` from ``obs`` to the episode's end; its actions and the return so far plus its
    rewards (summed in the order the env pays them, so a replay sums to the same float)."""
    actions: list[np.ndarray] = []
    done = False
    while not done:
        action = np.array(policy.act(obs), copy=True)
        obs, reward, terminated, truncated, info = env.step(action)
        actions.append(action)
        total = add_rewards(total, reward, info)
        done = terminated or truncated
    return actions, total


def add_rewards(total: float, reward: float, info: dict) -> float:
    """``total`` plus a step's reward, term by term where the step lists its iterations' rewards (as
    :func:`~servegym.runner.run_episode` sums them, so the oracle's return compares with the rows' to the bit)."""
    for r in info.get("iteration_rewards", (reward,)):
        total += float(r)
    return total


def plan_episode(env: gym.Env, bases: Mapping[str, Policy], seed: int, budget: Budget = Budget()) -> OracleEpisode:
    """The oracle's episode on ``env`` with ``seed``: at least the return of every policy in ``bases`` (label ->
    policy, each bound to ``env``'s profile), which are not changed. ``env`` is left at the episode's end."""
    if not bases:
        raise ValueError("the oracle needs at least one base policy")
    obs, _ = env.reset(seed=seed)
    fresh = {label: copy.deepcopy(policy) for label, policy in bases.items()}
    for policy in fresh.values():
        policy.reset()
    sweep: dict[str, float] = {}
    plan, switches = None, []
    for label, policy in fresh.items():
        actions, total = play_to_end(copy.deepcopy(env), obs, copy.deepcopy(policy), 0.0)
        sweep[label] = total
        if plan is None or total > plan.total:
            plan, switches = _Plan(actions, total), [f"{label}@0"]
    assert plan is not None
    best = sorted(sweep, key=lambda label: -sweep[label])[: budget.width]  # stable: ties keep the bases' order
    watchers = {label: fresh[label] for label in best}
    horizon = len(plan.actions)
    points = {round(k * horizon / (budget.replans + 1)) for k in range(1, budget.replans + 1)} - {0}
    step, total, tails, done, truncated = 0, 0.0, 0, False, False
    while not done:
        if step in points:
            for label, watcher in watchers.items():
                tail, end = play_to_end(copy.deepcopy(env), obs, copy.deepcopy(watcher), total)
                tails += 1
                if end > plan.total:
                    plan = _Plan(plan.actions[:step] + tail, end)
                    switches.append(f"{label}@{step}")
        for watcher in watchers.values():  # each watches the step it did not take
            watcher.act(obs)
        obs, reward, terminated, truncated, info = env.step(plan.actions[step])
        total = add_rewards(total, reward, info)
        step += 1
        done = terminated or truncated
        if not done and step == len(plan.actions):
            break
    if step != len(plan.actions) or not done or total != plan.total:
        raise RuntimeError(f"the env is not deterministic under copy: following the plan's {len(plan.actions)} "
                           f"actions returned {total!r} in {step} steps, its rollout {plan.total!r}; the oracle "
                           "needs every random draw to come from the env's own generators")
    log = serving_env(env).cluster.log
    return OracleEpisode(EpisodeResult(log, summarize(log), step, bool(truncated), total), sweep,
                         tuple(switches), tails)
