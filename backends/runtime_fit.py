"""Whole-iteration measurements of real servers, and the fit of each runtime's free numbers to them.

:data:`REFERENCES` holds every public measurement the runtimes are fitted to or checked against, each with its
source. :func:`fit_eager` and :func:`fit_cuda_graphs` recompute the ``fit`` numbers in
:mod:`servegym.backends.runtimes` from them (a test checks the registry holds what the fit gives), and
:func:`compare` prices every reference with the shipped profiles (``servegym profile check``).

The fit works on a profile's terms built with the free numbers neutral (no launch floor, no per-request host
cost, the table's linear kernels, attention at 100% of peak): the fitted ones enter linearly, ``cpu + r x rows``,
``k x linear``, ``prefill_attention / e``, and ``max(GPU terms, layers x launch)``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from servegym.backends.build import build_profile
from servegym.backends.runtimes import RUNTIMES, Runtime, Sourced
from servegym.backends.token_model import TokenLatencyModel

SPLITWISE = "Splitwise perf_model.csv (github.com/Mutinifni/splitwise-sim @8f99e7d), median of 5 runs"
GPT_FAST = "gpt-fast README (github.com/pytorch-labs/gpt-fast @0f925b5), A100 at 330 W, bf16, no serving"
TRT_LLM = "TensorRT-LLM v0.5 docs/source/performance.md (NVIDIA/TensorRT-LLM), A100 fp16, static batching"
VLLM_2192 = "vLLM PR #2192 (github.com/vllm-project/vllm/pull/2192), benchmark_latency.py, custom all-reduce"
LMDEPLOY = ("LMDeploy TurboMind v0.1.0a1 (InternLM/lmdeploy docs/en/benchmark/a100_fp16.md @3e391df), A100-80G fp16, "
            "a C++ engine without per-iteration Python, static batch, p50 token latency")
TRT_LLM_09 = "TensorRT-LLM v0.9.0 docs/source/performance.md (NVIDIA/TensorRT-LLM), A100 fp16, first token"
LAMBDA = ("Lambda vllm-benchmark results/prompt_10 (LambdaLabsML/vllm-benchmark @a4f9f43), vLLM 0.6 on H100-80GB-SXM, "
          "Llama-3-70B-Instruct bf16 (Llama-2-70B's layers; a 4x larger vocabulary, +0.7% bytes a step), "
          "10 decode steps a streamed chunk; median chunk / 10 while one request runs alone")
TRT_LLM_220 = ("TensorRT-LLM issue #220 (NVIDIA/TensorRT-LLM), A100-80G fp16, benchmark.py static batch, "
               "latency 9,744 ms")


@dataclass(frozen=True)
class Reference:
    """A measured time of ``profile`` under ``runtime``: one decode step (``decode``: ``batch`` requests at
    context ``input_len + output_len / 2``), one prefill iteration (``prefill``: ``batch`` prompts of
    ``input_len``) or a whole static batch (``request``: the prompts in iterations of the runtime's token budget,
    then ``output_len - 1`` decode steps)."""

    profile: str
    runtime: str
    kind: str
    batch: int
    input_len: int
    output_len: int
    measured_s: float
    source: str
    fitted: bool = False
    """True where the runtime's fit used this point (the others are checks)."""

    @property
    def context(self) -> float:
        """A decode step's KV context per request: the prompt and half the output."""
        return self.input_len + self.output_len / 2

    @property
    def label(self) -> str:
        if self.kind == "decode":
            return f"decode b={self.batch} c={self.context:g}"
        if self.kind == "prefill":
            return f"prefill {self.input_len}" + (f" x{self.batch}" if self.batch > 1 else "")
        return f"request b={self.batch} {self.input_len}/{self.output_len}"


def _splitwise(gpu: str, tp: int, b1: float, b64: float, p2k: float, p8k: float, p16x512: float) -> list[Reference]:
    profile = f"{gpu}-llama2-70b-tp{tp}"
    # Fitted: the prefills at both TPs, batch 64 at TP4 and batch 1 at TP8 (where the launch floor binds); the
    # other two decodes and the batched prefill (16 prompts of 512 tokens) are checks.
    return [Reference(profile, "eager", "decode", 1, 512, 128, b1 / 1e3, SPLITWISE, tp == 8),
            Reference(profile, "eager", "decode", 64, 512, 128, b64 / 1e3, SPLITWISE, tp == 4),
            Reference(profile, "eager", "prefill", 1, 2048, 1, p2k / 1e3, SPLITWISE, True),
            Reference(profile, "eager", "prefill", 1, 8192, 1, p8k / 1e3, SPLITWISE, True),
            Reference(profile, "eager", "prefill", 16, 512, 1, p16x512 / 1e3, SPLITWISE)]


