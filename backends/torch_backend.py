"""The real backend: a Hugging Face model runs every iteration over a paged KV cache, timed by the clock.

Design: a compact engine on the model's own forward. Each iteration packs every decode token and every
prefill chunk of the batch into one sequence (batch size 1, explicit positions) and runs one forward pass; a
registered attention implementation (``servegym_paged``) writes the new keys and values into their cache
slots and lets each request attend to its own context, gathered from its blocks. Chosen over transformers'
continuous-batching internals because it depends only on the public attention registry, works for any
decoder that dispatches attention through it, and keeps block allocation in step with the engine's
accounting: a request holds ``ceil(tokens / block_size)`` blocks, counting its prompt so far and every
token it has generated (the newest one's slot is reserved before its key is written).

Request lengths follow the workload: the engine decides when a request stops; tokens come from greedy (or
seeded sampled) decoding of the real logits. Prompts are seeded random token ids.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from servegym.backends.base import StepBatch
from servegym.backends.torch_model import PagedBatch, RowGroup, load_model, require_torch

MAX_GROUP_ROWS = 4
"""Rows per attention call: small groups keep each gathered context in cache (on 2 CPU cores, groups of 4
decode 64 requests of mixed contexts 4.5x faster than one padded call)."""
PADDING_SLACK = 1.5
"""A row group holds contexts up to this factor (plus one block) of its shortest."""


@dataclass
class _Request:
    tokens: list[int]  # prompt, then every generated token
    cached: int = 0  # tokens whose key/value sit in the cache
    blocks: list[int] = field(default_factory=list)


class TorchBackend:
    """Runs a real model on CPU or CUDA.

    Args:
        model: a preset built with seeded random weights (``small-llama``, the default; ``tiny-llama`` for
            tests; ``llama-3.2-3b``, the TWP paper's architecture, for GPUs), or a local checkpoint folder.
        device: ``cuda`` or ``cpu``; default ``cuda`` when available.
        dtype: torch dtype name; default ``float32`` on CPU and ``bfloat16`` on CUDA.
        num_kv_blocks, block_size: the paged cache (the engine accounts in the same blocks).
        sampling: ``greedy`` or ``sample`` (seeded by the episode).
        seed: seed of the preset's random weights.
        keep_logits: keep the last logits of each request (for tests).
        threads: torch CPU threads (default: torch's choice).
        clock: seconds since some origin; the forward pass is timed with it. Wall-clock timing makes episodes
            irreproducible by nature; a deterministic clock (tests) makes them repeatable.
    """

    def __init__(self, model: str | Path = "small-llama", device: str | None = None, dtype: str | None = None,
                 num_kv_blocks: int = 2048, block_size: int = 16, sampling: str = "greedy", seed: int = 0,
                 keep_logits: bool = False, threads: int | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        torch, transformers = require_torch()
        if sampling not in ("greedy", "sample"):
            raise ValueError(f"sampling must be 'greedy' or 'sample', got {sampling!r}")
        if num_kv_blocks < 1 or block_size < 1:
            raise ValueError("num_kv_blocks and block_size must be >= 1")
        if threads:
            torch.set_num_threads(threads)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.dtype = dtype or ("bfloat16" if self.device.startswith("cuda") else "float32")
        self.model, self.model_name = load_model(model, self.device, self.dtype, seed)
        cfg = self.model.config
        self.num_kv_blocks, self.block_size = num_kv_blocks, block_size
        self.owns_cache = True  # the engine must account in exactly these blocks
        self.baseline_step_s: float | None = None
        self.sampling, self.keep_logits = sampling, keep_logits
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        shape = (num_kv_blocks * block_size, cfg.num_key_value_heads, head_dim)
        kwargs = {"dtype": getattr(torch, self.dtype), "device": self.device}
        self.k_cache = [torch.zeros(shape, **kwargs) for _ in range(cfg.num_hidden_layers)]
        self.v_cache = [torch.zeros(shape, **kwargs) for _ in range(cfg.num_hidden_layers)]
        self.versions = {"torch": torch.__version__, "transformers": transformers.__version__}
        self._torch = torch
        self._clock = clock
        self.reset(np.random.default_rng(0))

    # ------------------------------------------------------------------ Backend protocol
    def reset(self, rng: np.random.Generator) -> None:
        self._seed = int(rng.integers(1 << 31))
        self._free = list(range(self.num_kv_blocks - 1, -1, -1))
        self._requests: dict[int, _Request] = {}
        self._generator = self._torch.Generator(device=self.device).manual_seed(self._seed)
        self.forward_s: list[float] = []
        self.overhead_s: list[float] = []
        self.last_logits: dict[int, np.ndarray] = {}

    def release(self, request_ids: np.ndarray) -> None:
        """Free the cache of finished or preempted requests (their tokens stay, for recompute)."""
        for rid in request_ids.tolist():
            req = self._requests.get(rid)
            if req is not None:
                self._free.extend(reversed(req.blocks))
                req.blocks, req.cached = [], 0

    def execute(self, batch: StepBatch) -> float:
        torch, clock = self._torch, self._clock
        start = clock()
        ids, positions, slots, rows, emit = self._pack(batch)
        meta = self._metadata(rows, slots)
        tokens = torch.as_tensor(ids, device=self.device).unsqueeze(0)
        pos = torch.as_tensor(positions, device=self.device).unsqueeze(0)
        keep = torch.as_tensor([index for _, index in emit], device=self.device, dtype=torch.long)
        prepared = clock()
        with torch.inference_mode():
            logits = self.model(input_ids=tokens, position_ids=pos, use_cache=False, logits_to_keep=keep,
                                servegym_batch=meta).logits[0]
            if self.device.startswith("cuda"):
                torch.cuda.synchronize()
        forward = clock() - prepared
        self._sample(emit, logits)
        self.forward_s.append(forward)
        self.overhead_s.append(clock() - start - forward)
        return forward

    # ------------------------------------------------------------------ internals
    def allocated_blocks(self) -> int:
        return self.num_kv_blocks - len(self._free)

    def request_tokens(self, rid: int) -> list[int]:
        return list(self._requests[rid].tokens)

    def _request(self, rid: int, target: int) -> _Request:
        req = self._requests.get(rid)
        if req is None:
            rng = np.random.default_rng([self._seed, rid])
            vocab = self.model.config.vocab_size
            req = _Request(rng.integers(0, vocab, size=target).tolist())
            self._requests[rid] = req
        return req

    def _reserve(self, req: _Request, tokens: int) -> None:
        need = -(-tokens // self.block_size) - len(req.blocks)
        if need > len(self._free):
            raise RuntimeError("the paged KV cache is full: the engine's block accounting was bypassed")
        for _ in range(need):
            req.blocks.append(self._free.pop())

    def _slots(self, req: _Request, first: int, count: int) -> list[int]:
        bs = self.block_size
        return [req.blocks[p // bs] * bs + p % bs for p in range(first, first + count)]

    def _pack(self, batch: StepBatch):
        """Pack decode tokens then prefill chunks; return token ids, positions, new-token slots, per-row
        (query start, query length, context slots), and which packed index emits which request's token."""
        ids, positions, slots, rows, emit = [], [], [], [], []
        for rid in batch.decode_ids.tolist():
            req = self._requests[rid]
            pos = len(req.tokens) - 1  # the newest token's key is written now; its slot is already reserved
            rows.append((len(ids), 1, req, pos + 1))
            emit.append((rid, len(ids)))
            ids.append(req.tokens[-1])
            positions.append(pos)
            slots += self._slots(req, pos, 1)
            req.cached = pos + 1
        for rid, first, count, target in zip(batch.prefill_ids.tolist(), batch.prefill_start.tolist(),
                                             batch.prefill_len.tolist(), batch.prefill_target.tolist(), strict=True):
            req = self._request(rid, target)
            self._reserve(req, first + count)
            rows.append((len(ids), count, req, first + count))
            ids += req.tokens[first : first + count]
            positions += range(first, first + count)
            slots += self._slots(req, first, count)
            req.cached = first + count
            if first + count == target:
                emit.append((rid, len(ids) - 1))
        return ids, positions, slots, rows, emit

    def _metadata(self, rows, slots) -> PagedBatch:
        """Group rows so that padding stays small: decode rows apart from prefill rows (a long chunk would
        pad every one-token query), and within each, at most MAX_GROUP_ROWS rows of similar context length (a
        group pads to its longest context, so the cost tracks the sum of contexts, not batch x longest)."""
        groups = []
        for part in ([r for r in rows if r[1] == 1], [r for r in rows if r[1] > 1]):
            part.sort(key=lambda row: row[3])
            while part:
                limit = PADDING_SLACK * part[0][3] + self.block_size
                size = next((i for i, row in enumerate(part) if row[3] > limit), len(part))
                size = min(size, MAX_GROUP_ROWS)
                groups.append(self._group(part[:size]))
                part = part[size:]
        return PagedBatch(self._torch.as_tensor(slots, device=self.device), groups, self.k_cache, self.v_cache)

    def _group(self, rows) -> RowGroup:
        b = len(rows)
        q_max = max(count for _, count, _, _ in rows)
        c_max = max(ctx for _, _, _, ctx in rows)
        query_index = np.zeros((b, q_max), dtype=np.int64)
        query_valid = np.zeros((b, q_max), dtype=bool)
        context = np.zeros((b, c_max), dtype=np.int64)
        mask = np.zeros((b, 1, q_max, c_max), dtype=bool)
        for i, (start, count, req, ctx) in enumerate(rows):
            query_index[i, :count] = np.arange(start, start + count)
            query_valid[i, :count] = True
            context[i, :ctx] = self._slots(req, 0, ctx)
            # Query j sits at position ctx - count + j and sees positions up to its own.
            last = np.arange(ctx - count, ctx)
            mask[i, 0, :count, :ctx] = np.arange(ctx)[None, :] <= last[:, None]
            mask[i, 0, count:, 0] = True  # padded queries see one slot (discarded) so SDPA stays finite
        torch, dev = self._torch, self.device
        return RowGroup(torch.as_tensor(context, device=dev), torch.as_tensor(query_index, device=dev),
                        torch.as_tensor(mask, device=dev), torch.as_tensor(query_valid, device=dev))

    def _sample(self, emit, logits) -> None:
        torch = self._torch
        if not emit:
            return
        if self.sampling == "greedy":
            chosen = logits.argmax(dim=-1)
        else:
            chosen = torch.multinomial(torch.softmax(logits.float(), dim=-1), 1, generator=self._generator)[:, 0]
        for (rid, _), token, row in zip(emit, chosen.tolist(), range(len(emit)), strict=True):
            req = self._requests[rid]
            req.tokens.append(int(token))
            self._reserve(req, len(req.tokens))  # the new token's slot, written when it is decoded
            if self.keep_logits:
                self.last_logits[rid] = logits[row].float().cpu().numpy()
