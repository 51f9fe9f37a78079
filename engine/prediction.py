"""Output-length predictions: the interval ``[lo, hi]`` a policy observes in the ``predicted`` and
``truth_interval`` length modes (:class:`~servegym.engine.config.LengthMode`).

``predicted`` follows a published predictor, errors included. Zheng, Ren, Xue, Luo, Jiang, You, "Response
Length Perception and Sequence Scheduling: An LLM-Empowered LLM Inference Pipeline" (NeurIPS 2023): an
instruction-tuned Vicuna-7B (LoRA) predicts its own response length before answering. Their repository
(github.com/zhengzangw/Sequence-Scheduling, README, "Response Length Perception", step 4) reports, over 1,000
Alpaca validation prompts scored against the longest of four sampled responses (``src/eval.py``): mean absolute
error 62 tokens, 59% of predictions within 50 tokens of the truth (Acc-50), 81% within 100 (Acc-100).

The model: a point prediction with multiplicative log-normal error on the length plus ``SHIFT_TOKENS``,
``p = (true + c) * exp(sigma * z) - c`` with ``z ~ N(0, 1)``, rounded and clipped to ``[1, max_tokens]``. The
shift gives short responses an error of tens of tokens (a pure relative error predicts them too well: fitted to
the 62-token error it reaches 64% Acc-50, not 59%). ``c = 80`` and ``sigma = 0.33`` were fitted to the three
figures on the lengths their ``src/eval.py`` scores (``data/alpaca-val-10k-length.json`` at commit 28df6d8, its
first 1,000 rows), where they give 62.5 tokens, 58.7% and 81.3% (means over 300 seeds; one seed's spread is 1.9
tokens, 1.3 and 1.2 points). The observed interval is the central 80% band of the truth given ``p`` (the error
model's 10th and 90th percentiles), so the truth lies above ``hi`` for up to 10% of requests and below ``lo`` for
up to 10% (fewer where a prediction clipped to 1 token widens the band: 7% and 9.7% on the paper's lengths, 10%
each for long responses). Policies must cope with both.

``truth_interval`` (drawn in :func:`servegym.pool.length_intervals`) is what servegym called ``predicted`` before:
built from the true length, it always contains it, and its midpoint is far closer to the truth than any published
predictor's (kept so that earlier results reproduce; Serving-v0 and -v1 still mean it by ``predicted``).
"""

from __future__ import annotations

import numpy as np

SHIFT_TOKENS = 80.0
"""``c``: tokens added to the length before the multiplicative error (short responses' absolute error)."""
LOG_SIGMA = 0.33
"""``sigma``: the standard deviation of ``log((p + c) / (true + c))``."""
INTERVAL_Z = 1.2815515655446004
"""The standard normal's 90th percentile: ``[lo, hi]`` is the central 80% band of the truth given ``p``."""


def predict_lengths(output: np.ndarray, rng: np.random.Generator, max_tokens: int) -> np.ndarray:
    """The predictor's point prediction for each true output length (one normal draw each, from ``rng``)."""
    z = rng.standard_normal(output.size)
    predicted = np.rint((output + SHIFT_TOKENS) * np.exp(LOG_SIGMA * z) - SHIFT_TOKENS)
    return np.clip(predicted, 1, max_tokens).astype(np.int64)


def predicted_interval(predicted: np.ndarray, max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """``[lo, hi]`` around point predictions: the truths' central 80% band given ``p``, within ``[1, max_tokens]``;
    ``lo <= p <= hi``."""
    spread = np.exp(LOG_SIGMA * INTERVAL_Z)
    shifted = predicted + SHIFT_TOKENS
    lo = np.maximum(1, np.floor(shifted / spread - SHIFT_TOKENS)).astype(np.int64)
    hi = np.minimum(max_tokens, np.ceil(shifted * spread - SHIFT_TOKENS)).astype(np.int64)
    return lo, hi

