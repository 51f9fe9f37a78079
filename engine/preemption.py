"""Victim selection when an iteration would overflow the KV cache."""

from __future__ import annotations

import numpy as np

from servegym.engine.config import PreemptionRule


def amin_estimate(lo: np.ndarray, hi: np.ndarray, generated: np.ndarray) -> np.ndarray:
    """A_min's output-length estimate: ``lo * 2**k`` for the smallest ``k`` with an estimate above
    ``generated``, capped at ``hi`` while ``hi`` is above ``generated``. A request that outgrew ``hi`` (a wrong
    prediction, ``length_mode="predicted"``) keeps doubling, so the estimate stays above what it generated."""
    lo = np.maximum(lo, 1.0)
    doublings = np.ceil(np.log2(np.maximum((generated + 1.0) / lo, 1.0)))
    hi = np.where(hi > generated, hi, np.inf)
    return np.minimum(lo * 2.0**doublings, hi)


def pick_victims(rule: PreemptionRule, generated: np.ndarray, output_lo: np.ndarray | None = None,
                 output_hi: np.ndarray | None = None) -> np.ndarray:
    """Rows (in activation order, oldest first) to evict next under ``rule``.

    ``generated`` holds each running row's generated-token count, ``output_lo``/``output_hi`` its observed
    output-length interval (needed by shortest-predicted). All rules but clear-all evict one row at a time
    (the engine re-checks the fit after each); clear-all evicts every row at once.
    """
    n = generated.size
    if rule is PreemptionRule.LIFO:
        return np.array([n - 1])
    if rule is PreemptionRule.CLEAR_ALL:
        return np.arange(n)
    if rule is PreemptionRule.SHORTEST_PREDICTED:
        key = amin_estimate(output_lo.astype(np.float64), output_hi.astype(np.float64), generated)
    else:  # fewest generated
        key = generated
    # The smallest key; among ties the most recently activated (highest row).
    return np.array([int(np.flatnonzero(key == key.min())[-1])])
