"""Engine configuration: a frozen dataclass validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from servegym.validation import boolean, count, positive_int, positive_number


class PreemptionRule(StrEnum):
    """Which running requests are evicted (by recompute) when an iteration would overflow the KV cache."""

    LIFO = "lifo"
    """Most recently activated first (vLLM; the flow-control paper)."""
    CLEAR_ALL = "clear_all"
    """Evict every running request (alpha-protection greedy)."""
    FEWEST_GENERATED = "fewest_generated"
    """Fewest generated tokens first, newest first on ties."""
    SHORTEST_PREDICTED = "shortest_predicted"
    """Ascending predicted output length, newest first on ties; the prediction is A_min's estimate: the lower
    end of the observed interval, doubled each time the request outgrows it (Chen, Ye, Zhou 2025)."""


class Recompute(StrEnum):
    """What an evicted request keeps of its progress when it is admitted again."""

    KEEP_OUTPUT = "keep_output"
    """vLLM's recompute: its generated tokens stay generated; the prefill re-ingests prompt plus output."""
    RESTART = "restart"
    """The scheduling papers' model (Dong & Cao; Jaillet et al.): an overflow loses the request's progress, and it
    starts again from its prompt, regenerating every output token."""


class LengthMode(StrEnum):
    """What a policy may know about each request's output length."""

    KNOWN = "known"
    """The observed interval is ``[true, true]``."""
    PREDICTED = "predicted"
    """A published predictor's seeded interval ``[lo, hi]``, as often wrong as the predictor: the truth lies
    outside it for about one request in six (up to 10% on each side; :mod:`servegym.engine.prediction`)."""
    UNKNOWN = "unknown"
    """The observed interval is ``[1, max_tokens]``."""
    TRUTH_INTERVAL = "truth_interval"
    """A seeded interval ``[lo, hi]`` built from the true length, which it always contains (``prediction_error``
    sets its width): what ``predicted`` meant in Serving-v0 and -v1, far better than real predictors."""


LENGTH_MODES = tuple(mode.value for mode in LengthMode)
"""The length modes' names, for CLIs and file validation."""


def as_enum(enum: type[StrEnum], name: str, value: object) -> StrEnum:
    """``enum(value)`` with an error that names the field and the allowed values."""
    try:
        return enum(value)
    except ValueError:
        raise ValueError(f"{name} must be one of {[m.value for m in enum]}, got {value!r}") from None


@dataclass(frozen=True)
class EngineConfig:
    """Scheduler-independent settings of one serving engine (one container)."""

    max_num_seqs: int = field(default=128, metadata={"help": "most requests running (prefilling or decoding) at once"})
    max_num_batched_tokens: int = field(
        default=2048, metadata={"help": "per-iteration token budget: decode tokens plus prefill chunk tokens"}
    )
    prefill_chunk_tokens: int = field(
        default=512, metadata={"help": "most prompt tokens one request ingests in one iteration (chunked prefill)"}
    )
    max_prefill_tokens: int | None = field(
        default=None, metadata={"help": "per-iteration cap on prefill tokens over all requests (None: no cap)"}
    )
    preemption: PreemptionRule = field(
        default=PreemptionRule.LIFO, metadata={"help": "victim rule when an iteration would overflow the KV cache"}
    )
    recompute: Recompute = field(
        default=Recompute.KEEP_OUTPUT, metadata={"help": "what an evicted request keeps: keep_output or restart"}
    )
    length_mode: LengthMode = field(
        default=LengthMode.UNKNOWN,
        metadata={"help": "what policies observe of output lengths: known, predicted (a published predictor's "
                  "errors), unknown, or truth_interval (an interval that contains the truth)"},
    )
    prediction_error: float = field(
        default=0.5,
        metadata={"help": "truth_interval mode: lo >= true*(1-e*u1), hi <= true*(1+e*u2), u ~ U(0,1), seeded "
                  "(predicted mode's errors are a published predictor's)"},
    )
    max_tokens: int = field(
        default=2048,
        metadata={"help": "per-request output cap; longer outputs stop here (counted as truncated)"},
    )
    num_kv_blocks: int | None = field(default=None, metadata={"help": "override the backend's KV block count"})
    block_size: int | None = field(default=None, metadata={"help": "override the backend's tokens per KV block"})
    itl_smoothing: float = field(
        default=0.2, metadata={"help": "EMA weight of the newest step in the smoothed ITL and KV-rate signals"}
    )
    idle_tick_s: float | None = field(
        default=None,
        metadata={"help": "clock advance of an iteration with nothing to run while requests wait "
                  "(None: the backend's baseline step latency)"},
    )
    prefix_caching: bool = field(
        default=False, metadata={"help": "reuse cached KV of shared prompt prefixes across requests (vLLM's automatic "
                                 "prefix caching; docs/KV_REUSE.md)"})
    host_kv_tokens: int = field(
        default=0, metadata={"help": "KV tokens a host-memory tier keeps of prefixes evicted from GPU memory "
                             "(0: none); a hit there is copied back over the host link"})
    host_link_bytes_s: float | None = field(
        default=None, metadata={"help": "host-to-GPU copy bandwidth (bytes/s) of host-tier hits (None: the "
                                "backend's GPU's data-sheet figure, backends/host_link.py)"})
    check_invariants: bool = field(
        default=False, metadata={"help": "verify request conservation and KV accounting after every step (slow)"}
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "preemption", as_enum(PreemptionRule, "preemption", self.preemption))
        object.__setattr__(self, "recompute", as_enum(Recompute, "recompute", self.recompute))
        object.__setattr__(self, "length_mode", as_enum(LengthMode, "length_mode", self.length_mode))
        for name in ("max_num_seqs", "max_num_batched_tokens", "prefill_chunk_tokens", "max_tokens"):
            positive_int(name, getattr(self, name))
        for name in ("num_kv_blocks", "block_size", "max_prefill_tokens"):
            if getattr(self, name) is not None:
                positive_int(name, getattr(self, name))
        if self.prefill_chunk_tokens > self.max_num_batched_tokens:
            raise ValueError(
                f"prefill_chunk_tokens ({self.prefill_chunk_tokens}) exceeds max_num_batched_tokens "
                f"({self.max_num_batched_tokens}): no chunk could ever be scheduled"
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs ({self.max_num_seqs}) "
                "so that every running request can decode each iteration"
            )
        if not 0.0 <= self.prediction_error < 1.0:
            raise ValueError(f"prediction_error must be in [0, 1), got {self.prediction_error}")
        if not 0.0 < self.itl_smoothing <= 1.0:
            raise ValueError(f"itl_smoothing must be in (0, 1], got {self.itl_smoothing}")
        if self.idle_tick_s is not None and not self.idle_tick_s > 0.0:
            raise ValueError(f"idle_tick_s must be > 0, got {self.idle_tick_s}")
        boolean("check_invariants", self.check_invariants)
        boolean("prefix_caching", self.prefix_caching)
        count("host_kv_tokens", self.host_kv_tokens, "tokens", low=0)
        if self.host_kv_tokens and not self.prefix_caching:
            raise ValueError("host_kv_tokens needs prefix_caching: the host tier keeps evicted prefix blocks")
        if self.host_link_bytes_s is not None:
            positive_number("host_link_bytes_s", self.host_link_bytes_s)
