"""Paged attention for the real backend: each layer attends the whole packed batch with no host sync.

Once per step the host (numpy) describes every row of the packed batch (its query tokens, its context length
and its block table) and builds the index arrays the kernels need; they reach the device in one copy, with the
step's token ids and positions (:func:`to_device`). Every layer then writes the step's keys and values with
``index_copy_``, gathers the rows' contexts with ``index_select`` and calls the attention kernel; nothing in
the path reads a device value on the host (no boolean-mask indexing, ``nonzero`` or ``item``).

Kernels (``KERNELS``):

- ``varlen``: one call per layer of torch's FlashAttention ``varlen_attn`` over the rows' gathered contexts
  (one ragged sequence, ``cu_seq`` offsets, causal aligned to the bottom right as a row's queries are its
  last tokens). CUDA only: compute capability 8.0 or newer, float16 or bfloat16, torch with
  ``torch.nn.attention.varlen``. The default where it is available.
- ``padded``: one ``scaled_dot_product_attention`` call per layer over every row padded to a common shape.
  Long prefill chunks are split into query tiles (each tile is a row with its own causal limit) so one-token
  decode rows do not pad to a whole chunk. The query heads that share a KV head are folded into the query
  axis, so grouped-query attention needs no ``repeat_interleave`` and CUDA's memory-efficient kernel accepts
  the mask. The CUDA fallback.
- ``grouped``: the ``padded`` call per group of at most ``MAX_GROUP_ROWS`` rows of similar context (decode
  rows apart from prefill rows), still without host syncs. The CPU default: on 2 CPU cores small groups keep
  each gathered context in cache and beat one padded call (docs/REAL_BACKEND.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

KERNELS = ("varlen", "padded", "grouped")
MAX_GROUP_ROWS = 4
"""Rows per ``grouped`` call."""
PADDING_SLACK = 1.5
"""A ``grouped`` group holds contexts up to this factor (plus one block) of its shortest."""
GATHER_WEIGHT = 2
"""Cost of gathering one context token, in query-token units, when choosing the ``padded`` query tile."""


@dataclass(frozen=True)
class Row:
    """One sequence of the packed batch: ``query_len`` tokens from packed index ``query_start``, the last
    ``query_len`` of its ``context_len`` tokens, whose keys sit in ``blocks`` (first blocks first)."""

    query_start: int
    query_len: int
    context_len: int
    blocks: Sequence[int]


@dataclass
class Call:
    """One padded attention call: ``rows`` x ``queries`` padded queries over ``context`` padded keys."""

    rows: int
    queries: int
    context: int
    blocks: int  # block-table width


@dataclass
class HostPlan:
    """A step's attention plan on the host: index arrays (int64) and the static shapes that go with them."""

    kernel: str
    block_size: int
    arrays: dict[str, np.ndarray]
    calls: list[Call] = field(default_factory=list)
    max_query: int = 0
    max_context: int = 0


@dataclass
class StepPlan:
    """What every layer reads: device index tensors built once per step, and the per-layer caches."""

    kernel: str
    slot_mapping: Any  # (T,) cache slot of each packed token
    k_cache: list  # per layer (slots, kv_heads, head_dim)
    v_cache: list
    calls: list[dict[str, Any]] = field(default_factory=list)  # padded/grouped: query_index, slots, mask, shape
    output_index: Any = None  # padded/grouped: (T,) row of each packed token in the concatenated outputs
    varlen: dict[str, Any] = field(default_factory=dict)  # context_slots, cu_q, cu_k, max_q, max_k
    layers_run: int = 0  # layers that ran this plan (a host-side counter: the backend checks every layer did)


def varlen_available(device: torch.device, dtype: torch.dtype) -> bool:
    """True where ``varlen`` can run: CUDA, compute capability >= 8.0, half precision, torch's varlen_attn."""
    import torch

    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
        return False
    if torch.cuda.get_device_capability(device) < (8, 0):
        return False
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


def default_kernel(device: torch.device, dtype: torch.dtype) -> str:
    if device.type == "cpu":
        return "grouped"
    return "varlen" if varlen_available(device, dtype) else "padded"


# ---------------------------------------------------------------------------------------------- host side
def plan_step(rows: Sequence[Row], block_size: int, kernel: str) -> HostPlan:
    """Index arrays for one step. Rows must cover the packed tokens in order (row i's queries follow row
    i - 1's), which is how the backend packs them."""
    if kernel == "varlen":
        return _plan_varlen(rows, block_size)
    if kernel == "padded":
        return _plan_padded([_tile(rows, _query_tile(rows))], block_size, "padded")
    if kernel == "grouped":
        return _plan_padded(_groups(rows, block_size), block_size, "grouped")
    raise ValueError(f"unknown attention kernel {kernel!r}; choose from {KERNELS}")


