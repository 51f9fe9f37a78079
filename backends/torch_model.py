"""Models for the real backend: config presets with seeded weights, local checkpoints, and the paged
attention function that lets any Hugging Face decoder run a packed, mixed prefill/decode batch over
servegym's paged KV cache.

torch and transformers are imported lazily; a missing one raises :class:`MissingExtraError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

ATTENTION_NAME = "servegym_paged"

PRESETS: dict[str, dict[str, Any]] = {
    # The default: a small Llama-architecture model, tens of milliseconds per step on 2 CPU cores.
    "small-llama": {
        "vocab_size": 8192, "hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 8,
        "num_attention_heads": 12, "num_key_value_heads": 4, "max_position_embeddings": 16384,
        "rope_theta": 10000.0, "tie_word_embeddings": True,
    },
    # A few milliseconds per step: for tests.
    "tiny-llama": {
        "vocab_size": 2048, "hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 16384,
        "rope_theta": 10000.0, "tie_word_embeddings": True,
    },
    # The Llama-3.2-3B architecture (random weights): for GPU runs.
    "llama-3.2-3b": {
        "vocab_size": 128256, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
        "num_attention_heads": 24, "num_key_value_heads": 8, "max_position_embeddings": 131072,
        "rope_theta": 500000.0, "tie_word_embeddings": True, "rms_norm_eps": 1e-5,
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192},
    },
}


class MissingExtraError(ImportError):
    """torch or transformers is not installed."""


def require_torch() -> tuple[ModuleType, ModuleType]:
    try:
        import torch
        import transformers
    except ImportError as err:
        raise MissingExtraError(
            f"the real backend needs torch and transformers ({err.name} is missing): "
            "pip install 'servegym[torch]'"
        ) from None
    return torch, transformers


@dataclass
class RowGroup:
    """Sequences attended together: their queries and contexts padded to the group's longest."""

    context_slots: Any  # (B, C) cache slots of each sequence's context, padded with slot 0
    query_index: Any  # (B, Q) packed-token index of each sequence's query tokens, padded with 0
    mask: Any  # (B, 1, Q, C) bool: query may attend to context position
    query_valid: Any  # (B, Q) bool


@dataclass
class PagedBatch:
    """Per-forward metadata the paged attention reads (shared by every layer). Decode rows (one query each)
    and prefill rows form separate groups, so a long prefill chunk does not pad every decode row."""

    slot_mapping: Any  # (T,) cache slot of each packed token
    groups: list[RowGroup]
    k_cache: list  # per layer (slots, kv_heads, head_dim)
    v_cache: list


def paged_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                    **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Attention over the paged cache: write this step's K/V into their slots, then let each sequence's
    query tokens attend to its whole context (one padded SDPA call per row group)."""
    import torch

    meta: PagedBatch = kwargs["servegym_batch"]
    layer = module.layer_idx
    k_cache, v_cache = meta.k_cache[layer], meta.v_cache[layer]
    k_cache[meta.slot_mapping] = key[0].transpose(0, 1).to(k_cache.dtype)
    v_cache[meta.slot_mapping] = value[0].transpose(0, 1).to(v_cache.dtype)
    packed = torch.zeros(query.shape[2], query.shape[1], query.shape[3], dtype=query.dtype, device=query.device)
    repeat = query.shape[1] // k_cache.shape[1]
    for group in meta.groups:
        k = k_cache[group.context_slots].permute(0, 2, 1, 3)  # (B, kv_heads, C, D)
        v = v_cache[group.context_slots].permute(0, 2, 1, 3)
        if repeat > 1:
            k = k.repeat_interleave(repeat, dim=1)
            v = v.repeat_interleave(repeat, dim=1)
        q = query[0][:, group.query_index].permute(1, 0, 2, 3)  # (B, heads, Q, D)
        out = torch.nn.functional.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype),
                                                               attn_mask=group.mask, scale=scaling)
        packed[group.query_index[group.query_valid]] = out.permute(0, 2, 1, 3)[group.query_valid]
    return packed.unsqueeze(0), None


def _no_mask(*args, **kwargs):
    return None


def register_attention() -> None:
    """Make ``servegym_paged`` a valid ``attn_implementation`` (idempotent)."""
    require_torch()
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION_NAME, paged_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, _no_mask)


def load_model(model: str | Path, device: str, dtype: str, seed: int = 0) -> tuple[torch.nn.Module, str]:
    """A preset name (seeded random weights, nothing downloaded) or a local checkpoint directory."""
    torch, transformers = require_torch()
    register_attention()
    torch_dtype = getattr(torch, dtype)
    if str(model) in PRESETS:
        config = transformers.LlamaConfig(**PRESETS[str(model)])
        config._attn_implementation = ATTENTION_NAME
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            net = transformers.LlamaForCausalLM(config)
        name = str(model)
    else:
        path = Path(model)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"model {model!r} is neither a preset ({sorted(PRESETS)}) nor a checkpoint folder with config.json"
            )
        net = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch_dtype,
                                                                attn_implementation=ATTENTION_NAME)
        name = path.name
    return net.to(device=device, dtype=torch_dtype).eval(), name
