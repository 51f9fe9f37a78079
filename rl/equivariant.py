"""A policy network shared across queue slots, for the ``score`` action mode (issue 27).

:class:`QueueEncoder` (an SB3 features extractor over the env's Dict observation) reads each waiting request's
row with one small network shared by every slot, pools the running batch and the queue into a context with the
engine, pool and episode-progress features, and gives each slot an embedding of its own row and that context;
the context comes last. :class:`ScorePolicy` (an ``ActorCriticPolicy``) maps each slot's embedding to its score
with one linear layer shared by every slot and the context to the memory target, so permuting the queue permutes
the scores and nothing else: a request is scored from its features and the state, wherever it sits.

Features enter on a symmetric log scale (``sign(x) log(1 + |x|)``), so prompts of 10 and 10,000 tokens or
waits of 0.1 and 100 s differ by a few units, without running statistics: train with ``normalize: false``.
Slots past the queue's length and batch rows past the running count are masked out of every pool.
"""

from __future__ import annotations

from typing import Any

import torch
from gymnasium import spaces
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn

from servegym.envs.observation import ENGINE_INDEX, QUEUE_FEATURES, RUNNING_FEATURES

EMBED = 32
"""Width of each slot's embedding and of the context."""


def symlog(x: torch.Tensor) -> torch.Tensor:
    return torch.sign(x) * torch.log1p(torch.abs(x))