def _context_slots(row: Row, block_size: int) -> np.ndarray:
    blocks = np.asarray(row.blocks[: -(-row.context_len // block_size)], dtype=np.int64)
    return (blocks[:, None] * block_size + np.arange(block_size)).reshape(-1)[: row.context_len]


def _plan_varlen(rows: Sequence[Row], block_size: int) -> HostPlan:
    query_lens = np.array([r.query_len for r in rows], dtype=np.int64)
    context_lens = np.array([r.context_len for r in rows], dtype=np.int64)
    arrays = {
        "context_slots": np.concatenate([_context_slots(r, block_size) for r in rows]),
        "cu_q": np.concatenate([[0], np.cumsum(query_lens)]),
        "cu_k": np.concatenate([[0], np.cumsum(context_lens)]),
    }
    return HostPlan("varlen", block_size, arrays, max_query=int(query_lens.max()),
                    max_context=int(context_lens.max()))


def _query_tile(rows: Sequence[Row]) -> int:
    """The power-of-two query tile that minimises padded work: rows x (tile + gather) x longest context."""
    longest = max(r.query_len for r in rows)
    tiles = [1 << i for i in range(longest.bit_length() + 1) if 1 << i < 2 * longest]
    return min(tiles, key=lambda t: sum(-(-r.query_len // t) for r in rows) * (t + GATHER_WEIGHT))


def _tile(rows: Sequence[Row], tile: int) -> list[Row]:
    """Split rows longer than ``tile`` queries into rows of at most ``tile`` queries; a piece sees the context
    up to its own last query."""
    out = []
    for r in rows:
        first = r.context_len - r.query_len  # position of the row's first query
        for start in range(0, r.query_len, tile):
            count = min(tile, r.query_len - start)
            out.append(Row(r.query_start + start, count, first + start + count, r.blocks))
    return out


def _groups(rows: Sequence[Row], block_size: int) -> list[list[Row]]:
    """Decode rows apart from prefill rows (a long chunk would pad every one-token query); within each, at most
    MAX_GROUP_ROWS rows of similar context (a group pads to its longest, so cost tracks the sum of contexts)."""
    groups = []
    for part in ([r for r in rows if r.query_len == 1], [r for r in rows if r.query_len > 1]):
        part.sort(key=lambda r: r.context_len)
        while part:
            limit = PADDING_SLACK * part[0].context_len + block_size
            size = next((i for i, r in enumerate(part) if r.context_len > limit), len(part))
            size = min(size, MAX_GROUP_ROWS)
            groups.append(part[:size])
            part = part[size:]
    return groups


def _plan_padded(groups: list[list[Row]], block_size: int, kernel: str) -> HostPlan:
    """One padded call per group: its rows' query indices, query positions and block tables, and where each
    packed token's output lands in the calls' concatenated outputs."""
    arrays: dict[str, np.ndarray] = {}
    calls = []
    total = sum(r.query_len for group in groups for r in group)
    output_index = np.zeros(total, dtype=np.int64)
    offset = 0  # first output row of this call in the concatenated outputs
    for i, group in enumerate(groups):
        b, q = len(group), max(r.query_len for r in group)
        context = max(r.context_len for r in group)
        width = -(-context // block_size)
        query_index = np.zeros((b, q), dtype=np.int64)
        query_position = np.zeros((b, q), dtype=np.int64)  # a padded query sees slot 0 only, so stays finite
        table = np.zeros((b, width), dtype=np.int64)
        for j, r in enumerate(group):
            packed = np.arange(r.query_start, r.query_start + r.query_len)
            query_index[j, : r.query_len] = packed
            query_position[j, : r.query_len] = np.arange(r.context_len - r.query_len, r.context_len)
            used = -(-r.context_len // block_size)
            table[j, :used] = r.blocks[:used]
            output_index[packed] = offset + j * q + np.arange(r.query_len)
        arrays[f"query_index{i}"] = query_index.reshape(-1)
        arrays[f"query_position{i}"] = query_position.reshape(-1)
        arrays[f"table{i}"] = table.reshape(-1)
        calls.append(Call(b, q, context, width))
        offset += b * q
    arrays["output_index"] = output_index
    return HostPlan(kernel, block_size, arrays, calls)


def to_device(arrays: dict[str, np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
    """Copy int64 arrays to ``device`` in one transfer; return views of the one buffer, by name."""
    import torch

    names = list(arrays)
    sizes = [arrays[n].size for n in names]
    flat = np.concatenate([arrays[n].astype(np.int64, copy=False).reshape(-1) for n in names]) if names else \
        np.zeros(0, dtype=np.int64)
    buffer = torch.from_numpy(flat).to(device)
    return dict(zip(names, torch.split(buffer, sizes), strict=True))


def device_plan(host: HostPlan, tensors: dict[str, torch.Tensor], k_cache: list, v_cache: list,
                kv_groups: int) -> StepPlan:
    """Finish the plan on the device, once per step: context slots from the block tables and causal masks
    from query positions (device ops, no host sync). ``kv_groups``: query heads per KV head."""
    import torch

    plan = StepPlan(host.kernel, tensors["slot_mapping"], k_cache, v_cache)
    if host.kernel == "varlen":
        plan.varlen = {"context_slots": tensors["context_slots"], "cu_q": tensors["cu_q"].to(torch.int32),
                       "cu_k": tensors["cu_k"].to(torch.int32), "max_q": host.max_query,
                       "max_k": host.max_context}
        return plan
    device = plan.slot_mapping.device
    within_block = torch.arange(host.block_size, device=device)
    for i, call in enumerate(host.calls):
        table = tensors[f"table{i}"].view(call.rows, call.blocks)
        slots = (table[:, :, None] * host.block_size + within_block).view(call.rows, -1)[:, : call.context]
        position = tensors[f"query_position{i}"].view(call.rows, 1, 1, call.queries, 1)
        mask = torch.arange(call.context, device=device) <= position  # (rows, 1, 1, queries, context)
        mask = mask.expand(-1, -1, kv_groups, -1, -1).reshape(call.rows, 1, kv_groups * call.queries, call.context)
        plan.calls.append({"query_index": tensors[f"query_index{i}"], "slots": slots.reshape(-1), "mask": mask,
                           "shape": call})
    plan.output_index = tensors["output_index"]
    return plan


# ---------------------------------------------------------------------------------------------- device side
def paged_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                    **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The ``servegym_paged`` attention: write this step's K/V into their slots, then attend every row to its
    context with one kernel call (``grouped``: one per group). Query (1, heads, T, head_dim) -> (1, T, heads,
    head_dim)."""
    for feature in ("sliding_window", "softcap"):
        if kwargs.get(feature) is not None:
            raise NotImplementedError(f"servegym's paged attention does not implement {feature} "
                                      f"(layer {module.layer_idx} asked for {feature}={kwargs[feature]})")
    plan: StepPlan = kwargs["servegym_batch"]
    plan.layers_run += 1
    k_cache, v_cache = plan.k_cache[module.layer_idx], plan.v_cache[module.layer_idx]
    k_cache.index_copy_(0, plan.slot_mapping, key[0].transpose(0, 1).to(k_cache.dtype))
    v_cache.index_copy_(0, plan.slot_mapping, value[0].transpose(0, 1).to(v_cache.dtype))
    q = query[0].transpose(0, 1)  # (T, heads, head_dim)
    if plan.kernel == "varlen":
        out = _varlen(q, k_cache, v_cache, plan.varlen, scaling)
    else:
        outputs = [_padded_call(q, k_cache, v_cache, call, scaling) for call in plan.calls]
        out = (outputs[0] if len(outputs) == 1 else _cat(outputs)).index_select(0, plan.output_index)
    return out.unsqueeze(0), None


def _cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    import torch

    return torch.cat(tensors)


def _varlen(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: dict[str, Any],
            scaling: float | None) -> torch.Tensor:
    from torch.nn.attention.varlen import varlen_attn

    k = k_cache.index_select(0, meta["context_slots"])
    v = v_cache.index_select(0, meta["context_slots"])
    return varlen_attn(q.contiguous(), k, v, meta["cu_q"], meta["cu_k"], meta["max_q"], meta["max_k"],
                       scale=scaling, window_size=(-1, 0), enable_gqa=True)


def _padded_call(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, call: dict[str, Any],
                 scaling: float | None) -> torch.Tensor:
    """One SDPA call; returns (rows x queries, heads, head_dim) in padded row-major order."""
    import torch

    shape: Call = call["shape"]
    rows, queries, context = shape.rows, shape.queries, shape.context
    heads, head_dim = q.shape[1], q.shape[2]
    kv_heads = k_cache.shape[1]
    groups = heads // kv_heads
    k = k_cache.index_select(0, call["slots"]).view(rows, context, kv_heads, head_dim).transpose(1, 2)
    v = v_cache.index_select(0, call["slots"]).view(rows, context, kv_heads, head_dim).transpose(1, 2)
    # Fold the query heads of each KV head into the query axis: (rows, kv_heads, groups x queries, head_dim).
    qq = q.index_select(0, call["query_index"]).view(rows, queries, kv_heads, groups, head_dim)
    qq = qq.permute(0, 2, 3, 1, 4).reshape(rows, kv_heads, groups * queries, head_dim)
    out = torch.nn.functional.scaled_dot_product_attention(qq, k.to(q.dtype), v.to(q.dtype), attn_mask=call["mask"],
                                                           scale=scaling)
    out = out.view(rows, kv_heads, groups, queries, head_dim).permute(0, 3, 1, 2, 4)
    return out.reshape(rows * queries, heads, head_dim)


def register_attention(name: str) -> None:
    """Make ``name`` a valid ``attn_implementation`` running :func:`paged_attention` (idempotent). No mask
    function is registered: transformers then skips mask creation, whose packed-sequence check reads a device
    value (one host sync per forward)."""
    from transformers import AttentionInterface

    AttentionInterface.register(name, paged_attention)
