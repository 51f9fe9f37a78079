"""What the engine shows the rest of the package: its running table's columns, one iteration's outcome and the
order it writes its part of an observation in. Plain Python, shared by the compiled and the interpreted engine."""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple


class Col(IntEnum):
    """Columns of the engine's running table (one int64 row per running request, in activation order).

    The first six are what policies observe of a running request (:data:`RUNNING_OBS_COLUMNS`).
    """

    NUM_PROMPT_TOKENS = 0
    NUM_KV_TOKENS = 1
    """Tokens held in the KV cache (prompt ingested so far plus generated tokens)."""
    NUM_GENERATED = 2
    """Output tokens generated, counting those recomputed after a preemption."""
    OUTPUT_LO = 3
    OUTPUT_HI = 4
    """The output-length interval policies observe (see ``LengthMode``)."""
    NUM_PREFILL_LEFT = 5
    """Tokens still to ingest before the request decodes (0 once decoding)."""
    REQUEST_ID = 6
    NUM_OUTPUT_TOKENS = 7
    """The true output length: the request finishes when it has generated this many."""
    SEGMENT_START = 8
    """The step of the request's first token in its current decode segment (-1 before it)."""
    PREFILL_TARGET = 9
    """Tokens the prefill ingests in all: prompt plus output tokens to recompute."""


RUNNING_OBS_COLUMNS = ("num_prompt_tokens", "num_kv_tokens", "num_generated", "output_lo", "output_hi",
                       "num_prefill_left")
"""Names of the observable running-table columns, ``Col`` 0-5 in order."""

ENGINE_FEATURES = (
    "itl_last_s", "itl_smoothed_s", "baseline_step_s", "num_running", "num_prefilling", "token_load", "num_waiting",
    "kv_free_frac", "kv_free_delta", "kv_capacity_tokens", "kv_block_size", "last_num_preemptions",
    "last_num_admitted", "last_num_finished", "length_mode", "prefill_chunk_tokens", "max_num_batched_tokens",
)
"""The order ``Engine.observe`` writes ``obs["engine"]`` in (observation.py checks it against its schema)."""
QUEUE_FEATURES = ("num_prompt_tokens", "wait_s", "wait_steps", "output_lo", "output_hi", "num_generated")
"""The order ``Engine.observe`` writes a queue row in (checked the same way)."""
POOL_FEATURES = ("deciding", "warmth", "idle_s", "num_waiting", "num_running", "kv_free_frac")
"""The order ``Engine.observe_pool`` writes a container's row of ``obs["pool"]`` in (checked the same way)."""


class StepOutcome(NamedTuple):
    """What one iteration of one engine did. Counts are of requests unless named tokens."""

    dt_s: float
    num_decode_tokens: int
    """Output tokens emitted (decodes plus first tokens of completed prefills)."""
    num_prefill_tokens: int
    num_admitted: int
    num_refused: int
    """Requests the action asked to admit that did not fit (admission stops at the first)."""
    num_preemptions: int
    num_finished: int


IDLE = StepOutcome(0.0, 0, 0, 0, 0, 0, 0)