REFERENCES: tuple[Reference, ...] = (
    *_splitwise("a100", 4, 44.99, 72.95, 403.3, 2278.5, 2892.6),
    *_splitwise("a100", 8, 44.85, 71.61, 274.2, 1549.8, 2084.4),
    *_splitwise("h100", 4, 29.72, 52.36, 200.7, 953.6, 874.3),
    *_splitwise("h100", 8, 29.76, 50.16, 136.8, 844.9, 811.9),
    Reference("a100-llama2-70b-tp4", "cuda-graphs", "decode", 1, 5, 200, 1 / 38.01, GPT_FAST),
    Reference("a100-llama2-70b-tp8", "cuda-graphs", "decode", 1, 5, 200, 1 / 62.50, GPT_FAST),
    Reference("a100-llama2-70b-tp4", "cuda-graphs", "prefill", 1, 2048, 1, 0.377, TRT_LLM + ", first token"),
    Reference("a100-llama2-70b-tp4", "cuda-graphs", "request", 64, 128, 2048, 64 * 2048 / 1181, TRT_LLM, True),
    Reference("a100-llama2-70b-tp4", "cuda-graphs", "request", 64, 128, 128, 64 * 128 / 1237, TRT_LLM),
    Reference("a100-llama2-70b-tp4", "cuda-graphs", "request", 64, 2048, 128, 64 * 128 / 272, TRT_LLM),
    Reference("a100-llama2-70b-tp4", "cuda-graphs", "request", 64, 2048, 2048, 64 * 2048 / 738, TRT_LLM),
    Reference("a100-llama2-70b-tp4", "cuda-graphs", "request", 64, 256, 256, 14.57, VLLM_2192, True),
    Reference("a100-llama2-70b-tp4", "cuda-graphs", "decode", 1, 1, 128, 0.029, LMDEPLOY),
    Reference("a100-llama2-70b-tp4", "cuda-graphs", "decode", 1, 2048, 128, 0.031, LMDEPLOY),
    Reference("a100-llama2-70b-tp4", "cuda-graphs", "prefill", 1, 2048, 1, 0.402, LMDEPLOY.replace(
        "p50 token latency", "mean first-token latency")),
    Reference("a100-llama2-70b-tp4", "cuda-graphs", "decode", 64, 1, 128, 0.037, LMDEPLOY),
    Reference("a100-llama2-70b-tp4", "cuda-graphs", "decode", 64, 128, 2048, 0.043, LMDEPLOY),
    Reference("a100-llama2-70b-tp4", "cuda-graphs", "decode", 64, 2048, 2048, 0.055, LMDEPLOY),
    Reference("a100-llama2-70b-tp4", "cuda-graphs", "prefill", 1, 128, 1, 0.0456, TRT_LLM_09),
    Reference("a100-llama2-70b-tp8", "cuda-graphs", "prefill", 1, 2048, 1, 0.2492, TRT_LLM_09),
    Reference("a100-llama2-70b-tp8", "cuda-graphs", "request", 64, 512, 200, 9.744175, TRT_LLM_220),
    # The 741-token answer's chunks after every other request finished (prompt 29 tokens; from token 660 on).
    Reference("h100-llama2-70b-tp4", "cuda-graphs", "decode", 1, 689, 80, 0.017021, LAMBDA),
    Reference("h100-llama2-70b-tp8", "cuda-graphs", "decode", 1, 653, 110, 0.011225, LAMBDA),
)
"""Every cited measurement; docs/PROFILES.md prints them beside the predictions."""


