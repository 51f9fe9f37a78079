"""Victim selection when an iteration would overflow the KV cache."""

from __future__ import annotations

import numpy as np

from servegym.engine.config import PreemptionRule


def pick_victims(rule: PreemptionRule, generated: np.ndarray) -> np.ndarray:
    """Rows (in activation order, oldest first) to evict next under ``rule``.

    ``generated`` holds each running row's generated-token count. LIFO and fewest-generated evict one row
    at a time (the engine re-checks the fit after each); clear-all evicts every row at once.
    """
    n = generated.size
    if rule is PreemptionRule.LIFO:
        return np.array([n - 1])
    if rule is PreemptionRule.CLEAR_ALL:
        return np.arange(n)
    # Fewest generated first; among ties the most recently activated (highest row).
    fewest = generated.min()
    return np.array([int(np.flatnonzero(generated == fewest)[-1])])
