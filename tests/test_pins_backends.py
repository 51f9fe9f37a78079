"""Pins of the schema-2 latency model's summaries and the profile builder's prefill-attention FLOPs, computed by hand
from their definitions on an asymmetric hand-made model (each term a different size, the LM head memory-bound at
two rows and compute-bound at three)."""

from __future__ import annotations

import pytest

from servegym.backends import load_profile
from servegym.backends.build import MODELS, build_profile
from servegym.backends.token_model import TokenLatencyModel

REL = 1e-12
"""Relative tolerance: a sum of five doubles."""


def hand_model() -> TokenLatencyModel:
    """cpu(r) = 1 ms + (r - 1) x 10 us; linear(T) = 10 ms + (T - 1) x 10 us; all-reduce(T) = (T - 1) x 1 us;
    100 ns per KV token read, 10 us per query-key pair; LM head max(1 ms, 0.4 ms per emitting row)."""
    return TokenLatencyModel(
        cpu_rows=(1, 101), cpu_s=(0.001, 0.002), linear_tokens=(1, 1001), linear_s=(0.010, 0.020),
        allreduce_s=(0.0, 0.001), kv_bytes_per_token=100.0, decode_bandwidth_bytes_s=1e6,
        attention_flops_per_pair=10.0, prefill_flops_s=1e6, lm_head_bytes=1000.0, lm_head_flops_per_row=400.0,
        memory_bandwidth_bytes_s=1e6, peak_flops_s=1e6)


def test_decode_s_is_a_batch_of_decodes_each_reading_its_own_context():
    # Rule: decode_s(B, C) is one iteration of B rows and B tokens, reading B x C KV tokens, all B rows emitting.
    cpu, linear, allreduce = 0.001 + 2 * 1e-5, 0.010 + 2 * 1e-5, 2 * 1e-6
    attention, lm_head = 3 * 50 * 1e-4, max(1e-3, 3 * 4e-4)
    assert hand_model().decode_s(3, 50) == pytest.approx(cpu + linear + allreduce + attention + lm_head, rel=REL)


def test_prefill_s_is_whole_prompts_attending_causally():
    # Rule: prefill_s(P, B) is one iteration of B rows and B x P tokens, whose prompts attend causally
    # (B x P (P + 1) / 2 query-key pairs), each row emitting its first token; no KV reads for decodes.
    cpu, linear, allreduce = 0.001 + 1e-5, 0.010 + 199 * 1e-5, 199 * 1e-6
    attention, lm_head = 2 * 100 * 101 / 2 * 1e-5, max(1e-3, 2 * 4e-4)
    assert hand_model().prefill_s(100, batch=2) == pytest.approx(cpu + linear + allreduce + attention + lm_head,
                                                                 rel=REL)


@pytest.mark.parametrize(("model", "tp", "profile"), [("llama3-8b", 1, "a100-llama3-8b"),
                                                      ("llama2-70b", 4, "a100-llama2-70b-tp4")])
def test_prefill_attention_counts_every_query_head(model, tp, profile):
    # Rule: a query-key pair costs 4 x query heads x head_dim FLOPs per layer (QK^T and PV, 2 FLOPs per MAC), split
    # over TP GPUs; grouped-query attention shares KV heads, not the query heads' FLOPs. These models have
    # 4x (8B) and 8x (70B) fewer KV heads than query heads, so counting KV heads would be far too cheap.
    shape = MODELS[model]
    assert shape.kv_heads < shape.heads
    expected = 4.0 * shape.heads * (shape.hidden // shape.heads) * shape.layers / tp
    assert build_profile("a100", model, tp).latency.attention_flops_per_pair == expected
    assert load_profile(profile).latency.attention_flops_per_pair == expected
