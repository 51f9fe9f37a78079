"""Action masks shared by the env, the RL wrappers and trained agents (one definition each)."""

from __future__ import annotations

import numpy as np


def slot_action_masks(width: int, num_visible: int, num_values: int) -> np.ndarray:
    """Flat ``(width * num_values,)`` booleans for a per-slot ``MultiDiscrete`` action (MaskablePPO's layout):
    value 0 (wait) is always allowed; the others only on the ``num_visible`` occupied slots."""
    mask = np.zeros((width, num_values), dtype=bool)
    mask[:, 0] = True
    mask[: min(num_visible, width), 1:] = True
    return mask.ravel()


def count_action_masks(num_values: int, num_visible: int) -> np.ndarray:
    """Booleans for a ``Discrete(num_values)`` admit-count action: counts up to ``num_visible`` are allowed."""
    return np.arange(num_values) <= max(num_visible, 0)
