"""A policy network shared across replicas, for the ``route`` action mode (a routing task's agent).

The ``route`` mode's observation is the routing env's, flattened (:func:`~servegym.rl.wrappers.route_observation`):
one row of :data:`~servegym.envs.routing.REPLICA_FEATURES` per replica, then the arriving request's
:data:`~servegym.envs.routing.REQUEST_FEATURES`. :class:`RouteEncoder` reads every replica's row with one small
network shared by all replicas, alongside the request, the row's difference from the cluster's mean, the share of
the prompt the replica holds cached and whether the replica has the round-robin turn (the turn enters only
so, never as the request's raw index, which would tie an input to a replica's position); pools the replicas into a
context (mean and max); and gives each replica an embedding of its own row and that context. :class:`RouteHead`
turns each embedding into the replica's logit with one linear layer shared by every replica. Permuting the
replicas (and the turn with them) permutes the logits and nothing else, so an untrained agent favours no replica
and what it learns about one (a loaded replica makes a request wait; a cached prefix saves its prefill) holds for
every one: routing by a comparison across replicas is the shape of the network, not something to learn per slot.

Features enter on a symmetric log scale (``sign(x) log(1 + |x|)``) from the raw counts, without running
statistics (``VecNormalize`` normalises the rewards only in this mode: :func:`normalizes_observations`).
"""

from __future__ import annotations

from typing import Any

import torch
from gymnasium import spaces
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn

from servegym.envs.routing import REPLICA_FEATURES, REQUEST_FEATURES
from servegym.rl.equivariant import mlp, symlog

EMBED = 32
"""Width of each replica's embedding; the context is twice that (mean and max)."""
_ROW = {name: i for i, name in enumerate(REPLICA_FEATURES)}
_REQ = {name: i for i, name in enumerate(REQUEST_FEATURES)}
_SHARED = [i for i, name in enumerate(REQUEST_FEATURES) if name != "turn"]
"""The request features every replica sees (the turn is a position: it enters as each replica's own flag)."""
ROUTE_NETWORK_ALGOS = ("ppo", "a2c", "maskable-ppo")
"""Algorithms whose ``route``-mode agents use this network (DQN keeps SB3's ``MlpPolicy`` on normalised inputs)."""


def num_replicas(observation_space: spaces.Space) -> int:
    """Replicas of a flat routing observation space (``N x rows + request``)."""
    size = int(observation_space.shape[0]) - len(REQUEST_FEATURES)
    if len(observation_space.shape) != 1 or size <= 0 or size % len(REPLICA_FEATURES):
        raise ValueError(f"not a flat routing observation: {observation_space}")
    return size // len(REPLICA_FEATURES)


class RouteEncoder(BaseFeaturesExtractor):
    """Per-replica embeddings, then the context: ``(batch, N * embed + 2 * embed)``."""

    def __init__(self, observation_space: spaces.Box, embed: int = EMBED) -> None:
        self.replicas = num_replicas(observation_space)
        super().__init__(observation_space, (self.replicas + 2) * embed)
        self.embed = embed
        row = len(REPLICA_FEATURES)
        self.row = mlp(2 * row + len(_SHARED) + 2, embed)
        self.mix = mlp(3 * embed, embed)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        n, row = self.replicas, len(REPLICA_FEATURES)
        rows = obs[:, : n * row].reshape(-1, n, row)
        request = obs[:, n * row:]
        prompt = request[:, _REQ["prompt_tokens"], None].clamp(min=1.0)
        cached = (rows[:, :, _ROW["cached_tokens"]] / prompt).unsqueeze(-1)
        turn = (torch.arange(n, device=obs.device)[None, :] == request[:, _REQ["turn"], None].round()).float()
        inputs = torch.cat([symlog(rows), symlog(rows - rows.mean(dim=1, keepdim=True)),
                            symlog(request[:, _SHARED])[:, None, :].expand(-1, n, -1), cached, turn.unsqueeze(-1)],
                           dim=2)
        each = self.row(inputs)
        context = torch.cat([each.mean(dim=1), each.max(dim=1).values], dim=1)
        mixed = self.mix(torch.cat([each, context[:, None, :].expand(-1, n, -1)], dim=2))
        return torch.cat([mixed.flatten(1), context], dim=1)


class RouteHead(nn.Module):
    """A logit per replica from its embedding, by one linear layer shared by every replica."""

    def __init__(self, embed: int, replicas: int, gain: float = 0.01) -> None:
        super().__init__()
        self.embed, self.replicas = embed, replicas
        self.logit = nn.Linear(embed, 1)
        nn.init.orthogonal_(self.logit.weight, gain=gain)  # small: an untrained agent routes almost uniformly
        nn.init.zeros_(self.logit.bias)

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        each = latent[:, : self.replicas * self.embed].reshape(-1, self.replicas, self.embed)
        return self.logit(each).squeeze(-1)


class _RouteNetwork:
    """The :class:`RouteEncoder` features and :class:`RouteHead` action net on an actor-critic policy (the value
    net is a small MLP over every replica's embedding and the context)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("features_extractor_class", RouteEncoder)
        kwargs.setdefault("net_arch", {"pi": [], "vf": [64]})
        super().__init__(*args, **kwargs)

    def _build(self, lr_schedule: Any) -> None:
        super()._build(lr_schedule)
        extractor = self.features_extractor
        self.action_net = RouteHead(extractor.embed, extractor.replicas)
        self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)


class RoutePolicy(_RouteNetwork, ActorCriticPolicy):
    """PPO's and A2C's actor-critic in the ``route`` mode (:class:`RouteEncoder`, :class:`RouteHead`)."""


class MaskableRoutePolicy(_RouteNetwork, MaskableActorCriticPolicy):
    """MaskablePPO's actor-critic in the ``route`` mode; masked replicas get sb3-contrib's masked logit."""


def route_policy(algo: str) -> type[ActorCriticPolicy] | str:
    """The ``route`` mode's policy for ``algo``: the replica-shared network, or ``"MlpPolicy"`` for DQN."""
    if algo == "maskable-ppo":
        return MaskableRoutePolicy
    return RoutePolicy if algo in ROUTE_NETWORK_ALGOS else "MlpPolicy"


def normalizes_observations(algo: str, mode: str) -> bool:
    """Whether ``VecNormalize`` normalises the observations (it always normalises the rewards when a run
    normalises): not for the replica-shared network, which scales the raw counts itself."""
    return not (mode == "route" and algo in ROUTE_NETWORK_ALGOS)
