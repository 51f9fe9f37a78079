"""Which models the real backend can run: decoder-only causal LMs whose attention is plain (optionally grouped-
query) softmax attention over rotary or learned positions. Anything else would run silently wrong (a Gemma-2
checkpoint gave logits off by 0.445 with its sliding windows and soft-capping ignored), so it is refused at load
with the feature named.

:func:`unsupported_attention` reads only the config, so a checkpoint is refused before its weights load;
:func:`~servegym.backends.attention.paged_attention` also refuses a sliding window or soft-cap passed at run
time, for models that set them in ways the config check does not know.
"""

from __future__ import annotations

from typing import Any

ALIBI_MODEL_TYPES = ("bloom",)
"""Model types that always use ALiBi position biases."""


class UnsupportedModelError(ValueError):
    """The model's attention is not what servegym's paged attention computes."""


def unsupported_attention(config: Any) -> str | None:
    """The first attention feature of ``config`` that the backend does not implement, in words; None if none."""
    if getattr(config, "is_encoder_decoder", False):
        return "an encoder-decoder model (cross-attention to an encoder)"
    if getattr(config, "add_cross_attention", False):
        return "cross-attention (add_cross_attention=True)"
    if getattr(config, "is_decoder", None) is False:
        return f"a bidirectional encoder ({config.model_type} with is_decoder=False), not a causal decoder"
    layer_types = getattr(config, "layer_types", None) or []
    for feature, word in (("sliding-window attention", "sliding"), ("chunked local attention", "chunked")):
        layers = [i for i, kind in enumerate(layer_types) if word in str(kind)]
        if layers:
            return f"{feature} (layer_types: layers {layers[:4]}{'...' if len(layers) > 4 else ''})"
    window = getattr(config, "sliding_window", None)
    if window is not None and getattr(config, "use_sliding_window", True) and not layer_types:
        return f"sliding-window attention (sliding_window={window})"
    if getattr(config, "attention_chunk_size", None) is not None:
        return f"chunked local attention (attention_chunk_size={config.attention_chunk_size})"
    softcap = getattr(config, "attn_logit_softcapping", None)
    if softcap is not None:
        return f"attention logit soft-capping (attn_logit_softcapping={softcap})"
    if _uses_alibi(config):
        return "ALiBi position biases"
    return None


def _uses_alibi(config: Any) -> bool:
    if config.model_type in ALIBI_MODEL_TYPES:
        return True
    if getattr(config, "alibi", False) or getattr(config, "position_embedding_type", None) == "alibi":
        return True
    attn_config = getattr(config, "attn_config", None)  # MPT keeps it here
    return bool(getattr(attn_config, "alibi", False))


def check_supported(config: Any, name: str) -> None:
    """Raise :class:`UnsupportedModelError` naming the first unsupported attention feature of ``config``."""
    feature = unsupported_attention(config)
    if feature is not None:
        raise UnsupportedModelError(f"model {name!r} uses {feature}, which servegym's paged attention does not "
                                    "implement; it would run silently wrong, so it is refused")
