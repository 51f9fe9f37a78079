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

import numpy as np
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


class _Tanh(torch.autograd.Function):
    """``tanh`` with its forward pass by NumPy on CPU floats: torch 2.13's CPU ``tanh`` takes 2.6 ns an element
    on this project's AVX-512 machine against NumPy's 0.35 (both within one unit in the last place of the exact
    value), and it was a quarter of a PPO update of the score network. The backward pass is torch's."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64):
            y = torch.empty_like(x, memory_format=torch.contiguous_format)
            np.tanh(x.detach().contiguous().numpy(), out=y.numpy())
        else:
            y = torch.tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


LARGE = 4096
"""Rows from which ``RowLinear`` takes its fast path: below it the fixed cost of the detour outweighs it, so small
batches (an agent acting on one observation, a rollout of a few envs) compute exactly as ``nn.Linear`` does."""
TANH_LARGE = 16_384
"""Elements from which ``Tanh`` takes its fast path. The detour (an autograd ``Function``, a NumPy view each way)
costs 10-25 us a call; measured alone on this machine NumPy's forward wins from about 4,096 elements without
gradients but forward and backward together only from about 16,384 (43 against 71 us at 4,096, 85 against 78 at
16,384); at 4,096 an agent's forward on one observation (its running batch's 128 rows x 32) was 13% slower than
with torch's ``tanh``. Below it torch's own, bit for bit."""


class Tanh(nn.Module):
    """``nn.Tanh``, computed as :class:`_Tanh` does from :data:`TANH_LARGE` elements (no parameters: a saved
    ``nn.Tanh`` network loads as is)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Tanh.apply(x) if x.numel() >= TANH_LARGE else torch.tanh(x)


class RowLinear(nn.Linear):
    """``nn.Linear`` (on ``(..., inputs)``) with its weight gradient taken as ``(x^T g)^T`` from :data:`LARGE`
    rows: with a few inputs and many rows (a slot's 6 features, tens of thousands of rows a minibatch) MKL takes 6x
    longer for the ``g^T x`` ``nn.Linear``'s backward computes (1.36 against 0.20 ms at 23,000 rows here). Same
    parameters, same values (the sum's order differs: ~4e-6 relative, as between any two summation orders)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() < LARGE * x.shape[-1]:  # fewer than LARGE rows: nn.Linear's own, nothing reshaped
            return nn.functional.linear(x, self.weight, self.bias)
        flat = x.reshape(-1, x.shape[-1])
        return torch.addmm(self.bias, flat, self.weight.t().contiguous()).reshape(*x.shape[:-1], self.out_features)


def mlp(inputs: int, width: int) -> nn.Sequential:
    return nn.Sequential(RowLinear(inputs, width), Tanh(), nn.Linear(width, width), Tanh())


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` (batch, rows, width) over the rows where ``mask`` (batch, rows, 1) is 1; 0 with none."""
    return (x * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


def _present(counts: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows that exist when state ``i`` has its first ``counts[i]`` of ``width`` rows: each one's state and its
    index in the flattened ``(batch * width)`` rows, in row-major order."""
    flat = (torch.arange(width, device=counts.device)[None, :] < counts[:, None]).reshape(-1).nonzero().squeeze(1)
    return torch.div(flat, width, rounding_mode="floor"), flat


def _owner_mean(rows: torch.Tensor, owner: torch.Tensor, states: int) -> torch.Tensor:
    """Per-state mean of packed ``rows`` (row ``k`` belongs to state ``owner[k]``); 0 for a state with none."""
    sums = rows.new_zeros(states, rows.shape[1]).index_add_(0, owner, rows)
    counts = torch.bincount(owner, minlength=states).clamp(min=1).to(rows.dtype)
    return sums / counts[:, None]


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
        and is computed once, and the context's share of ``mix``'s first layer is computed once per state. The
        same numbers as running every row and masking (see ``forward_dense``)."""
        if not self.packed:
            return self.forward_dense(obs)
        engine = obs["engine"]
        n = engine.shape[0]
        rows = obs["queue"].reshape(n * self.width, len(QUEUE_FEATURES))
        batch = obs["running"].reshape(n * self.batch, len(RUNNING_FEATURES))
        owner, flat = _present(engine[:, ENGINE_INDEX["num_waiting"]], self.width)
        run_owner, run_flat = _present(engine[:, ENGINE_INDEX["num_running"]], self.batch)
        slots = self.slot(symlog(rows.index_select(0, flat)))  # the waiting requests' embeddings, packed
        pooled = _owner_mean(self.run(symlog(batch.index_select(0, run_flat))), run_owner, n)
        extra = [symlog(obs["progress"])] if self.progress else []
        context = self.context(torch.cat([symlog(engine), symlog(obs["pool"]), *extra, pooled,
                                          _owner_mean(slots, owner, n)], dim=1))
        first = self.mix[0]
        own, shared = first.weight[:, : self.embed], first.weight[:, self.embed:]
        from_context = torch.addmm(first.bias, context, shared.t())  # mix's first layer, less the slot's part
        empty = self._mix_tail(from_context)
        mixed = empty.repeat_interleave(self.width, dim=0)  # a new tensor: written in place
        mixed.index_copy_(0, flat, self._mix_tail(torch.addmm(from_context.index_select(0, owner), slots, own.t())))
        return torch.cat([mixed.reshape(n, self.width * self.embed), context], dim=1)

    def _mix_tail(self, x: torch.Tensor) -> torch.Tensor:
        """``mix`` after its first layer's product."""
        for layer in list(self.mix)[1:]:
            x = layer(x)
        return x

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
        """Both layers on every row (``W`` slots and the context) in one product, then each row's own output:
        slicing the wide ``latent`` instead costs a zero-filled copy of it per slice in the backward pass (a tenth
        of a PPO update); the two extra dot products a row are nothing beside that."""
        rows = latent.reshape(-1, self.width + 1, self.embed)
        weight = torch.cat([self.score.weight, self.target.weight])
        both = nn.functional.linear(rows, weight, torch.cat([self.score.bias, self.target.bias]))
        return torch.cat([both[:, : self.width, 0], both[:, self.width:, 1]], dim=1)


class ScorePolicy(ActorCriticPolicy):
    """PPO/A2C's actor-critic with :class:`QueueEncoder` features and a :class:`ScoreHead` action net (the value
    net is a small MLP over all features). ``head_gain`` scales the head's initial weights: 0 makes the initial
    mean action exactly 0, the base scorer itself for a residual agent."""

    def __init__(self, *args: Any, head_gain: float = 0.01, **kwargs: Any) -> None:
        self.head_gain = head_gain
        kwargs.setdefault("features_extractor_class", QueueEncoder)
        kwargs.setdefault("net_arch", {"pi": [], "vf": [64]})
        kwargs.setdefault("activation_fn", Tanh)
        super().__init__(*args, **kwargs)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        return {**super()._get_constructor_parameters(), "head_gain": self.head_gain}

    def _build(self, lr_schedule: Any) -> None:
        super()._build(lr_schedule)
        extractor = self.features_extractor
        self.action_net = ScoreHead(extractor.embed, extractor.width, self.head_gain)
        options = dict(self.optimizer_kwargs)
        if self.optimizer_class in (torch.optim.Adam, torch.optim.AdamW) and "foreach" not in options:
            options.setdefault("fused", True)  # one kernel for all 20 tensors: 0.15-0.19 ms a step, not 0.70-0.78
        self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1), **options)
