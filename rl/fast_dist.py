"""One batched distribution per forward pass for the ``admit`` action mode (extra ``rl``).

The ``admit`` mode acts in ``MultiDiscrete([2] * W)``. Stable-baselines3 (``MultiCategoricalDistribution``) and
sb3-contrib (``MaskableMultiCategoricalDistribution``) build one ``torch.distributions.Categorical`` per slot, with
argument validation, on every forward pass: W = 32 small distributions per step cost ~10x the env step.
When every sub-space has the same size, the same maths is one ``(batch, slots, choices)`` tensor of log-probs:

* :class:`SlotCategoricalDistribution` - drop-in for SB3's ``MultiCategoricalDistribution`` (PPO, A2C);
* :class:`MaskableSlotCategoricalDistribution` - drop-in for sb3-contrib's masked one (MaskablePPO); masked
  choices get a logit of ``-1e8`` exactly as sb3-contrib does, so they are never sampled and add no entropy.

Action spaces, ``action_masks()`` and saved parameters (``action_net`` is the same ``Linear``) are unchanged.
Use them through :func:`policy_for`::

    model = PPO(policy_for("ppo", env.action_space), env)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from sb3_contrib.common.maskable.distributions import MaskableMultiCategoricalDistribution
from sb3_contrib.common.maskable.policies import MaskableMultiInputActorCriticPolicy
from stable_baselines3.common.distributions import MultiCategoricalDistribution
from stable_baselines3.common.policies import BasePolicy, MultiInputActorCriticPolicy

MASKED_LOGIT = -1e8
"""Logit of a masked choice (sb3-contrib's value): its probability is exactly 0 in float32."""


def uniform_slots(action_space: spaces.Space) -> tuple[int, int] | None:
    """``(slots, choices)`` of a ``MultiDiscrete`` whose sub-spaces all have the same size, else None."""
    if not isinstance(action_space, spaces.MultiDiscrete) or action_space.nvec.ndim != 1:
        return None
    choices = np.unique(action_space.nvec)
    return (int(action_space.nvec.size), int(choices[0])) if choices.size == 1 else None


class _SlotCategorical:
    """Independent categoricals over ``slots`` sub-spaces of ``choices`` values each, as one tensor."""

    def __init__(self, action_dims: list[int]) -> None:
        super().__init__(action_dims)
        if len(set(action_dims)) != 1:
            raise ValueError(f"slot distributions need equal sub-space sizes, got {sorted(set(action_dims))}")
        self.slots, self.choices = len(action_dims), int(action_dims[0])
        self.masks: th.Tensor | None = None

    def proba_distribution(self, action_logits: th.Tensor) -> _SlotCategorical:
        self.raw_logits = action_logits.reshape(-1, self.slots, self.choices)
        self.masks = None
        self.log_probs = th.log_softmax(self.raw_logits, dim=-1)
        return self

    def log_prob(self, actions: th.Tensor) -> th.Tensor:
        index = actions.long().reshape(-1, self.slots, 1)
        return self.log_probs.gather(-1, index).squeeze(-1).sum(dim=1)

    def entropy(self) -> th.Tensor:
        p_log_p = self.log_probs.exp() * self.log_probs
        if self.masks is not None:  # masked choices carry no uncertainty (their p * log p is -0 * 1e8)
            p_log_p = th.where(self.masks, p_log_p, th.zeros((), dtype=p_log_p.dtype, device=p_log_p.device))
        return -p_log_p.sum(dim=(1, 2))

    def sample(self) -> th.Tensor:
        probs = self.log_probs.exp().reshape(-1, self.choices)
        return th.multinomial(probs, 1).reshape(-1, self.slots)

    def mode(self) -> th.Tensor:
        return self.log_probs.argmax(dim=-1)

    def apply_masking(self, masks: th.Tensor | np.ndarray | None) -> None:
        """Flat ``(batch, slots * choices)`` booleans, True where a choice is allowed; None removes masking."""
        if masks is None:
            self.masks, logits = None, self.raw_logits
        else:
            device = self.raw_logits.device
            self.masks = th.as_tensor(masks, dtype=th.bool, device=device).reshape(self.raw_logits.shape)
            fill = th.tensor(MASKED_LOGIT, dtype=self.raw_logits.dtype, device=device)
            logits = th.where(self.masks, self.raw_logits, fill)
        self.log_probs = th.log_softmax(logits, dim=-1)


class SlotCategoricalDistribution(_SlotCategorical, MultiCategoricalDistribution):
    """SB3's ``MultiCategoricalDistribution`` for equal sub-spaces, computed as one batched tensor."""


class MaskableSlotCategoricalDistribution(_SlotCategorical, MaskableMultiCategoricalDistribution):
    """sb3-contrib's ``MaskableMultiCategoricalDistribution`` for equal sub-spaces, as one batched tensor."""


class SlotMultiInputPolicy(MultiInputActorCriticPolicy):
    """SB3's ``MultiInputPolicy`` with :class:`SlotCategoricalDistribution` on equal-size ``MultiDiscrete``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if uniform_slots(self.action_space) is not None:  # same ``action_net`` as the stock distribution
            self.action_dist = SlotCategoricalDistribution(list(self.action_space.nvec))


class MaskableSlotMultiInputPolicy(MaskableMultiInputActorCriticPolicy):
    """sb3-contrib's masked ``MultiInputPolicy`` with :class:`MaskableSlotCategoricalDistribution`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if uniform_slots(self.action_space) is not None:  # same ``action_net`` as the stock distribution
            self.action_dist = MaskableSlotCategoricalDistribution(list(self.action_space.nvec))


FAST_POLICIES: dict[str, type[BasePolicy]] = {
    "ppo": SlotMultiInputPolicy, "a2c": SlotMultiInputPolicy, "maskable-ppo": MaskableSlotMultiInputPolicy}
"""Algorithms (``servegym.rl.config.ALGOS`` names) that have a batched-slot policy."""


def policy_for(algo: str, action_space: spaces.Space, mode: str | None = None) -> str | type[BasePolicy]:
    """The policy to pass as the first argument of ``algorithm_class(algo)(...)``: for PPO and A2C in the
    ``score`` mode the network shared across queue slots (:class:`~servegym.rl.equivariant.ScorePolicy`), the
    batched-slot policy for PPO, A2C and MaskablePPO on an equal-size ``MultiDiscrete`` (the ``admit`` mode),
    in the ``route`` mode the network shared across replicas (:func:`~servegym.rl.route_policy.route_policy`; DQN:
    ``"MlpPolicy"`` on the flat observation), else ``"MultiInputPolicy"``.
    """
    if mode == "route":
        from servegym.rl.route_policy import route_policy

        return route_policy(algo)
    if mode == "score" and algo in ("ppo", "a2c"):
        from servegym.rl.equivariant import ScorePolicy

        return ScorePolicy
    if algo in FAST_POLICIES and uniform_slots(action_space) is not None:
        return FAST_POLICIES[algo]
    return "MultiInputPolicy"