def predict_s(latency: TokenLatencyModel, ref: Reference, max_batched_tokens: int) -> float:
    """``ref``'s shape priced by ``latency``."""
    if ref.kind == "decode":
        return latency.decode_s(ref.batch, ref.context)
    prefill = prefill_iterations_s(latency, ref.input_len, ref.batch, max_batched_tokens)
    if ref.kind == "prefill":
        return prefill
    return prefill + sum(latency.decode_s(ref.batch, ref.input_len + j) for j in range(1, ref.output_len))


def prefill_iterations_s(latency: TokenLatencyModel, prompt: int, batch: int, max_batched_tokens: int) -> float:
    """``batch`` whole prompts of ``prompt`` tokens prefilled as the runtime splits them: as many whole prompts per
    iteration as its token budget holds (at least one)."""
    per_iteration = max(1, max_batched_tokens // prompt)
    full, rest = divmod(batch, per_iteration)
    seconds = full * latency.prefill_s(prompt, per_iteration)
    return seconds + (latency.prefill_s(prompt, rest) if rest else 0.0)


def _neutral(runtime: Runtime) -> Runtime:
    """``runtime`` with its fitted numbers neutral (see the module docstring)."""
    def flat(value: float) -> dict[str, Sourced]:
        return {gpu: Sourced(value, "estimate", "neutral for the fit") for gpu in runtime.linear_scale}

    return dataclasses.replace(runtime, launch_s_per_layer=flat(0.0), host_s_per_row=flat(0.0),
                               linear_scale=flat(1.0), prefill_flops_efficiency=flat(1.0),
                               tp_dispatch_s_per_row=Sourced(0.0, "estimate", "neutral for the fit"))


def _parts(latency: TokenLatencyModel, rows: int, tokens: float, context: float, pairs: float,
           emitting: int) -> tuple[float, float, float, float]:
    """(cpu, linear, prefill attention, every other GPU term) of one iteration."""
    t = latency.terms(rows, tokens, context, pairs, emitting)
    return t["cpu"], t["linear"], t["prefill_attention"], t["allreduce"] + t["decode_attention"] + t["lm_head"]


def fit_eager(gpu: str, rounds: int = 20) -> dict[str, float]:
    """The eager runtime's launch floor per layer, host seconds per request, linear scale and prefill-attention
    efficiency on ``gpu``: linear scale and efficiency by least squares on the relative errors of Splitwise's 2k
    and 8k prefills at TP4 and TP8; the launch floor from its TP8 batch-1 decode and the per-request cost from its
    TP4 batch-64 decode."""
    neutral = _neutral(RUNTIMES["eager"])
    models = {tp: build_profile(gpu, "llama2-70b", tp, runtime=neutral).latency for tp in (4, 8)}
    fitted = [r for r in REFERENCES if r.profile.startswith(gpu) and r.runtime == "eager" and r.fitted]
    prefills = [(r, _parts(models[_build_key(r.profile)[2]], 1, r.input_len, 0.0,
                           r.input_len * (r.input_len + 1) / 2.0, 1)) for r in fitted if r.kind == "prefill"]
    (b64, p64), = [(r, _decode_parts(models[4], r)) for r in fitted if r.kind == "decode" and r.batch == 64]
    (b1, p1), = [(r, _decode_parts(models[8], r)) for r in fitted if r.kind == "decode" and r.batch == 1]
    layers = 80
    r = launch = 0.0
    k = u = 1.0
    for _ in range(rounds):
        # Prefills: (cpu + r + rest) + k * linear + u * attention = measured, each row divided by measured.
        a = np.array([[lin / ref.measured_s, att / ref.measured_s] for ref, (_, lin, att, _) in prefills])
        y = np.array([(ref.measured_s - cpu - r - rest) / ref.measured_s for ref, (cpu, _, _, rest) in prefills])
        k, u = np.linalg.lstsq(a, y, rcond=None)[0]
        # TP8 batch 1: the launch floor binds (its GPU terms are the smallest of the four shapes).
        c1, l1, _, o1 = p1
        launch = max(0.0, (b1.measured_s - c1 - r) / layers)
        # TP4 batch 64: cpu + 64 r + max(GPU, floor) = measured.
        c64, l64, _, o64 = p64
        r = max(0.0, (b64.measured_s - c64 - max(k * l64 + o64, layers * launch)) / b64.batch)
    if k * l1 + o1 > layers * launch:
        raise ValueError(f"{gpu}: the launch floor does not bind at TP8 batch 1; the fit's premise fails")
    return {"launch_s_per_layer": float(launch), "host_s_per_row": float(r), "linear_scale": float(k),
            "prefill_flops_efficiency": float(1 / u)}


def _decode_parts(latency: TokenLatencyModel, ref: Reference) -> tuple[float, float, float, float]:
    context = ref.input_len + ref.output_len / 2
    return _parts(latency, ref.batch, ref.batch, ref.batch * context, 0.0, ref.batch)


def fit_cuda_graphs() -> float:
    """The cuda-graphs runtime's per-request dispatch seconds (TP > 1), by least squares on the relative errors of
    its fitted whole-request references."""
    runtime = RUNTIMES["cuda-graphs"]
    neutral = dataclasses.replace(runtime, tp_dispatch_s_per_row=Sourced(0.0, "estimate", "neutral for the fit"))
    num = den = 0.0
    for ref in (r for r in REFERENCES if r.runtime == "cuda-graphs" and r.fitted):
        build = build_profile(*_build_key(ref.profile), runtime=neutral).latency
        base = predict_s(build, ref, int(runtime.max_batched_tokens.value))
        rows = ref.batch * (ref.output_len - 1) + ref.batch  # every decode row, and each prompt once
        num += (ref.measured_s - base) * rows / ref.measured_s**2
        den += rows * rows / ref.measured_s**2
    return num / den


def _build_key(profile: str) -> tuple[str, str, int]:
    gpu, rest = profile.split("-", 1)
    model, _, tp = rest.rpartition("-tp")
    return gpu, model, int(tp)


TOLERANCE = 0.15
"""How far past the cited measurements' range a prediction may lie and still count as in range: the spread of one
stack's runs and versions (Splitwise's medians of 5, TensorRT-LLM v0.5 against v0.9 at the same shape: 2-8%) and
the difference in shape between a measurement's context and the table's."""
SHAPES = (("decode", 1), ("decode", 64), ("prefill", 2048), ("prefill", 8192))
"""Issue 28's four shapes: batch-1 and batch-64 decode, 2k and 8k-token prefills of one prompt."""


@dataclass(frozen=True)
class Cell:
    """The cited measurements of one shape for one profile and runtime, beside the model's predictions of them."""

    profile: str
    runtime: str
    shape: str
    measured_s: tuple[float, ...]
    predicted_s: tuple[float, ...]

    @property
    def verdict(self) -> str:
        """``in range`` when every prediction lies within the measurements' range widened by :data:`TOLERANCE`,
        ``outside`` otherwise, ``no measurement`` when none is cited."""
        if not self.measured_s:
            return "no measurement"
        low, high = min(self.measured_s) * (1 - TOLERANCE), max(self.measured_s) * (1 + TOLERANCE)
        return "in range" if all(low <= p <= high for p in self.predicted_s) else "outside"


def coverage(profiles: tuple[str, ...] = ("a100-llama2-70b-tp4", "a100-llama2-70b-tp8", "h100-llama2-70b-tp4",
                                          "h100-llama2-70b-tp8")) -> list[Cell]:
    """For each TP profile, runtime and shape of :data:`SHAPES`: the cited measurements and the predictions of them
    (each at the measurement's own context)."""
    predicted = {id(ref): p for ref, p in compare()}
    cells = []
    for profile in profiles:
        for runtime in RUNTIMES:
            for kind, size in SHAPES:
                refs = [r for r in REFERENCES if (r.profile, r.runtime, r.kind) == (profile, runtime, kind)
                        and (r.batch == size if kind == "decode" else (r.batch, r.input_len) == (1, size))]
                shape = f"decode b={size}" if kind == "decode" else f"prefill {size}"
                cells.append(Cell(profile, runtime, shape, tuple(r.measured_s for r in refs),
                                  tuple(predicted[id(r)] for r in refs)))
    return cells


def compare() -> list[tuple[Reference, float]]:
    """Every reference and the shipped profile's prediction for it under the reference's runtime (seconds)."""
    out = []
    for ref in REFERENCES:
        runtime = RUNTIMES[ref.runtime]
        latency = build_profile(*_build_key(ref.profile), runtime=runtime).latency
        out.append((ref, predict_s(latency, ref, int(runtime.max_batched_tokens.value))))
    return out
