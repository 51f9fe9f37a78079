"""Serving runtimes: how a serving engine executes an iteration, and what that costs besides the kernels.

Vidur's tables time each kernel on its own (CUDA events around the operator), so they say nothing about how the
kernels are launched, how the tensor-parallel workers get their inputs or which all-reduce and attention kernels
the server uses. Those choices belong to the serving runtime, and they decide most of a small-batch iteration on
several GPUs. A :class:`Runtime` names them, each number with its source (:class:`Sourced`):

* ``eager``: kernels launched from Python every iteration, NCCL all-reduce, Ray workers fed by the driver each
  iteration, xformers prefill and vLLM's first paged-attention decode kernel: vLLM up to 0.2.x (2023), and what
  Vidur's profiling data measures.
* ``cuda-graphs``: iterations replayed as CUDA graphs (launch cost hidden), a custom one-shot/two-shot all-reduce
  for small messages over NVLink, workers fed through shared memory, FlashAttention-2-class kernels: vLLM from
  0.3 on and its V1 engine, the runtime a user deploying vLLM today runs. The shipped profiles use it.

:func:`servegym.backends.build.build_profile` turns a runtime into a profile's terms; ``servegym profile
runtimes`` prints this registry.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_RUNTIME", "LEGACY_RUNTIME", "RUNTIMES", "CustomAllReduce", "Runtime", "Sourced", "get_runtime"]

KINDS = ("measured", "fit", "paper", "estimate")


@dataclass(frozen=True)
class Sourced:
    """A number and where it comes from: ``measured`` (a table or benchmark), ``fit`` (fitted to the whole-iteration
    measurements named in ``source``), ``paper`` (a published figure) or ``estimate`` (a stated guess)."""

    value: float
    kind: str
    source: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if not self.value >= 0:
            raise ValueError(f"value must be >= 0, got {self.value!r}")


@dataclass(frozen=True)
class CustomAllReduce:
    """An in-graph all-reduce for small messages over NVLink: ``latency + bytes / bus_bandwidth`` per call up to
    ``max_bytes``; larger messages fall back to NCCL (the measured table)."""

    latency_s: Sourced
    bus_bandwidth_bytes_s: Sourced
    max_bytes: int

    def call_s(self, message_bytes: float) -> float | None:
        """Seconds for one all-reduce of ``message_bytes``; None beyond ``max_bytes`` (NCCL's table then)."""
        if message_bytes > self.max_bytes:
            return None
        return self.latency_s.value + message_bytes / self.bus_bandwidth_bytes_s.value


@dataclass(frozen=True)
class Runtime:
    """How a serving engine executes an iteration (see the module docstring). Per-GPU numbers are keyed by the
    build's GPU key (``a100``, ``h100``, ``a40``)."""

    name: str
    summary: str
    launch_s_per_layer: dict[str, Sourced]
    """Host time to launch one transformer layer's kernels from Python; an iteration's GPU work cannot finish
    before all are launched. Zero where the iteration replays a CUDA graph."""
    host_s_per_row: dict[str, Sourced]
    """Host time per request per iteration beyond what Vidur's CPU table measured (per-sequence Python work in
    the sampler, block tables and output processing of the runtime's vintage)."""
    linear_scale: dict[str, Sourced]
    """The runtime's linear layers relative to Vidur's per-kernel table (1: the table's kernels)."""
    tp_dispatch_s: Sourced
    """Host time per iteration to hand the batch to the tensor-parallel workers (TP > 1 only)."""
    tp_dispatch_from_table: bool
    """True: use the CPU table's own measured dispatch column (``ray_comm_time_mean``) instead of the value."""
    tp_dispatch_s_per_row: Sourced
    """Host time per request per iteration to ship its metadata to the tensor-parallel workers (TP > 1 only)."""
    custom_allreduce: CustomAllReduce | None
    decode_bandwidth_efficiency: dict[str, Sourced]
    """Share of the data-sheet memory bandwidth that paged decode attention achieves."""
    prefill_flops_efficiency: dict[str, Sourced]
    """Share of the stated fp16 peak that prefill attention achieves."""
    max_batched_tokens: Sourced
    """The runtime's default token budget per iteration: a batch of prompts is prefilled in iterations of at most
    this many tokens (``profile predict --prefill P --batch B`` prices it so)."""


_SPLITWISE = ("Splitwise's profiling of Llama-2-70B fp16 on DGX-A100 and DGX-H100 (Patel et al., ISCA 2024; "
              "github.com/Mutinifni/splitwise-sim data/perf_model.csv @8f99e7d, medians of 5 runs), a 2023 serving "
              "stack without CUDA graphs: batch-1 decode as slow at TP8 as at TP4")
_FA2 = "FlashAttention-2 paper (Dao, arXiv 2307.08691): forward pass at 50-73% of the A100's peak"
_FA3 = ("FlashAttention-3 paper (Shah et al., arXiv 2407.08608): FlashAttention-2 reaches about 35% of the "
        "H100's peak")


def _per_gpu(a100: Sourced, h100: Sourced, a40: Sourced | None = None) -> dict[str, Sourced]:
    """Per-GPU numbers; the A40 has no measurement of its own and borrows the A100's, labelled an estimate."""
    borrowed = a40 or Sourced(a100.value, "estimate", f"borrowed from the A100 ({a100.kind}: {a100.source})")
    return {"a100": a100, "h100": h100, "a40": borrowed}


def _fit(value: float, what: str) -> Sourced:
    return Sourced(value, "fit", f"{what}; fitted by servegym.backends.runtime_fit to {_SPLITWISE}")


EAGER = Runtime(
    name="eager",
    summary="kernels launched from Python each iteration, NCCL all-reduce, Ray workers, 2023 attention kernels: "
            "vLLM <= 0.2.x and the runtime Vidur's tables profile",
    launch_s_per_layer=_per_gpu(_fit(0.4506e-3, "the TP8 batch-1 decode, where the launch floor binds"),
                                _fit(0.2645e-3, "the TP8 batch-1 decode, where the launch floor binds")),
    host_s_per_row=_per_gpu(_fit(0.4068e-3, "the TP4 batch-64 decode"), _fit(0.2082e-3, "the TP4 batch-64 decode")),
    linear_scale=_per_gpu(_fit(0.8207, "the 2k and 8k prefills at TP4 and TP8"),
                          _fit(1.2834, "the 2k and 8k prefills at TP4 and TP8")),
    tp_dispatch_s=Sourced(0.0, "measured", "Vidur cpu_overheads.csv ray_comm_time_mean (per TP configuration)"),
    tp_dispatch_from_table=True,
    tp_dispatch_s_per_row=Sourced(0.0, "estimate", "per-request work is in host_s_per_row"),
    custom_allreduce=None,
    decode_bandwidth_efficiency=_per_gpu(
        Sourced(0.7, "estimate", "paged-attention decode kernels read KV at 60-80% of the data-sheet bandwidth"),
        Sourced(0.6, "estimate", "vLLM's 2023 paged-attention kernels were not tuned for Hopper")),
    prefill_flops_efficiency=_per_gpu(_fit(0.05390, "the 2k and 8k prefills at TP4 and TP8 (attention is their "
                                                    "quadratic part)"),
                                      _fit(0.04808, "the 2k and 8k prefills at TP4 and TP8 (attention is their "
                                                    "quadratic part)")),
    max_batched_tokens=Sourced(4096, "estimate", "vLLM 0.2's max_num_batched_tokens: max(max_model_len, 2560), "
                                                 "4,096 for Llama-2's context"),
)

_GRAPH_SOURCES = ("vLLM PR #2192 (Dec 2023: Llama-2-70B, A100 TP4, batch 64, 256 in/256 out, 14.57 s with the custom "
                  "all-reduce) and TensorRT-LLM v0.5's performance table (A100 fp16 TP4, batch 64, 128 in/2048 out, "
                  "1,181 tokens/s)")
CUDA_GRAPHS = Runtime(
    name="cuda-graphs",
    summary="iterations replayed as CUDA graphs, custom all-reduce for small messages over NVLink, workers fed "
            "through shared memory, FlashAttention-2-class kernels: vLLM >= 0.3 and V1, the default today",
    launch_s_per_layer=_per_gpu(*(Sourced(0.0, "estimate", "a graph replay launches every kernel at once: the "
                                                           "host's launch cost is hidden behind the GPU's work")
                                  for _ in range(2))),
    host_s_per_row=_per_gpu(*(Sourced(0.0, "estimate", "per-request host work is what Vidur's CPU table "
                                                       "measured (one GPU: vLLM's vectorised input preparation)")
                              for _ in range(2))),
    linear_scale=_per_gpu(*(Sourced(1.0, "measured", "Vidur's per-kernel table") for _ in range(2))),
    tp_dispatch_s=Sourced(0.3e-3, "estimate", "vLLM's shared-memory broadcast of the scheduler output to the "
                                              "workers: a few hundred microseconds"),
    tp_dispatch_from_table=False,
    tp_dispatch_s_per_row=Sourced(0.1887e-3, "fit", "per-request metadata broadcast to the workers (block tables, "
                                                    "sequence lengths); fitted by servegym.backends.runtime_fit to "
                                                    "the mean batch-64 decode of " + _GRAPH_SOURCES),
    custom_allreduce=CustomAllReduce(
        latency_s=Sourced(9e-6, "measured", "SGLang PR #2904's benchmark of vLLM's custom all-reduce on an H100: "
                                            "8.5-11.8 us for 16-128 KB at TP 2-8 (NCCL: 20-40 us, Vidur's table)"),
        bus_bandwidth_bytes_s=Sourced(70e9, "measured", "the same benchmark: 24-45 us at 1-4 MB, about 70 GB/s of "
                                                        "message per call at TP8"),
        max_bytes=8 * 1024**2),
    decode_bandwidth_efficiency=_per_gpu(*(Sourced(0.7, "estimate", "FlashAttention-2 / FlashInfer paged decode "
                                                                    "reads KV at 70-80% of the data-sheet bandwidth")
                                           for _ in range(2))),
    prefill_flops_efficiency=_per_gpu(Sourced(0.5, "paper", _FA2 + "; 0.5 for serving-sized causal chunks"),
                                      Sourced(0.35, "paper", _FA3)),
    max_batched_tokens=Sourced(8192, "estimate", "vLLM V1's default max_num_batched_tokens for online serving on "
                                                 "data-centre GPUs"),
)

RUNTIMES: dict[str, Runtime] = {r.name: r for r in (EAGER, CUDA_GRAPHS)}
DEFAULT_RUNTIME = "cuda-graphs"
"""The runtime of the shipped profiles: what vLLM runs by default today."""
LEGACY_RUNTIME = "eager"
"""The runtime a schema-2 file without a ``runtime`` key describes: its terms came from Vidur's tables alone."""


def get_runtime(name: str) -> Runtime:
    if name not in RUNTIMES:
        raise ValueError(f"unknown runtime {name!r}; known: {sorted(RUNTIMES)}")
    return RUNTIMES[name]
