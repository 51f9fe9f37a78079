"""Build schema-2 profiles from Vidur-format GPU tables (``servegym profile build``).

Measured: per-layer operator timings by tokens in the iteration (``compute/<gpu>/<org>/<model>/mlp.csv``),
all-reduce times by message size (``network/<node>/all_reduce.csv``) and host-side overheads by batch size
(``cpu_overheads/<gpu>/cpu_overheads.csv``), all from Vidur's public profiling data, copied unchanged into
``backends/vidur/`` with its MIT licence. Stated (data sheets and Vidur's device configs) or estimated, and
labelled so in the profile: memory bandwidth, peak FLOP/s, the attention efficiencies, the activation reserve
and the cold start. Attention is modelled from first principles because Vidur's attention tables were not
obtainable.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from servegym.backends.profile import Profile, ProfileError
from servegym.backends.runtimes import DEFAULT_RUNTIME, Runtime, Sourced, get_runtime
from servegym.backends.token_model import TokenLatencyModel

TABLES = Path(__file__).parent / "vidur"
"""The bundled copy of the tables (see ``backends/vidur/README.md``)."""
SOURCE = {
    "repository": "https://github.com/microsoft/vidur",
    "commit": "7d47513363ec447a741ac5e47241580b47724fbf",
    "cpu_overheads_commit": "6d98aa8f71696520acc603d87439e77cc78160a7",
    "folder": "data/profiling/",
    "licence": "MIT (Copyright (c) Microsoft Corporation); backends/vidur/LICENSE",
    "citation": "Agrawal et al.: Vidur: A Large-Scale Simulation Framework for LLM Inference, MLSys 2024",
}
LINEAR_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
              "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
"""Vidur's per-layer operators outside attention; ``emb`` runs once per iteration."""
CPU_COLUMNS = ("schedule_median", "sampler_e2e_median", "prepare_inputs_e2e_median", "process_model_outputs_median")
LINEAR_KNOTS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144,
                8192, 12288, 16384, 24576, 32768)
"""Token counts kept as knots of the linear term (those in the table); the others measure the fit error."""
GIB = 1024**3


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_gib: float
    bandwidth_bytes_s: float
    peak_fp16_flops_s: float
    node: str | None
    """The all-reduce table's node folder (None: no table, so no tensor-parallel profile)."""
    sources: str


@dataclass(frozen=True)
class ModelShape:
    table: str
    """``<org>/<model>`` folder of its operator table."""
    layers: int
    heads: int
    kv_heads: int
    hidden: int
    intermediate: int
    vocab: int
    params: float
    source: str

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


