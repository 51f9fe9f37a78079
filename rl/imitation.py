"""Behaviour cloning from the parametric scorer, a warm start for agents in the ``score`` mode (issue 27).

The scorer (:mod:`servegym.policies.scorer`) acts through the ``score`` mode's own rule, so each of its
decisions *is* a score-mode action: its scores mapped monotonically into [-1, 1] (the order, all that the rule
reads, is kept) and its memory target mapped back (:func:`~servegym.rl.wrappers.scorer_action`).
:func:`imitate` plays the scorer on training seeds, then fits the policy's mean action to those actions by
squared error over the visible slots and the target, so PPO starts where the tuned scorer is and can learn what
a fixed formula cannot: scores that depend on the state.

In the ``route`` mode (a routing task) :func:`imitate_router` does the same for a router: its replica choices
on training episodes, fitted by cross-entropy, so PPO starts as that router.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from servegym.envs.observation import ENGINE_INDEX
from servegym.envs.tasks import TRAIN_SEEDS
from servegym.policies import make_policy
from servegym.rl.wrappers import scorer_action


def demonstrations(env_kwargs: dict[str, Any], params: dict[str, Any], episodes: int,
                   first_seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """The scorer's observations, actions and per-value weights (1 on visible slots and the target) over
    ``episodes`` training episodes from seed ``first_seed``."""
    import gymnasium as gym

    from servegym import ENV_ID

    expert = make_policy("scorer", **params)
    env = gym.make(ENV_ID, **env_kwargs)
    observations: dict[str, list[np.ndarray]] = {}
    actions, weights = [], []
    for k in range(episodes):
        seed = TRAIN_SEEDS[(first_seed + k) % len(TRAIN_SEEDS)]
        obs, _ = env.reset(seed=seed)
        expert.reset()
        done = False
        while not done:
            action = scorer_action(expert, obs).astype(np.float32)
            weight = np.zeros_like(action)
            weight[: min(int(obs["engine"][ENGINE_INDEX["num_waiting"]]), action.size - 1)] = 1.0
            weight[-1] = 1.0
            for key, value in obs.items():
                observations.setdefault(key, []).append(value)
            actions.append(action)
            weights.append(weight)
            obs, _, terminated, truncated, _ = env.step(expert.act(obs))
            done = terminated or truncated
    env.close()
    return {k: np.stack(v) for k, v in observations.items()}, np.stack(actions), np.stack(weights)


def imitate(model: Any, env_kwargs: dict[str, Any], params: dict[str, Any], episodes: int = 8, epochs: int = 20,
            batch_size: int = 256, seed: int = 0) -> dict[str, float]:
    """Fit ``model.policy``'s mean action to the scorer's demonstrations; the fit's first and last losses."""
    import torch

    obs, actions, weights = demonstrations(env_kwargs, params, episodes, first_seed=seed * 10_007)
    target = torch.as_tensor(actions)
    weight = torch.as_tensor(weights)

    def loss(index: np.ndarray) -> Any:
        batch = {k: torch.as_tensor(v[index]) for k, v in obs.items()}
        mean = model.policy.get_distribution(batch).distribution.mean
        return ((mean - target[index]) ** 2 * weight[index]).sum() / weight[index].sum()

    losses = _fit(model.policy, len(actions), loss, epochs, batch_size, seed)
    return {"demonstration_steps": float(len(actions)), "first_loss": losses[0], "last_loss": losses[-1]}


def _fit(policy: Any, size: int, loss: Callable[[np.ndarray], Any], epochs: int, batch_size: int,
         seed: int) -> list[float]:
    """Adam (lr 1e-3) on ``loss(index)`` over shuffled minibatches of ``size`` demonstrations; each epoch's mean
    loss."""
    import torch

    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
    rng = np.random.default_rng(seed)
    losses = []
    for _ in range(epochs):
        order = rng.permutation(size)
        total = 0.0
        for start in range(0, size, batch_size):
            index = order[start:start + batch_size]
            value = loss(index)
            optimizer.zero_grad()
            value.backward()
            optimizer.step()
            total += value.item() * len(index)
        losses.append(total / size)
    return losses


def route_demonstrations(env_kwargs: dict[str, Any], router: str, params: dict[str, Any], episodes: int,
                         first_seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A router's flat observations (:func:`~servegym.rl.wrappers.route_observation`) and replica choices over
    ``episodes`` training episodes of the routing env from seed ``first_seed``."""
    import gymnasium as gym

    from servegym import ENV_ID
    from servegym.rl.wrappers import route_observation

    expert = make_policy(router, **params)
    env = gym.make(ENV_ID, **env_kwargs)
    observations, actions = [], []
    for k in range(episodes):
        obs, _ = env.reset(seed=TRAIN_SEEDS[(first_seed + k) % len(TRAIN_SEEDS)])
        expert.reset()
        done = False
        while not done:
            action = int(expert.act(obs))
            observations.append(route_observation(obs))
            actions.append(action)
            obs, _, terminated, truncated, _ = env.step(np.int64(action))
            done = terminated or truncated
    env.close()
    return np.stack(observations), np.asarray(actions, dtype=np.int64)


def imitate_router(model: Any, env_kwargs: dict[str, Any], router: str, params: dict[str, Any], episodes: int = 8,
                   epochs: int = 20, batch_size: int = 256, seed: int = 0) -> dict[str, float]:
    """Fit ``model.policy``'s replica distribution to a router's choices (cross-entropy), a warm start for the
    ``route`` mode; the fit's first and last losses and how often the fitted policy's mode matches the router."""
    import torch

    obs, actions = route_demonstrations(env_kwargs, router, params, episodes, first_seed=seed * 10_007)
    policy = model.policy
    x, target = torch.as_tensor(obs), torch.as_tensor(actions)

    def loss(index: np.ndarray) -> Any:
        logits = policy.get_distribution(x[index]).distribution.logits
        return torch.nn.functional.cross_entropy(logits, target[index])

    losses = _fit(policy, len(actions), loss, epochs, batch_size, seed)
    with torch.no_grad():
        agree = float((policy.get_distribution(x).distribution.logits.argmax(dim=1) == target).float().mean())
    return {"demonstration_steps": float(len(actions)), "first_loss": losses[0], "last_loss": losses[-1],
            "agreement": agree}
