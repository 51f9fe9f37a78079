"""Torch's intra-op threads per training phase: one while the envs step (the policy's forward passes are small
and the envs' Python holds the core), more for the gradient update, when the envs are idle.

:class:`UpdateThreads` is a stable-baselines3 callback: SB3 calls ``on_rollout_end`` just before each update
(``train()``) and ``on_rollout_start`` just after, so the update runs with ``update`` threads and everything else
(rollouts, evaluations, checkpoints) with ``rollout`` threads.
"""

from __future__ import annotations

import torch
from stable_baselines3.common.callbacks import BaseCallback


class UpdateThreads(BaseCallback):
    """Run each gradient update with ``update`` torch threads and the rest of training with ``rollout``."""

    def __init__(self, update: int, rollout: int) -> None:
        super().__init__()
        self.update, self.rollout = update, rollout

    def _on_rollout_start(self) -> None:
        torch.set_num_threads(self.rollout)

    def _on_rollout_end(self) -> None:
        torch.set_num_threads(self.update)

    def _on_training_end(self) -> None:
        torch.set_num_threads(self.rollout)

    def _on_step(self) -> bool:
        return True
