"""The real backend: a Hugging Face model runs every iteration over a paged KV cache, timed by the clock.

Design: a compact engine on the model's own forward. Each iteration packs every decode token and every
prefill chunk of the batch into one sequence (batch size 1, explicit positions) and runs one forward pass; a
registered attention implementation (``servegym_paged``, :mod:`servegym.backends.attention`) writes the new keys
and values into their cache slots and attends every request to its own context, read through its block table,
with one kernel call per layer and no host sync. Chosen over transformers' continuous-batching internals
because it depends only on the public attention registry, works for any decoder that dispatches attention
through it, and keeps block allocation in step with the engine's accounting: a request holds
``ceil(tokens / block_size)`` blocks, counting its prompt so far and every token it has generated (the newest
one's slot is reserved before its key is written).

Request lengths follow the workload: the engine decides when a request stops; tokens come from greedy (or
seeded sampled) decoding of the real logits. Prompts are seeded random token ids.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from servegym.backends.attention import (
    KERNELS,
    Row,
    StepPlan,
    default_kernel,
    device_plan,
    plan_step,
    to_device,
    varlen_available,
)
from servegym.backends.base import BatchTotals, StepBatch, batch_totals
from servegym.backends.kv_memory import (
    GIB,
    KVCapacityError,
    available_system_bytes,
    blocks_that_fit,
    bytes_per_block,
    check_fits,
    peak_used_bytes,
)
from servegym.backends.support import UnsupportedModelError
from servegym.backends.torch_model import load_model, require_torch, torch_dtype

if TYPE_CHECKING:
    import torch

CPU_KV_BLOCKS = 2048
"""The KV cache on CPU when ``num_kv_blocks`` is not given."""
PROFILE_LOGITS = 256
"""Rows of logits the CUDA profiling forward keeps (a large decode batch samples this many)."""


def default_dtype(device_type: str, capability: tuple[int, int] | None = None) -> str:
    """float32 on CPU; on CUDA bfloat16 where it is native (compute capability 8.0+), else float16 (V100)."""
    if device_type != "cuda":
        return "float32"
    return "bfloat16" if capability is not None and capability >= (8, 0) else "float16"


@dataclass
class _Request:
    tokens: list[int]  # prompt, then every generated token
    cached: int = 0  # tokens whose key/value sit in the cache
    blocks: list[int] = field(default_factory=list)


class TorchBackend:
    """Runs a real model on CPU or CUDA.

    Args:
        model: a preset built with seeded random weights (``small-llama``, the default; ``tiny-llama`` for
            tests; ``llama-3.2-3b``, the TWP paper's architecture, for GPUs), or a local checkpoint folder. A
            checkpoint whose attention the backend does not implement (sliding windows, soft-capping, ALiBi,
            cross-attention, encoders) is refused with :class:`UnsupportedModelError`.
        device: ``cpu``, ``cuda`` or ``cuda:N``; default ``cuda`` when available.
        dtype: ``float32``, ``float16`` or ``bfloat16``; default float32 on CPU, bfloat16 on CUDA devices of
            compute capability 8.0+ and float16 on older ones (no native bfloat16).
        num_kv_blocks: blocks in the paged cache (the engine accounts in the same blocks). None: on CUDA as
            many as fit in ``memory_utilization`` of the device after a profiling forward; on CPU 2048. A
            count that does not fit raises :class:`KVCapacityError` naming the GiB needed and available.
        block_size: tokens per block.
        sampling: ``greedy`` or ``sample`` (seeded by the episode).
        seed: seed of the preset's random weights.
        keep_logits: keep the last logits of each request (for tests).
        threads: torch CPU threads (default: torch's choice).
        clock: seconds since some origin; steps are timed with it. Wall-clock timing makes episodes
            irreproducible by nature; a deterministic clock (tests) makes them repeatable.
        attention: ``auto`` (``varlen`` on CUDA where available, else ``padded``; ``grouped`` on CPU) or one of
            ``varlen``, ``padded``, ``grouped`` (:mod:`servegym.backends.attention`).
        count_host_time: ``execute`` returns packing + forward + sampling time, as a real engine's iteration
            would take (default); False returns the forward pass alone. Both parts are kept in ``forward_s``
            and ``overhead_s``.
        memory_utilization: fraction of CUDA memory the weights, activations and KV cache may use (vLLM's
            ``gpu_memory_utilization``).
        max_batch_tokens: tokens of the CUDA profiling forward (the largest step the engine will run).

    Attributes: ``load_s`` is the time to build or load the weights; ``cold_start_s`` equals it for a
    checkpoint (a measured load) and is None for a preset (random initialisation, not a load).
    """

    def __init__(self, model: str | Path = "small-llama", device: str | None = None, dtype: str | None = None,
                 num_kv_blocks: int | None = None, block_size: int = 16, sampling: str = "greedy", seed: int = 0,
                 keep_logits: bool = False, threads: int | None = None,
                 clock: Callable[[], float] = time.perf_counter, attention: str = "auto",
                 count_host_time: bool = True, memory_utilization: float = 0.9,
                 max_batch_tokens: int = 2048) -> None:
        torch, transformers = require_torch()
        if sampling not in ("greedy", "sample"):
            raise ValueError(f"sampling must be 'greedy' or 'sample', got {sampling!r}")
        if (num_kv_blocks is not None and num_kv_blocks < 1) or block_size < 1 or max_batch_tokens < 1:
            raise ValueError("num_kv_blocks, block_size and max_batch_tokens must be >= 1")
        if attention != "auto" and attention not in KERNELS:
            raise ValueError(f"attention must be 'auto' or one of {KERNELS}, got {attention!r}")
        if not 0 < memory_utilization <= 1:
            raise ValueError(f"memory_utilization must be in (0, 1], got {memory_utilization}")
        if threads:
            torch.set_num_threads(threads)
        self._torch = torch
        self.torch_device = resolve_device(torch, device)
        self.device = str(self.torch_device)
        capability = torch.cuda.get_device_capability(self.torch_device) if self.is_cuda else None
        self.dtype = dtype or default_dtype(self.torch_device.type, capability)
        loaded = load_model(model, self.torch_device, torch_dtype(torch, self.dtype), seed)
        self.model, self.model_name, self.load_s = loaded.model, loaded.name, loaded.seconds
        self.cold_start_s = loaded.seconds if loaded.from_checkpoint else None
        self.load_kind = "checkpoint load" if loaded.from_checkpoint else "random initialisation (preset)"
        if attention == "varlen" and not varlen_available(self.torch_device, self.model.dtype):
            raise ValueError(f"varlen attention needs CUDA of compute capability 8.0+, float16 or bfloat16 and torch "
                             f"with torch.nn.attention.varlen; got {self.device}, {self.dtype}")
        self.attention = default_kernel(self.torch_device, self.model.dtype) if attention == "auto" else attention
        self.block_size = block_size
        self.owns_cache = True  # the engine must account in exactly these blocks
        self.baseline_step_s: float | None = None
        self.sampling, self.keep_logits, self.count_host_time = sampling, keep_logits, count_host_time
        self.versions = {"torch": torch.__version__, "transformers": transformers.__version__}
        self._clock = clock
        cfg = self.model.config
        self._head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self._kv_groups = cfg.num_attention_heads // cfg.num_key_value_heads
        self.block_bytes = bytes_per_block(cfg.num_hidden_layers, cfg.num_key_value_heads, self._head_dim,
                                           block_size, self.model.dtype.itemsize)
        probe_tokens = max_batch_tokens if self.is_cuda else 1
        self._allocate_cache(-(-probe_tokens // block_size))
        self._probe(probe_tokens, explicit_kernel=attention != "auto")
        self.num_kv_blocks = self._kv_capacity(num_kv_blocks, memory_utilization)
        self._allocate_cache(self.num_kv_blocks)
        self.reset(np.random.default_rng(0))

    @property
    def is_cuda(self) -> bool:
        return self.torch_device.type == "cuda"

    # ------------------------------------------------------------------ Backend protocol
    def reset(self, rng: np.random.Generator) -> None:
        self._seed = int(rng.integers(1 << 31))
        self._free = list(range(self.num_kv_blocks - 1, -1, -1))
        self._requests: dict[int, _Request] = {}
        self._generator = self._torch.Generator(device=self.torch_device).manual_seed(self._seed)
        self.forward_s: list[float] = []
        self.overhead_s: list[float] = []
        """Host time of each step: packing, index copies, sampling and bookkeeping."""
        self.totals: list[BatchTotals] = []
        """Each step's batch sizes and sums (what a latency model prices)."""
        self.last_logits: dict[int, np.ndarray] = {}

    def release(self, request_ids: np.ndarray) -> None:
        """Free the cache of finished or preempted requests (their tokens stay, for recompute)."""
        for rid in request_ids.tolist():
            req = self._requests.get(rid)
            if req is not None:
                self._free.extend(reversed(req.blocks))
                req.blocks, req.cached = [], 0

    def execute(self, batch: StepBatch) -> float:
        """Run one step; return packing + forward + sampling time (``count_host_time``) or the forward alone."""
        clock = self._clock
        start = clock()
        ids, positions, slots, rows, emit = self._pack(batch)
        inputs = self._inputs(ids, positions, slots, [index for _, index in emit], rows)
        prepared = clock()
        logits = self._forward(*inputs)
        forward = clock() - prepared
        self._sample(emit, logits)
        total = clock() - start
        self.forward_s.append(forward)
        self.overhead_s.append(total - forward)
        self.totals.append(batch_totals(batch))
        return total if self.count_host_time else forward

    # ------------------------------------------------------------------ internals
    def allocated_blocks(self) -> int:
        return self.num_kv_blocks - len(self._free)

    def request_tokens(self, rid: int) -> list[int]:
        return list(self._requests[rid].tokens)

    def _allocate_cache(self, blocks: int) -> None:
        torch, cfg = self._torch, self.model.config
        self.k_cache = self.v_cache = None  # free the old cache before the new one is allocated
        if self.is_cuda:
            torch.cuda.empty_cache()
        shape = (blocks * self.block_size, cfg.num_key_value_heads, self._head_dim)
        kwargs = {"dtype": self.model.dtype, "device": self.torch_device}
        self.k_cache = [torch.zeros(shape, **kwargs) for _ in range(cfg.num_hidden_layers)]
        self.v_cache = [torch.zeros(shape, **kwargs) for _ in range(cfg.num_hidden_layers)]

    def _probe(self, tokens: int, explicit_kernel: bool) -> None:
        """One forward of a ``tokens``-token prompt over the small cache: every layer must run the paged
        attention (else the model is refused), and ``auto`` falls back from ``varlen`` to ``padded`` if the
        kernel fails here. On CUDA this is also the profiling run that sizes the KV cache."""
        if self.is_cuda:
            self._torch.cuda.synchronize(self.torch_device)
            self._torch.cuda.reset_peak_memory_stats(self.torch_device)
        blocks = list(range(-(-tokens // self.block_size)))
        slots = list(range(tokens))
        keep = list(range(max(tokens - PROFILE_LOGITS, 0), tokens))
        run = lambda: self._forward(*self._inputs([0] * tokens, list(range(tokens)), slots, keep,  # noqa: E731
                                                  [Row(0, tokens, tokens, blocks)]))
        try:
            run()
        except RuntimeError as err:
            if self.attention != "varlen" or explicit_kernel:
                raise
            warnings.warn(f"varlen attention failed on {self.device} ({err}); falling back to padded SDPA",
                          RuntimeWarning, stacklevel=3)
            self.attention = "padded"
            run()
        layers, expected = self._layers_run, self.model.config.num_hidden_layers
        if layers != expected:
            raise UnsupportedModelError(f"model {self.model_name!r} ran servegym's paged attention in {layers} of "
                                        f"its {expected} layers; its attention does not go through transformers' "
                                        "attention interface, so it is refused")

    def _kv_capacity(self, requested: int | None, utilization: float) -> int:
        """KV blocks: on CUDA from free memory after the profiling forward, on CPU explicit (2048 by default);
        either way checked against the memory available."""
        if not self.is_cuda:
            blocks = requested or CPU_KV_BLOCKS
            check_fits(blocks, self.block_bytes, available_system_bytes(), "this machine")
            return blocks
        torch, device = self._torch, self.torch_device
        torch.cuda.synchronize(device)
        free, total = torch.cuda.mem_get_info(device)
        profile_cache = sum(t.numel() * t.element_size() for t in self.k_cache + self.v_cache)
        peak_used = peak_used_bytes(total, free, torch.cuda.memory_reserved(device),
                                    torch.cuda.max_memory_allocated(device), profile_cache)
        where = (f"{self.device} ({torch.cuda.get_device_name(device)}, {total / GIB:.1f} GiB x utilization "
                 f"{utilization}, {peak_used / GIB:.2f} GiB used at the profiling peak)")
        if requested is not None:
            check_fits(requested, self.block_bytes, max(int(utilization * total) - peak_used, 0), where)
            return requested
        blocks = blocks_that_fit(total, peak_used, utilization, self.block_bytes)
        if blocks < 1:
            raise KVCapacityError(f"no room for a KV cache on {where}")
        return blocks

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

    def _pack(self, batch: StepBatch) -> tuple[list[int], list[int], list[int], list[Row], list[tuple[int, int]]]:
        """Pack decode tokens then prefill chunks; return token ids, positions, new-token slots, one
        :class:`Row` per request, and which packed index emits which request's token."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        rows, emit = [], []
        bs = self.block_size
        for rid in batch.decode_ids.tolist():
            req = self._requests[rid]
            pos = len(req.tokens) - 1  # the newest token's key is written now; its slot is already reserved
            rows.append(Row(len(ids), 1, pos + 1, req.blocks))
            emit.append((rid, len(ids)))
            ids.append(req.tokens[-1])
            positions.append(pos)
            slots.append(req.blocks[pos // bs] * bs + pos % bs)
            req.cached = pos + 1
        for rid, first, count, target in zip(batch.prefill_ids.tolist(), batch.prefill_start.tolist(),
                                             batch.prefill_len.tolist(), batch.prefill_target.tolist(), strict=True):
            req = self._request(rid, target)
            self._reserve(req, first + count)
            rows.append(Row(len(ids), count, first + count, req.blocks))
            ids += req.tokens[first : first + count]
            span = np.arange(first, first + count)
            positions += span.tolist()
            slots += (np.asarray(req.blocks)[span // bs] * bs + span % bs).tolist()
            req.cached = first + count
            if first + count == target:
                emit.append((rid, len(ids) - 1))
        return ids, positions, slots, rows, emit

    def _inputs(self, ids: list[int], positions: list[int], slots: list[int], keep: list[int],
                rows: list[Row]) -> tuple[dict[str, torch.Tensor], StepPlan]:
        """The step's token ids, positions, kept rows and attention plan, copied to the device in one transfer."""
        host = plan_step(rows, self.block_size, self.attention)
        arrays = {"ids": np.asarray(ids), "positions": np.asarray(positions), "keep": np.asarray(keep, dtype=np.int64),
                  "slot_mapping": np.asarray(slots), **host.arrays}
        tensors = to_device(arrays, self.torch_device)
        return tensors, device_plan(host, tensors, self.k_cache, self.v_cache, self._kv_groups)

    def _forward(self, tensors: dict[str, torch.Tensor], plan: StepPlan) -> torch.Tensor:
        torch = self._torch
        with torch.inference_mode():
            logits = self.model(input_ids=tensors["ids"].unsqueeze(0), position_ids=tensors["positions"].unsqueeze(0),
                                use_cache=False, logits_to_keep=tensors["keep"], servegym_batch=plan).logits[0]
            if self.is_cuda:
                torch.cuda.synchronize(self.torch_device)
        self._layers_run = plan.layers_run
        return logits

    def _sample(self, emit: list[tuple[int, int]], logits: torch.Tensor) -> None:
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


def resolve_device(torch: ModuleType, device: str | None) -> torch.device:
    """``device`` (default: ``cuda`` when available, else ``cpu``) checked, with the CUDA index made explicit."""
    try:
        resolved = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError:
        resolved = None
    if resolved is None or resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu, cuda or cuda:N, got {device!r}")
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} asked for CUDA, but torch sees no CUDA device")
        if resolved.index is None:
            resolved = torch.device("cuda", torch.cuda.current_device())
        elif resolved.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return resolved