GPUS = {
    "a100": Gpu("NVIDIA A100-SXM4-80GB", 80.0, 2.039e12, 312e12, "a100_dgx",
                "memory and fp16 peak: Vidur's device config (80 GB, 312 TFLOP/s); bandwidth 2,039 GB/s: NVIDIA "
                "A100 data sheet (80GB SXM)"),
    "h100": Gpu("NVIDIA H100-SXM5-80GB", 80.0, 3.35e12, 1000e12, "h100_dgx",
                "memory and fp16 peak: Vidur's device config (80 GB, 1000 TFLOP/s); bandwidth 3.35 TB/s: NVIDIA "
                "H100 data sheet (SXM)"),
    "a40": Gpu("NVIDIA A40", 45.0, 696e9, 150e12, None,
               "memory and fp16 peak: Vidur's device config (45 GB, 150 TFLOP/s); bandwidth 696 GB/s: NVIDIA A40 "
               "data sheet"),
}
MODELS = {
    "llama2-7b": ModelShape("meta-llama/Llama-2-7b-hf", 32, 32, 32, 4096, 11008, 32000, 6.74e9,
                            "meta-llama/Llama-2-7b-hf config.json; 6.74e9 parameters (Llama 2 paper)"),
    "llama3-8b": ModelShape("meta-llama/Meta-Llama-3-8B", 32, 32, 8, 4096, 14336, 128256, 8.03e9,
                            "meta-llama/Meta-Llama-3-8B config.json; 8.03e9 parameters (model card)"),
    "llama2-70b": ModelShape("meta-llama/Llama-2-70b-hf", 80, 64, 8, 8192, 28672, 32000, 68.98e9,
                             "meta-llama/Llama-2-70b-hf config.json; 68.98e9 parameters (Llama 2 paper)"),
}
ESTIMATES = {
    "activation_reserve_gib": (2.0, "ESTIMATE: activations, CUDA graphs and allocator slack per GPU (vLLM "
                                    "profiles them with a dummy batch; 1-3 GiB is typical at default settings)"),
    "gpu_memory_utilization": (0.9, "vLLM's default"),
    "load_bytes_s": (2.0e9, "ESTIMATE: checkpoint load rate from local NVMe into GPU memory"),
    "cold_start_fixed_s": (5.0, "ESTIMATE: container start, CUDA context and engine initialisation"),
}
SHIPPED = (("a100", "llama3-8b", 1), ("a100", "llama2-7b", 1), ("h100", "llama2-7b", 1), ("a40", "llama2-7b", 1),
           ("a100", "llama2-70b", 4), ("h100", "llama2-70b", 4), ("a100", "llama2-70b", 8),
           ("h100", "llama2-70b", 8))
"""(gpu, model, TP) of the shipped profiles; names are ``<gpu>-<model>[-tp<N>]``."""


def profile_name(gpu: str, model: str, tp: int) -> str:
    return f"{gpu}-{model}" + (f"-tp{tp}" if tp > 1 else "")


def _read(path: Path, required: tuple[str, ...]) -> list[dict[str, str]]:
    if not path.is_file():
        raise ProfileError(f"table {path} does not exist")
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise ProfileError(f"table {path}: missing column(s) {missing}")
        return list(reader)


def _median_by(rows: list[dict[str, str]], key: str, value) -> tuple[np.ndarray, np.ndarray]:
    groups: dict[float, list[float]] = {}
    for row in rows:
        groups.setdefault(float(row[key]), []).append(value(row))
    xs = np.array(sorted(groups))
    return xs, np.array([float(np.median(groups[x])) for x in xs])


