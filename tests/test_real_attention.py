"""The real backend's paged attention: host plans by hand, one kernel call per layer, no host syncs."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch.profiler import ProfilerActivity, profile  # noqa: E402

from servegym.backends import attention, torch_backend  # noqa: E402
from servegym.backends.attention import Row, device_plan, paged_attention, plan_step, to_device  # noqa: E402
from servegym.backends.base import StepBatch  # noqa: E402
from servegym.backends.torch_backend import TorchBackend  # noqa: E402
from tests.test_torch_backend import assert_mixed_steps_match_each_request_alone  # noqa: E402

EMPTY = np.zeros(0, dtype=np.int64)
SYNC_OPS = ("aten::nonzero", "aten::item", "aten::_local_scalar_dense", "aten::is_nonzero", "aten::masked_select")
"""Ops that read a device value on the host (boolean-mask indexing runs aten::nonzero)."""
LAYERS = 4  # tiny-llama


# ---------------------------------------------------------------------------------------------- host plans
# Two rows, block size 4: a decode row (context 3 in block 7) and a 2-token prefill chunk (context 5 in
# blocks 2 and 9). Context slots: block b holds slots 4b .. 4b + 3.
ROWS = [Row(0, 1, 3, [7]), Row(1, 2, 5, [2, 9])]


def test_varlen_plan_is_ragged_offsets_and_context_slots():
    plan = plan_step(ROWS, 4, "varlen")
    assert plan.arrays["cu_q"].tolist() == [0, 1, 3]
    assert plan.arrays["cu_k"].tolist() == [0, 3, 8]
    assert plan.arrays["context_slots"].tolist() == [28, 29, 30, 8, 9, 10, 11, 36]
    assert (plan.max_query, plan.max_context) == (2, 5)


def test_padded_plan_pads_rows_and_maps_every_token_back():
    plan = plan_step(ROWS, 4, "padded")
    # Tile 2 (cost (1 + 1) x (2 + 2) = 8) beats tile 1 ((1 + 2) x (1 + 2) = 9): one call of 2 rows x 2 queries.
    (call,) = plan.calls
    assert (call.rows, call.queries, call.context, call.blocks) == (2, 2, 5, 2)
    assert plan.arrays["query_index0"].tolist() == [0, 0, 1, 2]
    assert plan.arrays["query_position0"].tolist() == [2, 0, 3, 4]  # a padded query sees position 0 only
    assert plan.arrays["table0"].tolist() == [7, 0, 2, 9]
    assert plan.arrays["output_index"].tolist() == [0, 2, 3]  # token 0 -> row 0 query 0; tokens 1, 2 -> row 1

    tensors = to_device({"slot_mapping": np.zeros(3, dtype=np.int64), **plan.arrays}, torch.device("cpu"))
    (dev,) = device_plan(plan, tensors, [], [], kv_groups=2).calls
    assert dev["slots"].tolist() == [28, 29, 30, 31, 0, 8, 9, 10, 11, 36]
    # The mask folds 2 query heads per KV head into the query axis: (rows, 1, 2 x queries, context).
    assert dev["mask"].shape == (2, 1, 4, 5)
    expected_row1 = [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]] * 2  # queries at positions 3 and 4, for both heads
    assert dev["mask"][1, 0].int().tolist() == expected_row1
    assert dev["mask"][0, 0].int().tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]] * 2


def test_padded_plan_splits_long_chunks_into_query_tiles():
    rows = [Row(0, 1, 10, [0]), Row(1, 24, 40, [1, 2, 3]), Row(25, 7, 7, [4])]
    # Tile cost (rows after splitting) x (tile + 2): 1 -> 32 x 3 = 96, 4 -> 9 x 6 = 54, 8 -> 5 x 10 = 50,
    # 16 -> 4 x 18 = 72. The 24-token chunk (positions 16..39) becomes three 8-query rows.
    assert attention._query_tile(rows) == 8
    tiled = attention._tile(rows, 8)
    assert [(r.query_start, r.query_len, r.context_len) for r in tiled] == [
        (0, 1, 10), (1, 8, 24), (9, 8, 32), (17, 8, 40), (25, 7, 7)]


def test_grouped_plan_keeps_decode_apart_and_groups_similar_contexts():
    decode = [Row(i, 1, ctx, [i]) for i, ctx in enumerate([44, 10, 40, 31, 12, 41, 43, 42])]
    prefill = [Row(8, 5, 5, [9])]
    groups = attention._groups(decode + prefill, 16)
    # Sorted contexts 10, 12, 31 | 40..44: the first group takes contexts up to 1.5 x 10 + 16 = 31, the limit
    # itself included; the next holds at most 4 rows.
    assert [[r.context_len for r in g] for g in groups] == [[10, 12, 31], [40, 41, 42, 43], [44], [5]]


def test_grouped_plan_maps_tokens_through_calls_of_different_widths():
    # Block size 16. Packed: a decode (token 0, context 10), a 2-token chunk at context 40 (tokens 1, 2), a
    # 3-token prompt (tokens 3..5) and a 2-token chunk at context 5 (tokens 6, 7). Groups: the decode; the
    # contexts 3 and 5 (5 <= 1.5 x 3 + 16); then context 40.
    rows = [Row(0, 1, 10, [0]), Row(1, 2, 40, [1, 2, 3]), Row(3, 3, 3, [4]), Row(6, 2, 5, [5])]
    plan = plan_step(rows, 16, "grouped")
    assert [(c.rows, c.queries, c.context, c.blocks) for c in plan.calls] == [(1, 1, 10, 1), (2, 3, 5, 1),
                                                                              (1, 2, 40, 3)]
    # The middle call pads the 2-token row to 3 queries (positions 3, 4, then 0 for the pad).
    assert plan.arrays["query_index1"].tolist() == [3, 4, 5, 6, 7, 0]
    assert plan.arrays["query_position1"].tolist() == [0, 1, 2, 3, 4, 0]
    assert plan.arrays["table1"].tolist() == [4, 5] and plan.arrays["table2"].tolist() == [1, 2, 3]
    # Outputs concatenate as call 0 (1 row), call 1 (2 x 3 rows, from 1), call 2 (2 rows, from 1 + 6 = 7).
    assert plan.arrays["output_index"].tolist() == [0, 7, 8, 1, 2, 3, 4, 5]


def test_to_device_copies_one_buffer():
    tensors = to_device({"a": np.arange(3), "b": np.arange(5).reshape(1, 5)}, torch.device("cpu"))
    assert tensors["a"].tolist() == [0, 1, 2] and tensors["b"].tolist() == [0, 1, 2, 3, 4]
    assert tensors["a"].untyped_storage().data_ptr() == tensors["b"].untyped_storage().data_ptr()


def test_attention_refuses_sliding_windows_and_soft_caps_at_run_time():
    module = torch.nn.Module()
    module.layer_idx = 0
    q = torch.zeros(1, 2, 1, 4)
    for feature in ("sliding_window", "softcap"):
        with pytest.raises(NotImplementedError, match=f"does not implement {feature}"):
            paged_attention(module, q, q, q, None, servegym_batch=None, **{feature: 8})


# ---------------------------------------------------------------------------------------------- varlen, emulated
def emulated_varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, window_size=(-1, -1),
                         enable_gqa=False, **_):
    """torch's varlen_attn as documented, per sequence on CPU: causal (window (-1, 0)) aligned to the bottom
    right, as FlashAttention 2 does when a sequence has fewer queries than keys."""
    assert window_size == (-1, 0) and enable_gqa
    emulated_varlen_attn.calls += 1
    out = torch.empty_like(query)
    bounds_q, bounds_k = cu_seq_q.tolist(), cu_seq_k.tolist()
    assert max(np.diff(bounds_q)) == max_q and max(np.diff(bounds_k)) == max_k
    groups = query.shape[1] // key.shape[1]
    for i in range(len(bounds_q) - 1):
        q = query[bounds_q[i] : bounds_q[i + 1]].transpose(0, 1)
        k = key[bounds_k[i] : bounds_k[i + 1]].transpose(0, 1).repeat_interleave(groups, 0)
        v = value[bounds_k[i] : bounds_k[i + 1]].transpose(0, 1).repeat_interleave(groups, 0)
        nq, nk = q.shape[1], k.shape[1]
        mask = torch.arange(nk)[None, :] <= torch.arange(nq)[:, None] + (nk - nq)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        out[bounds_q[i] : bounds_q[i + 1]] = o.transpose(0, 1)
    return out


emulated_varlen_attn.calls = 0


@pytest.fixture
def varlen_backend(monkeypatch):
    """A tiny-llama backend whose ``varlen`` kernel is emulated on CPU: checks the plan and the call, not FA."""
    import torch.nn.attention.varlen as varlen_module

    monkeypatch.setattr(varlen_module, "varlen_attn", emulated_varlen_attn)
    monkeypatch.setattr(torch_backend, "varlen_available", lambda device, dtype: True)
    return TorchBackend("tiny-llama", num_kv_blocks=512, keep_logits=True, attention="varlen")


def test_varlen_plan_matches_each_request_alone(varlen_backend):
    assert_mixed_steps_match_each_request_alone(varlen_backend)


def test_varlen_runs_one_call_per_layer(varlen_backend):
    backend = varlen_backend
    backend.execute(StepBatch(EMPTY, EMPTY, np.array([0, 1]), np.array([0, 0]), np.array([20, 9]), np.array([20, 30])))
    emulated_varlen_attn.calls = 0
    backend.execute(StepBatch(np.array([0]), np.array([20]), np.array([1]), np.array([9]), np.array([21]),
                              np.array([30])))
    assert emulated_varlen_attn.calls == LAYERS


# ---------------------------------------------------------------------------------------------- host syncs
def profiled_step(kernel: str) -> dict[str, int]:
    """Op counts of one mixed step (two decodes of contexts 21 and 40, one 21-token chunk at offset 9)."""
    backend = TorchBackend("tiny-llama", num_kv_blocks=256, attention=kernel)
    backend.execute(StepBatch(EMPTY, EMPTY, np.array([0, 1, 2]), np.array([0, 0, 0]), np.array([40, 20, 9]),
                              np.array([40, 20, 30])))
    step = StepBatch(np.array([0, 1]), np.array([40, 20]), np.array([2]), np.array([9]), np.array([21]),
                     np.array([30]))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        backend.execute(step)
    counts: dict[str, int] = {}
    for event in prof.events():
        counts[event.name] = counts.get(event.name, 0) + 1
    return counts


@pytest.mark.parametrize(("kernel", "calls_per_layer"), [("padded", 1), ("grouped", 2)])
def test_a_step_has_no_host_syncs_and_the_expected_attention_calls(kernel, calls_per_layer):
    counts = profiled_step(kernel)
    assert {op: counts[op] for op in SYNC_OPS if op in counts} == {}
    # padded: one SDPA call per layer; grouped: the two decode rows (contexts 41 and 21: 1.5 x 21 + 16 >= 41)
    # form one group and the chunk another.
    assert counts["aten::scaled_dot_product_attention"] == LAYERS * calls_per_layer