def mlp(inputs: int, width: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inputs, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh())


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` (batch, rows, width) over the rows where ``mask`` (batch, rows, 1) is 1; 0 with none."""
    return (x * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


def _packed_mean(rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-state mean of packed ``rows`` (one per True of ``mask`` (batch, slots), in row-major order); 0 for a
    state with none."""
    owner = mask.nonzero()[:, 0]
    sums = rows.new_zeros(mask.shape[0], rows.shape[1]).index_add_(0, owner, rows)
    return sums / mask.sum(dim=1, keepdim=True).clamp(min=1).to(rows.dtype)


class QueueEncoder(BaseFeaturesExtractor):
    """Per-slot embeddings, then the context: ``(batch, (W + 1) * embed)``."""

    def __init__(self, observation_space: spaces.Dict, embed: int = EMBED, packed: bool = True) -> None:
        self.width = observation_space["queue"].shape[0] // len(QUEUE_FEATURES)
        self.batch = observation_space["running"].shape[0] // len(RUNNING_FEATURES)
        super().__init__(observation_space, (self.width + 1) * embed)
        self.embed, self.packed = embed, packed
        """``packed``: :meth:`forward` runs the networks on existing rows only (False: on every row, masking after;
        the same numbers, slower on large batches; kept as the reference and for timing)."""
        engine, pool = observation_space["engine"].shape[0], observation_space["pool"].shape[0]
        # A run saved before obs["progress"] existed keeps its layout (and its weights) without it.
        self.progress = "progress" in observation_space.spaces
        pool += observation_space["progress"].shape[0] if self.progress else 0
        self.slot = mlp(len(QUEUE_FEATURES), embed)
        self.run = mlp(len(RUNNING_FEATURES), embed)
        self.context = mlp(engine + pool + 2 * embed, embed)
        self.mix = mlp(2 * embed, embed)

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Each network runs on the rows that exist only (waiting requests, running ones), packed across the
        batch; an empty slot's embedding is zero, so its mixed row is the same for every empty slot of a state
        and is computed once. The same numbers as running every row and masking (see ``forward_dense``)."""
        if not self.packed:
            return self.forward_dense(obs)
        engine = obs["engine"]
        rows = obs["queue"].reshape(-1, self.width, len(QUEUE_FEATURES))
        batch = obs["running"].reshape(-1, self.batch, len(RUNNING_FEATURES))
        present = torch.arange(self.width, device=engine.device)[None, :] < engine[:, ENGINE_INDEX["num_waiting"], None]
        running = torch.arange(self.batch, device=engine.device)[None, :] < engine[:, ENGINE_INDEX["num_running"], None]
        n = rows.shape[0]
        slots = self.slot(symlog(rows[present]))  # the waiting requests' embeddings, packed
        pooled = _packed_mean(self.run(symlog(batch[running])), running)
        extra = [symlog(obs["progress"])] if self.progress else []
        context = self.context(torch.cat([symlog(engine), symlog(obs["pool"]), *extra, pooled,
                                          _packed_mean(slots, present)], dim=1))
        empty = self.mix(torch.cat([context.new_zeros(n, self.embed), context], dim=1))
        mixed = empty[:, None, :].expand(-1, self.width, -1).clone()
        mixed[present] = self.mix(torch.cat([slots, context[:, None, :].expand(-1, self.width, -1)[present]], dim=1))
        return torch.cat([mixed.flatten(1), context], dim=1)

    def forward_dense(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The same features computed on every row, masks applied after: the reference :meth:`forward` is
        tested against (and what it computed before it packed the rows)."""
        engine = obs["engine"]
        rows = obs["queue"].reshape(-1, self.width, len(QUEUE_FEATURES))
        batch = obs["running"].reshape(-1, self.batch, len(RUNNING_FEATURES))
        present = (torch.arange(self.width, device=engine.device)[None, :]
                   < engine[:, ENGINE_INDEX["num_waiting"], None]).float().unsqueeze(-1)
        running = (torch.arange(self.batch, device=engine.device)[None, :]
                   < engine[:, ENGINE_INDEX["num_running"], None]).float().unsqueeze(-1)
        slots = self.slot(symlog(rows)) * present
        pooled = _masked_mean(self.run(symlog(batch)), running)
        extra = [symlog(obs["progress"])] if self.progress else []
        context = self.context(torch.cat([symlog(engine), symlog(obs["pool"]), *extra, pooled,
                                          _masked_mean(slots, present)], dim=1))
        mixed = self.mix(torch.cat([slots, context[:, None, :].expand(-1, self.width, -1)], dim=2))
        return torch.cat([mixed.flatten(1), context], dim=1)


class ScoreHead(nn.Module):
    """Scores from slot embeddings by one shared linear layer, the memory target from the context."""

    def __init__(self, embed: int, width: int, gain: float = 0.01) -> None:
        super().__init__()
        self.embed, self.width = embed, width
        self.score = nn.Linear(embed, 1)
        self.target = nn.Linear(embed, 1)
        for layer in (self.score, self.target):
            nn.init.orthogonal_(layer.weight, gain=gain)  # gain 0: every action exactly 0 until trained
            nn.init.zeros_(layer.bias)

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        slots = latent[:, : self.width * self.embed].reshape(-1, self.width, self.embed)
        context = latent[:, self.width * self.embed:]
        return torch.cat([self.score(slots).squeeze(-1), self.target(context)], dim=1)


class ScorePolicy(ActorCriticPolicy):
    """PPO/A2C's actor-critic with :class:`QueueEncoder` features and a :class:`ScoreHead` action net (the value
    net is a small MLP over all features). ``head_gain`` scales the head's initial weights: 0 makes the initial
    mean action exactly 0, the base scorer itself for a residual agent."""

    def __init__(self, *args: Any, head_gain: float = 0.01, **kwargs: Any) -> None:
        self.head_gain = head_gain
        kwargs.setdefault("features_extractor_class", QueueEncoder)
        kwargs.setdefault("net_arch", {"pi": [], "vf": [64]})
        super().__init__(*args, **kwargs)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        return {**super()._get_constructor_parameters(), "head_gain": self.head_gain}

    def _build(self, lr_schedule: Any) -> None:
        super()._build(lr_schedule)
        extractor = self.features_extractor
        self.action_net = ScoreHead(extractor.embed, extractor.width, self.head_gain)
        self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)
