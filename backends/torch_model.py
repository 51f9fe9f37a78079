"""Models for the real backend: config presets with seeded weights built on the target device in the target
dtype, and local checkpoints, both running attention through ``servegym_paged``
(:mod:`servegym.backends.attention`).

torch and transformers are imported lazily; a missing one raises :class:`MissingExtraError`.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from servegym.backends.support import check_supported

if TYPE_CHECKING:
    import torch

ATTENTION_NAME = "servegym_paged"
DTYPES = ("float32", "float16", "bfloat16")

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


def register_attention() -> None:
    """Make ``servegym_paged`` a valid ``attn_implementation`` (idempotent)."""
    require_torch()
    from servegym.backends.attention import register_attention as register

    register(ATTENTION_NAME)


@contextmanager
def _default_dtype(torch: ModuleType, dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@dataclass
class LoadedModel:
    model: torch.nn.Module
    name: str
    seconds: float
    """Wall time to build (preset) or load (checkpoint) the weights onto the device."""
    from_checkpoint: bool
    """True when weights were read from a checkpoint; False for a preset's seeded random initialisation."""


def torch_dtype(torch: ModuleType, dtype: str) -> torch.dtype:
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    return getattr(torch, dtype)


def build_preset(name: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    """A preset's seeded random weights, created directly on ``device`` in ``dtype`` (no float32 or host copy).
    The same seed gives the same weights on the same kind of device (CPU and CUDA generators differ)."""
    torch, transformers = require_torch()
    register_attention()
    config = transformers.LlamaConfig(**PRESETS[name])
    config._attn_implementation = ATTENTION_NAME
    devices = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.device(device), _default_dtype(torch, dtype):
        torch.manual_seed(seed)
        return transformers.LlamaForCausalLM(config).eval()


def load_model(model: str | Path, device: torch.device, dtype: torch.dtype, seed: int = 0) -> LoadedModel:
    """A preset name (seeded random weights, nothing downloaded) or a local checkpoint directory, on ``device``
    in ``dtype``. A checkpoint whose attention the backend does not implement is refused before it loads."""
    torch, transformers = require_torch()
    register_attention()
    start = time.perf_counter()
    if str(model) in PRESETS:
        net, name, from_checkpoint = build_preset(str(model), device, dtype, seed), str(model), False
    else:
        path = Path(model)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"model {model!r} is neither a preset ({sorted(PRESETS)}) nor a checkpoint folder with config.json"
            )
        check_supported(transformers.AutoConfig.from_pretrained(path, local_files_only=True), path.name)
        # Straight onto a GPU needs accelerate (device_map); without it the weights pass through host memory.
        direct = device.type == "cuda" and importlib.util.find_spec("accelerate") is not None
        net = transformers.AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, dtype=dtype, attn_implementation=ATTENTION_NAME,
            **({"device_map": str(device)} if direct else {}))
        net = net if direct else net.to(device)
        name, from_checkpoint = path.name, True
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return LoadedModel(net.eval(), name, time.perf_counter() - start, from_checkpoint)
