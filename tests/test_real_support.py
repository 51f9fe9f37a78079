"""Checkpoints whose attention the real backend does not implement are refused at load, one test per feature;
supported architectures load and match their own stock attention."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from servegym.backends.base import StepBatch  # noqa: E402
from servegym.backends.support import UnsupportedModelError, unsupported_attention  # noqa: E402
from servegym.backends.torch_backend import TorchBackend  # noqa: E402
from tests.test_torch_backend import reference_logits  # noqa: E402

TINY = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}
EMPTY = np.zeros(0, dtype=np.int64)


def save_tiny(path, config, model_class=transformers.AutoModelForCausalLM):
    """A checkpoint folder (config and random weights) of a config-built tiny model."""
    torch.manual_seed(0)
    model_class.from_config(config).save_pretrained(path)
    return path


REFUSED = {
    "gemma2-sliding-layers": (lambda: transformers.Gemma2Config(**TINY, head_dim=8), "sliding-window attention"),
    "mistral-sliding-window": (lambda: transformers.MistralConfig(**TINY, sliding_window=16),
                               r"sliding-window attention \(sliding_window=16\)"),
    "qwen2-sliding-layers": (lambda: transformers.Qwen2Config(**TINY, use_sliding_window=True, sliding_window=16,
                                                              max_window_layers=1), "sliding-window attention"),
    "gemma2-soft-capping": (lambda: transformers.Gemma2Config(**TINY, head_dim=8, sliding_window=None,
                                                              layer_types=["full_attention"] * 2),
                            r"soft-capping \(attn_logit_softcapping=50.0\)"),
    "bloom-alibi": (lambda: transformers.BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=4), "ALiBi"),
    "falcon-alibi": (lambda: transformers.FalconConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                                       num_attention_heads=4, alibi=True), "ALiBi"),
    "mpt-alibi": (lambda: transformers.MptConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4), "ALiBi"),
    "gpt2-cross-attention": (lambda: transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4,
                                                             add_cross_attention=True), "cross-attention"),
    "t5-encoder-decoder": (lambda: transformers.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=1,
                                                         num_heads=4), "encoder-decoder"),
    "bert-encoder": (lambda: transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                                     num_attention_heads=4, intermediate_size=64),
                     "bidirectional encoder"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_attention_is_refused_at_load(tmp_path, case):
    build, feature = REFUSED[case]
    config = build()
    model_class = transformers.AutoModel if case in ("t5-encoder-decoder", "bert-encoder") else \
        transformers.AutoModelForCausalLM
    path = save_tiny(tmp_path / case, config, model_class)
    with pytest.raises(UnsupportedModelError, match=feature):
        TorchBackend(str(path), num_kv_blocks=16)


def config(**attributes):
    """A config as the check reads it: attributes looked up with getattr, nothing else."""
    return SimpleNamespace(model_type="custom", **attributes)


def test_the_config_check_reads_layer_types_and_the_window_flag():
    # Chunked local layers are refused by their layer types alone (no attention_chunk_size here).
    chunked = config(layer_types=["full_attention", "chunked_attention", "full_attention", "chunked_attention"])
    assert unsupported_attention(chunked) == "chunked local attention (layer_types: layers [1, 3])"
    # A window is refused when the config does not switch it off and names no layer types ...
    assert unsupported_attention(config(sliding_window=4096)) == "sliding-window attention (sliding_window=4096)"
    assert unsupported_attention(config(sliding_window=4096, use_sliding_window=True)) is not None
    # ... but not when use_sliding_window is False (Qwen2 checkpoints' config.json files set a window beside
    # use_sliding_window: false), nor when layer types say every layer is full attention.
    assert unsupported_attention(config(sliding_window=32768, use_sliding_window=False)) is None
    assert unsupported_attention(config(sliding_window=4096, layer_types=["full_attention"] * 2)) is None


SUPPORTED = {
    "llama": lambda: transformers.LlamaConfig(**TINY),
    "qwen2-no-sliding": lambda: transformers.Qwen2Config(**TINY),  # qkv biases, use_sliding_window False
    "mistral-window-none": lambda: transformers.MistralConfig(**TINY, sliding_window=None),
}


@pytest.mark.parametrize("case", sorted(SUPPORTED))
def test_supported_checkpoints_load_and_match_their_stock_attention(tmp_path, case):
    path = save_tiny(tmp_path / case, SUPPORTED[case]())
    backend = TorchBackend(str(path), num_kv_blocks=16, block_size=4, keep_logits=True)
    assert backend.cold_start_s == backend.load_s > 0 and backend.load_kind == "checkpoint load"
    backend.execute(StepBatch(EMPTY, EMPTY, np.array([0]), np.array([0]), np.array([9]), np.array([9])))
    backend.execute(StepBatch(np.array([0]), np.array([9]), EMPTY, EMPTY, EMPTY, EMPTY))
    tokens = backend.request_tokens(0)
    np.testing.assert_allclose(backend.last_logits[0], reference_logits(backend.model, tokens[:-1]),
                               atol=1e-5, rtol=1e-5)