def _relative_errors(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    return np.abs(predicted - measured) / measured


def linear_term(tables: Path, gpu: str, shape: ModelShape, tp: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """Knots and seconds of every layer's linear operators plus the embedding, and the fit's report."""
    path = tables / "compute" / gpu / shape.table / "mlp.csv"
    columns = tuple(f"time_stats.{op}.median" for op in (*LINEAR_OPS, "emb"))
    rows = _read(path, (*columns, "num_tokens", "num_tensor_parallel_workers", "n_head", "n_kv_head", "n_embd",
                        "n_expanded_embd", "vocab_size"))
    rows = [r for r in rows if int(r["num_tensor_parallel_workers"]) == tp]
    if not rows:
        raise ProfileError(f"table {path}: no rows for tensor-parallel degree {tp}")
    # vocab_size is left out: Vidur profiled Llama-2 with its vocabulary padded to 32,768.
    facts = {"n_head": shape.heads, "n_kv_head": shape.kv_heads, "n_embd": shape.hidden,
             "n_expanded_embd": shape.intermediate}
    for column, expected in facts.items():
        if int(rows[0][column]) != expected:
            raise ProfileError(f"table {path}: {column} is {rows[0][column]}, the model {shape.table} has {expected}")

    def iteration_ms(row: dict[str, str]) -> float:
        layer = sum(float(row[f"time_stats.{op}.median"]) for op in LINEAR_OPS)
        return shape.layers * layer + float(row["time_stats.emb.median"])

    tokens, ms = _median_by(rows, "num_tokens", iteration_ms)
    keep = np.isin(tokens, LINEAR_KNOTS)
    knots, values = tokens[keep], np.maximum.accumulate(ms[keep])  # the monotone envelope
    error = _relative_errors(np.interp(tokens, knots, values), ms)
    report = {"rows": int(tokens.size), "knots": int(knots.size), "median_rel_error": float(np.median(error)),
              "max_rel_error": float(error.max()), "table": str(path.relative_to(tables))}
    return knots, values / 1e3, report


def allreduce_term(tables: Path, gpu: Gpu, shape: ModelShape, tp: int, knots: np.ndarray,
                   runtime: Runtime) -> tuple[np.ndarray, dict]:
    """Seconds of two all-reduces per layer of ``T x hidden`` fp16 values at each token knot: the runtime's custom
    all-reduce where it has one and the message fits, else NCCL's measured table."""
    if tp == 1:
        return np.zeros(knots.size), {"measured": "none needed (one GPU)"}
    if gpu.node is None:
        raise ProfileError(f"no all-reduce table for {gpu.name}: tensor parallelism {tp} cannot be profiled")
    path = tables / "network" / gpu.node / "all_reduce.csv"
    rows = _read(path, ("time_stats.all_reduce.median", "num_workers", "size", "devices_per_node"))
    # All workers in one node (NVSwitch): the table also holds runs spread over several nodes.
    rows = [r for r in rows if int(r["num_workers"]) == tp and int(r["devices_per_node"]) == tp]
    if not rows:
        raise ProfileError(f"table {path}: no rows for {tp} workers in one node")
    size, ms = _median_by(rows, "size", lambda r: float(r["time_stats.all_reduce.median"]))
    log_size, log_ms = np.log(size), np.log(ms)
    # Leave-one-out: each inner size predicted from its neighbours measures the interpolation's error.
    inner = np.arange(1, size.size - 1)
    loo = np.exp(log_ms[inner - 1] + (log_ms[inner + 1] - log_ms[inner - 1]) * (log_size[inner] - log_size[inner - 1])
                 / (log_size[inner + 1] - log_size[inner - 1]))
    error = _relative_errors(loo, ms[inner])
    message = knots * shape.hidden * 2.0
    per_call_ms = np.exp(np.interp(np.log(message), log_size, log_ms))
    report = {"rows": int(size.size), "median_rel_error": float(np.median(error)), "max_rel_error": float(error.max()),
              "table": str(path.relative_to(tables)), "node": gpu.node}
    custom = runtime.custom_allreduce
    if custom is not None:
        in_graph = [custom.call_s(m) for m in message]
        per_call_ms = np.array([nccl if c is None else c * 1e3 for c, nccl in zip(in_graph, per_call_ms, strict=True)])
        report["custom"] = {"max_bytes": custom.max_bytes, "latency_s": custom.latency_s.value,
                            "bus_bandwidth_bytes_s": custom.bus_bandwidth_bytes_s.value,
                            "knots_below_max": int(sum(c is not None for c in in_graph)),
                            "source": custom.latency_s.source}
    return np.maximum.accumulate(2 * shape.layers * per_call_ms) / 1e3, report


def cpu_term(tables: Path, gpu: str, shape: ModelShape, tp: int,
             runtime: Runtime) -> tuple[np.ndarray, np.ndarray, float, dict]:
    """Host-side seconds per iteration by batch size, from the closest measured configuration, with the runtime's
    dispatch to tensor-parallel workers; and the seconds per request beyond the largest measured batch."""
    wanted = shape.table
    candidates = [(gpu, wanted, tp, "measured")]
    family = "meta-llama/Llama-2-70b-hf" if shape.layers == 80 else "meta-llama/Llama-2-7b-hf"
    for other_gpu in (gpu, "a100"):
        for other_tp in (tp, 4, 1):
            label = f"ESTIMATE: borrowed from {other_gpu} {family} TP{other_tp}"
            candidates.append((other_gpu, family, other_tp, label))
    for table_gpu, model, table_tp, label in candidates:
        path = tables / "cpu_overheads" / table_gpu / "cpu_overheads.csv"
        if not path.is_file():
            continue
        rows = _read(path, (*CPU_COLUMNS, "model_name", "batch_size", "tensor_parallel_degree"))
        rows = [r for r in rows if r["model_name"] == model and int(r["tensor_parallel_degree"]) == table_tp]
        if rows:
            source = label
            break
    else:
        raise ProfileError(f"no cpu_overheads rows for {gpu} {wanted} TP{tp} or a fallback")

    per_row = runtime.host_s_per_row[gpu].value + (runtime.tp_dispatch_s_per_row.value if tp > 1 else 0.0)

    def ms(row: dict[str, str]) -> float:
        if tp == 1:
            dispatch = 0.0
        elif runtime.tp_dispatch_from_table:
            dispatch = float(row.get("ray_comm_time_mean") or 0.0) if table_tp > 1 else 0.0
        else:
            dispatch = runtime.tp_dispatch_s.value * 1e3
        runtime_ms = (dispatch + per_row * 1e3 * int(row["batch_size"])) if per_row else dispatch
        return sum(float(row[c]) for c in CPU_COLUMNS) + runtime_ms

    batch, values = _median_by(rows, "batch_size", ms)
    envelope = np.maximum.accumulate(values)
    envelope_error = float(np.median(_relative_errors(envelope, values)))
    if per_row and batch[0] > 1:  # the per-request cost scales down to one request; the table's floor does not
        batch = np.concatenate(([1.0], batch))
        envelope = np.concatenate(([envelope[0] - (batch[1] - 1) * per_row * 1e3], envelope))
    tail = max(0.0, float(np.polyfit(batch, envelope, 1)[0])) / 1e3
    report = {"source": source, "table": str(path.relative_to(tables)), "rows": int(batch.size),
              "median_rel_error": envelope_error,
              "dispatch": "none (one GPU)" if tp == 1 else ("measured: the table's ray_comm_time_mean"
                                                            if runtime.tp_dispatch_from_table
                                                            else f"{runtime.tp_dispatch_s.kind}: "
                                                                 f"{runtime.tp_dispatch_s.source}"),
              "tail_s_per_row": tail,
              "note": "knots at every measured batch size; the error is the monotone envelope's change; below "
                      "the smallest measured batch the smallest batch's time holds; beyond the largest, a stated "
                      "model: host work per request at the least-squares slope over the measured batches"}
    return batch, envelope / 1e3, tail, report


def kv_capacity(gpu: Gpu, shape: ModelShape, tp: int, block_size: int = 16) -> tuple[int, dict[str, Any]]:
    """KV blocks as vLLM sizes them: utilisation x memory - weights - activations, over KV bytes per token."""
    utilisation = ESTIMATES["gpu_memory_utilization"][0]
    reserve = ESTIMATES["activation_reserve_gib"][0] * GIB
    weights = shape.params * 2.0 / tp
    per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * 2 / tp
    free = utilisation * gpu.memory_gib * GIB - weights - reserve
    if free <= 0:
        raise ProfileError(f"{shape.table} TP{tp} does not fit on {gpu.name}: weights {weights / GIB:.1f} GiB")
    blocks = int(free // per_token) // block_size
    return blocks, {"gpu_memory_utilization": utilisation, "memory_gib": gpu.memory_gib,
                    "weights_gib_per_gpu": weights / GIB, "activation_reserve_gib": reserve / GIB,
                    "kv_bytes_per_token_per_gpu": per_token, "kv_tokens": blocks * block_size}


def build_profile(gpu_key: str, model_key: str, tp: int, tables: Path = TABLES, date: str = "2026-12-02",
                  runtime: str | Runtime = DEFAULT_RUNTIME) -> Profile:
    """The schema-2 profile of ``model_key`` on ``gpu_key`` with tensor parallelism ``tp`` under ``runtime`` (a
    registered name, or a :class:`Runtime` object, as the runtime fit passes its candidates)."""
    try:
        rt = runtime if isinstance(runtime, Runtime) else get_runtime(runtime)
    except ValueError as err:
        raise ProfileError(str(err)) from None
    if gpu_key not in GPUS:
        raise ProfileError(f"GPU {gpu_key!r} has no stated specs; known: {sorted(GPUS)}")
    if model_key not in MODELS:
        raise ProfileError(f"model {model_key!r} unknown; known: {sorted(MODELS)}")
    gpu, shape = GPUS[gpu_key], MODELS[model_key]
    knots, linear_s, linear_report = linear_term(tables, gpu_key, shape, tp)
    allreduce_s, allreduce_report = allreduce_term(tables, gpu, shape, tp, knots, rt)
    cpu_rows, cpu_s, cpu_tail, cpu_report = cpu_term(tables, gpu_key, shape, tp, rt)
    blocks, kv_report = kv_capacity(gpu, shape, tp)
    bw, flops = rt.decode_bandwidth_efficiency[gpu_key], rt.prefill_flops_efficiency[gpu_key]
    bw_eff, flops_eff = bw.value, flops.value
    scale = rt.linear_scale[gpu_key]
    if scale.value != 1.0:
        linear_s = linear_s * scale.value
    latency = TokenLatencyModel(
        cpu_rows=tuple(cpu_rows.tolist()), cpu_s=tuple(cpu_s.tolist()),
        linear_tokens=tuple(knots.tolist()), linear_s=tuple(linear_s.tolist()),
        allreduce_s=tuple(allreduce_s.tolist()),
        kv_bytes_per_token=kv_report["kv_bytes_per_token_per_gpu"],
        decode_bandwidth_bytes_s=gpu.bandwidth_bytes_s * bw_eff,
        attention_flops_per_pair=4.0 * shape.heads * shape.head_dim * shape.layers / tp,
        prefill_flops_s=gpu.peak_fp16_flops_s * flops_eff,
        lm_head_bytes=shape.vocab * shape.hidden * 2.0 / tp,
        lm_head_flops_per_row=2.0 * shape.vocab * shape.hidden / tp,
        memory_bandwidth_bytes_s=gpu.bandwidth_bytes_s, peak_flops_s=gpu.peak_fp16_flops_s,
        launch_floor_s=shape.layers * rt.launch_s_per_layer[gpu_key].value, cpu_tail_s_per_row=cpu_tail,
    )
    weights_bytes = shape.params * 2.0 / tp
    cold = weights_bytes / ESTIMATES["load_bytes_s"][0] + ESTIMATES["cold_start_fixed_s"][0]
    provenance = {
        "hardware": f"{gpu.name}" + (f" x{tp} (tensor parallel, {gpu.node})" if tp > 1 else ""),
        "model": f"{shape.table}, fp16",
        "method": f"schema 2 built by `servegym profile build` from Vidur's measured tables for the {rt.name!r} "
                  "runtime; attention, LM head and KV capacity from first principles; every estimate labelled",
        "date": date,
        "build": {"gpu": gpu_key, "model": model_key, "tp": tp},
        "source": SOURCE,
        "gpu": {"name": gpu.name, "memory_gib": gpu.memory_gib, "bandwidth_bytes_s": gpu.bandwidth_bytes_s,
                "peak_fp16_flops_s": gpu.peak_fp16_flops_s, "sources": gpu.sources},
        "model_shape": {"layers": shape.layers, "heads": shape.heads, "kv_heads": shape.kv_heads,
                        "head_dim": shape.head_dim, "hidden": shape.hidden, "intermediate": shape.intermediate,
                        "vocab": shape.vocab, "params": shape.params, "tensor_parallel": tp, "source": shape.source},
        "terms": {
            "cpu": {"kind": "measured", **cpu_report},
            "linear": {"kind": "measured", **linear_report, "runtime_scale": scale.value,
                       "runtime_scale_note": f"{scale.kind.upper()}: {scale.source}"},
            "allreduce": {"kind": "measured" if tp > 1 else "zero", **allreduce_report},
            "decode_attention": {"kind": "first principles", "efficiency": bw_eff,
                                 "note": f"{bw.kind.upper()}: {bw.source}"},
            "prefill_attention": {"kind": "first principles", "efficiency": flops_eff,
                                  "note": f"{flops.kind.upper()}: {flops.source}"},
            "launch": {"kind": rt.launch_s_per_layer[gpu_key].kind,
                       "s_per_layer": rt.launch_s_per_layer[gpu_key].value,
                       "note": rt.launch_s_per_layer[gpu_key].source},
            "lm_head": {"kind": "first principles", "note": "roofline: weights read once or 2 x hidden x vocab "
                        "FLOPs per emitting row at peak, whichever is slower"},
        },
        "kv_cache": {**kv_report, "note": ESTIMATES["activation_reserve_gib"][1]},
        "cold_start": {"kind": "ESTIMATE", "weights_gib_per_gpu": weights_bytes / GIB,
                       "load_bytes_s": ESTIMATES["load_bytes_s"][0], "fixed_s": ESTIMATES["cold_start_fixed_s"][0]},
    }
    return Profile(profile_name(gpu_key, model_key, tp), latency, blocks, 16, round(cold, 3), provenance, rt.name)


def runtime_terms(gpu_key: str, rt: Runtime) -> dict[str, str]:
    """One line per runtime number a profile on ``gpu_key`` uses: value, kind and source (``profile show``)."""
    def line(item: Sourced) -> str:
        return f"{item.value:g} ({item.kind}: {item.source})"

    lines = {"launch_s_per_layer": line(rt.launch_s_per_layer[gpu_key]),
             "host_s_per_row": line(rt.host_s_per_row[gpu_key]), "linear_scale": line(rt.linear_scale[gpu_key]),
             "tp_dispatch": ("the CPU table's ray_comm_time_mean (measured)" if rt.tp_dispatch_from_table
                             else line(rt.tp_dispatch_s)),
             "tp_dispatch_s_per_row": line(rt.tp_dispatch_s_per_row),
             "decode_bandwidth_efficiency": line(rt.decode_bandwidth_efficiency[gpu_key]),
             "prefill_flops_efficiency": line(rt.prefill_flops_efficiency[gpu_key]),
             "max_batched_tokens": line(rt.max_batched_tokens)}
    if rt.custom_allreduce is not None:
        ar = rt.custom_allreduce
        lines["custom_allreduce"] = (f"up to {ar.max_bytes:,} bytes: {line(ar.latency_s)} + bytes / "
                                     f"{line(ar.bus_bandwidth_bytes_s)}")
    else:
        lines["allreduce"] = "NCCL, Vidur's measured table"
    return lines


def rebuild_shipped(out: Path, tables: Path = TABLES) -> list[Path]:
    """Build every shipped schema-2 profile into ``out``; return the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for gpu, model, tp in SHIPPED:
        profile = build_profile(gpu, model, tp, tables)
        path = out / f"{profile.name}.json"
        profile.save(path)
        written.append(path)
    return written


def fit_report(profile: Profile) -> list[str]:
    """One line per measured term: its median (and max) relative error against the table it came from."""
    lines = []
    for term, info in profile.provenance.get("terms", {}).items():
        if "median_rel_error" in info:
            extra = f", max {info['max_rel_error']:.1%}" if "max_rel_error" in info else ""
            source = f"; {info['source']}" if "source" in info else ""
            lines.append(f"{term}: median {info['median_rel_error']:.2%}{extra} ({info.get('table', '')}{source})")
        else:
            lines.append(f"{term}: {info.get('kind')}" + (f", efficiency {info['efficiency']}"
                                                           if "efficiency" in info else ""))
    return lines

