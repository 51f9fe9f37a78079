"""servegym and Vidur side by side: the same requests, both as whole processes, alternately, in one run.

Usage::

    python benchmarks/vs_vidur.py --vidur-python VENV/bin/python --vidur-source VIDUR_CHECKOUT
                                  [--release-python RELEASE_VENV/bin/python]
                                  [--requests 5000] [--pairs 3] [--rates trace 2] [--policies fcfs vllm]

This script installs nothing. It needs a Python environment that runs Vidur (github.com/microsoft/vidur) from a
source checkout: ``git clone`` the repository, create a venv, ``pip install -r requirements.txt`` there, and pass
that venv's interpreter and the checkout. The venv must not hold the ``vidur`` release from the package index: the
checkout's ``vidur`` has no ``__init__.py``, so an installed ``vidur`` package shadows it. The checkout's Git LFS
attention tables are usually absent; the script then writes a stand-in ``attention.csv`` from servegym's own
first-principles attention terms (the ``a100-llama2-7b`` profile's KV bytes per token over its decode bandwidth,
its FLOPs per query-key pair over its prefill FLOP/s, per layer), so both simulators price attention alike and
Vidur's own measured MLP tables price everything else.

``--release-python``: also run the ``vidur`` release from the package index (``pip install vidur`` in a second
venv; 0.0.26 when this was written). It reads its profiling tables from HuggingFace datasets at run time; the
script builds them offline, in the hub's cache layout, from the checkout's MLP and network tables and the same
attention table, and runs it with ``HF_HUB_OFFLINE=1`` from the work folder (where no ``vidur`` folder shadows
it), on the same requests in its own trace format, with its prompt, decode and time scale factors at 1.0 (its
defaults, 0.3 and 0.04 for prompts and time, would simulate other work). A rate at which a Vidur fails (0.0.26
has been seen to crash when a preempted request restarts) is reported and that Vidur left out at that rate.

What runs: the first ``--requests`` requests of the bundled Azure code trace (Llama-2-7B on one A100), each
clipped as Vidur's trace replay clips (prompt + output at most 4,096 tokens, the prompt shortened), written in
each simulator's input format with the same arrival times. ``--rates``: ``trace`` replays the trace's own
timing; a number stretches the arrival times to that mean rate (requests per second). Vidur runs its vLLM
scheduler (128 requests, 4,096 tokens a batch, 16-token blocks; CPU overhead modelling off, its default);
servegym runs each ``--policies`` policy with the same limits on the ``a100-llama2-7b`` profile. Each pair
is each Vidur then servegym (A B A B ...), each a fresh ``python`` process timed from launch to exit (imports,
trace parse and writing its results included, after an untimed ``sync`` flushes what the runs before it wrote),
with Python's bytecode caches written by an untimed first run of each side, as a user's second run has them;
Vidur writes no plots or chrome trace, and servegym's side is
``vs_vidur_servegym.py``, which loads only what its episode needs. One untimed run of each
Vidur first trains and caches its execution-time predictor (``--workdir``), as Vidur's own cache does for a user.

Printed: each side's simulated iterations, makespan, mean end-to-end latency and mean TTFT, and every pair's
wall times and ratios (servegym / each Vidur), then the median ratio per rate, policy and Vidur.
"""

from __future__ import annotations

import argparse
import csv
import json
import lzma
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

MAX_TOKENS = 4096
"""Vidur's trace replay clips prompt + output to this (``max_tokens``); both sides get the clipped requests."""
MODEL = "meta-llama/Llama-2-7b-hf"
VIDUR_COMPUTE = f"data/profiling/compute/a100/{MODEL}"
VIDUR_ATTENTION, VIDUR_MLP = f"{VIDUR_COMPUTE}/attention.csv", f"{VIDUR_COMPUTE}/mlp.csv"
VIDUR_NETWORK = "a100_pairwise_nvlink"
"""The checkout's network tables for one A100 (Vidur's default for its a100 replicas)."""
RELEASE_DATASETS = {"compute": "servegym/a100-llama-2-7b", "network": "servegym/a100-pairwise-nvlink"}
"""The names under which the release finds its profiling datasets in the offline HuggingFace cache."""
RELEASE_DATE = "2023-08-21"
"""The release's trace replay keeps the rows of one ``Date``; every row gets this one."""
PROFILE = "a100-llama2-7b"
SERVEGYM_SIDE = Path(__file__).with_name("vs_vidur_servegym.py")
LIMITS = ("max_num_seqs", "max_num_batched_tokens", "prefill_chunk_tokens")
"""The engine settings servegym's side reports it ran with (printed once per policy)."""
"""servegym's side: a script that loads only what its episode needs (this one's imports are the harness's)."""
BATCH_CAP, TOKEN_BUDGET, BLOCK = 128, 4096, 16


def requests(count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Arrival times (s from the first), prompt and output lengths of the trace's first ``count`` requests,
    clipped as Vidur clips them."""
    from servegym.workloads import TraceWorkload, bundled_trace

    spec = TraceWorkload(str(bundled_trace()), max_requests=count).sample(np.random.default_rng(0))
    prompt = np.maximum(spec.num_prompt_tokens.astype(np.int64), 1)
    output = np.maximum(spec.num_output_tokens.astype(np.int64), 1)
    prompt = prompt - np.maximum(prompt + output - MAX_TOKENS, 0)
    return spec.arrival_s.astype(float), prompt, output


class Inputs(NamedTuple):
    """One rate's traces: the same requests in each simulator's format, and the time scale applied."""

    servegym: Path
    vidur: Path
    """The git head's columns: ``arrived_at,num_prefill_tokens,num_decode_tokens``."""
    release: Path
    """The release's columns: ``Date,Time,PromptTokenCount,CompletionTokenCount``."""
    scale: float


def write_csv(path: Path, header: list[str], rows: list[list[object]]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def write_inputs(work: Path, count: int, rates: list[str]) -> dict[str, Inputs]:
    """Per rate: the servegym trace (Azure's columns), Vidur's traces (git head and release) and the time scale."""
    arrival, prompt, output = requests(count)
    span = arrival[-1] - arrival[0]
    out = {}
    for rate in rates:
        scale = 1.0 if rate == "trace" else (count - 1) / span / float(rate)
        times = arrival * scale
        ns = [round(t * 1e9) for t in times]  # every side's arrival times, to the nanosecond
        seconds = [f"{t / 1e9:.9f}" for t in ns]
        start = np.datetime64("2023-11-16T00:00:00", "ns")
        lengths = [(int(p), int(o)) for p, o in zip(prompt, output, strict=True)]
        paths = {side: work / f"{side}-{rate}.csv" for side in ("servegym", "vidur", "release")}
        stamps = [str(start + np.timedelta64(t, "ns")).replace("T", " ") for t in ns]
        write_csv(paths["servegym"], ["TIMESTAMP", "ContextTokens", "GeneratedTokens"],
                  [[t, *pair] for t, pair in zip(stamps, lengths, strict=True)])
        write_csv(paths["vidur"], ["arrived_at", "num_prefill_tokens", "num_decode_tokens"],
                  [[t, *pair] for t, pair in zip(seconds, lengths, strict=True)])
        write_csv(paths["release"], ["Date", "Time", "PromptTokenCount", "CompletionTokenCount"],
                  [[RELEASE_DATE, t, *pair] for t, pair in zip(seconds, lengths, strict=True)])
        out[rate] = Inputs(**paths, scale=scale)
    return out


def stand_in_attention(path: Path) -> None:
    """Vidur's attention table for Llama-2-7B on one A100, from servegym's first-principles terms (per layer)."""
    from servegym.backends import load_profile

    profile = load_profile(PROFILE)
    shape = profile.provenance["model_shape"]
    latency = profile.latency
    layers = shape["layers"]
    kv_bytes = latency.kv_bytes_per_token / layers
    flops_pair = latency.attention_flops_per_pair / layers
    rows = []
    for batch in (1, 2, 4, 8, 16, 32, 64, 96, 128):
        for kv in range(0, MAX_TOKENS + 1, 256):
            decode_ms = batch * kv * kv_bytes / latency.decode_bandwidth_bytes_s * 1e3
            rows.append((batch, kv, 0, 0.0, decode_ms))
    for chunk in (16, 64, 128, 256, 512, 1024, 1536, 2048, 3072, 4096):
        for kv in range(0, MAX_TOKENS + 1 - chunk, 256):
            pairs = chunk * kv + chunk * (chunk + 1) / 2
            rows.append((1, kv, chunk, pairs * flops_pair / latency.prefill_flops_s * 1e3, 0.0))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["n_embd", "n_q_head", "n_kv_head", "block_size", "num_tensor_parallel_workers",
                         "batch_size", "kv_cache_size", "prefill_chunk_size", "time_stats.attn_prefill.median",
                         "time_stats.attn_decode.median"])
        for batch, kv, chunk, prefill_ms, decode_ms in rows:
            writer.writerow([shape["hidden"], shape["heads"], shape["kv_heads"], BLOCK, 1, batch, kv, chunk,
                             prefill_ms, decode_ms])


def release_cache(cache: Path, source: Path, attention: Path) -> None:
    """The profiling datasets the release downloads from HuggingFace at run time, built offline in the hub's
    cache layout from the checkout's tables (MLP, network) and ``attention`` (``HF_HUB_OFFLINE=1`` reads them)."""
    network = source / "data/profiling/network" / VIDUR_NETWORK
    for kind, files, config in (
        ("compute", {"mlp": source / VIDUR_MLP, "attention": attention}, {"model": MODEL, "device_sku": "a100"}),
        ("network", {name: network / f"{name}.csv" for name in ("all_reduce", "send_recv")}, {"sku": VIDUR_NETWORK}),
    ):
        repo = cache / "profiling_data" / kind / f"datasets--{RELEASE_DATASETS[kind].replace('/', '--')}"
        revision = "0" * 40
        snapshot = repo / "snapshots" / revision
        snapshot.mkdir(parents=True, exist_ok=True)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(revision)
        for name, table in files.items():
            with table.open("rb") as f, lzma.open(snapshot / f"{name}.csv.xz", "wb") as out:
                shutil.copyfileobj(f, out)
        (snapshot / "config.json").write_text(json.dumps(config))


def vidur_command(python: str, trace: Path, attention: Path, out: Path, cache: Path,
                  count_batches: bool = False, release: bool = False) -> list[str]:
    """Vidur's command line for ``trace`` (``release``: the package index's ``vidur``, reading the offline cache
    of :func:`release_cache`); ``count_batches`` also writes every batch (to count iterations, in an untimed run:
    the timed runs keep Vidur's default sketches)."""
    predictor = "--random_forrest_execution_time_predictor_config_"
    if release:  # its scale factors default to 0.3 (prompts) and 0.04 (time): both set to 1.0 below
        inputs = ["--replica_config_network_device", VIDUR_NETWORK, "--trace_request_generator_config_date",
                  RELEASE_DATE, predictor + "model_profiling_dataset", RELEASE_DATASETS["compute"],
                  predictor + "network_profiling_dataset", RELEASE_DATASETS["network"], predictor + "cache_dir",
                  str(cache),
                  # The git head's prediction grid (the release's: to 2M tokens a request, every 256 of KV), so
                  # that it does not load predictions for requests 500 times longer than any here.
                  predictor + "prediction_max_tokens_per_request", str(MAX_TOKENS),
                  predictor + "kv_cache_prediction_granularity", "64"]
    else:
        inputs = ["--vllm_scheduler_config_block_size", str(BLOCK), predictor + "attention_input_file", str(attention),
                  "--metrics_config_cache_dir", str(cache)]
    return [python, "-m", "vidur.main",
            "--replica_config_device", "a100", "--replica_config_model_name", MODEL,
            "--cluster_config_num_replicas", "1", "--replica_config_tensor_parallel_size", "1",
            "--replica_config_num_pipeline_stages", "1",
            "--request_generator_config_type", "trace_replay",
            "--trace_request_generator_config_trace_file", str(trace),
            "--trace_request_generator_config_max_tokens", str(MAX_TOKENS),
            "--trace_request_generator_config_prefill_scale_factor", "1.0",
            "--trace_request_generator_config_decode_scale_factor", "1.0",
            "--trace_request_generator_config_time_scale_factor", "1.0",
            "--replica_scheduler_config_type", "vllm",
            "--vllm_scheduler_config_batch_size_cap", str(BATCH_CAP),
            "--vllm_scheduler_config_max_tokens_in_batch", str(TOKEN_BUDGET), *inputs,
            "--metrics_config_output_dir", str(out),
            "--no-metrics_config_store_plots", "--no-metrics_config_enable_chrome_trace",
            *(["--metrics_config_keep_individual_batch_metrics"] if count_batches else [])]


def newest_run(out: Path) -> Path:
    return max(out.iterdir(), key=lambda p: p.stat().st_mtime)


def vidur_results(out: Path, log: str) -> dict[str, float]:
    """Makespan (the simulator's last event, from its log), mean E2E and TTFT (its request metrics)."""
    with (newest_run(out) / "request_metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    ended = re.findall(r"Simulation ended at: ([0-9.]+)s", log)
    return {"requests": len(rows), "makespan_s": float(ended[-1]) if ended else float("nan"),
            "mean_e2e_s": float(np.mean([float(r["request_e2e_time"]) for r in rows])),
            "mean_ttft_s": float(np.mean([float(r["prefill_e2e_time"]) for r in rows]))}


def vidur_iterations(out: Path) -> int:
    """Batches Vidur ran, from a ``count_batches`` run's ``batch_metrics.csv``."""
    with (newest_run(out) / "batch_metrics.csv").open() as f:
        return sum(1 for _ in f) - 1


def servegym_command(trace: Path, policy: str) -> list[str]:
    return [sys.executable, str(SERVEGYM_SIDE), str(trace), policy, PROFILE, str(BATCH_CAP), str(TOKEN_BUDGET)]


def timed(command: list[str], cwd: str | None = None) -> tuple[float, str]:
    """Wall time of ``command`` as a whole process, and its output (stdout then stderr). The files earlier runs
    wrote are flushed to disk first, untimed, so that their write-back does not land in this process's time."""
    if hasattr(os, "sync"):  # POSIX only
        os.sync()
    # Bytecode is cached as for any user (an inherited PYTHONDONTWRITEBYTECODE would make each side recompile its
    # own sources in every timed run); the untimed first runs write the caches.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False,
                          env={**env, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"})
    wall = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"{command[:3]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return wall, done.stdout + done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vidur-python", help="a Python that runs Vidur's checkout (its venv's bin/python)")
    parser.add_argument("--vidur-source", help="a Vidur source checkout (github.com/microsoft/vidur)")
    parser.add_argument("--release-python", help="also run the package index's vidur: a Python with it installed")
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rates", nargs="+", default=["trace", "2"])
    parser.add_argument("--policies", nargs="+", default=["fcfs", "vllm"])
    parser.add_argument("--workdir", default="/tmp/servegym-vs-vidur")
    args = parser.parse_args()
    if not (args.vidur_python and args.vidur_source):
        parser.error("--vidur-python and --vidur-source are required (this script installs nothing)")
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    source = Path(args.vidur_source).resolve()
    attention = source / VIDUR_ATTENTION
    if not attention.exists() or attention.stat().st_size < 1000:  # absent, or a Git LFS pointer
        attention = work / "attention-stand-in.csv"
        stand_in_attention(attention)
        print(f"Vidur's attention table is absent: stand-in from servegym's {PROFILE} terms at {attention}")
    inputs = write_inputs(work, args.requests, args.rates)
    # Each Vidur: its interpreter, its working folder (the checkout's vidur is a folder there; the release must
    # not see one), its trace per rate, its cache and its output folder.
    vidurs = {"Vidur head": (args.vidur_python, source, False)}
    if args.release_python:
        release_cache(work / "release-cache", source, attention)
        vidurs["Vidur release"] = (args.release_python, work, True)

    def command(kind: str, rate: str, count_batches: bool = False) -> tuple[list[str], str, Path]:
        python, cwd, release = vidurs[kind]
        trace = inputs[rate].release if release else inputs[rate].vidur
        cache = work / ("release-cache" if release else "vidur-cache")
        out = work / ("release-out" if release else "head-out")
        return vidur_command(python, trace, attention, out, cache, count_batches, release), str(cwd), out

    for kind in vidurs:
        print(f"warming {kind}'s predictor cache (untimed) ...", flush=True)
        cmd, cwd, _ = command(kind, args.rates[-1])
        try:
            print(f"  {timed(cmd, cwd=cwd)[0]:.1f} s", flush=True)
        except RuntimeError as error:  # it trains before it simulates: the cache is warm even so
            print(f"  it failed after training: {str(error).strip().splitlines()[-1]}", flush=True)
    for policy in args.policies:  # untimed, as Vidur's first run: its bytecode caches are written
        timed(servegym_command(inputs[args.rates[-1]].servegym, policy))
    print(f"{args.requests} requests of the bundled Azure code trace, clipped to {MAX_TOKENS} tokens; Llama-2-7B, "
          f"one A100; {BATCH_CAP} requests and {TOKEN_BUDGET} tokens a batch; {time.strftime('%Y-%m-%d')}, "
          f"{os.cpu_count()} CPUs")
    print(f"{'rate':>6} {'pair':>4} {'side':<18} {'wall s':>7} {'iterations':>10} {'makespan s':>10} "
          f"{'mean E2E s':>10} {'mean TTFT s':>11} ratio per Vidur")
    ratios: dict[tuple[str, str, str], list[float]] = {}
    shown: set[str] = set()
    for rate in args.rates:
        batches = {}
        for kind in vidurs:
            cmd, cwd, out = command(kind, rate, count_batches=True)
            try:
                timed(cmd, cwd=cwd)
            except RuntimeError as error:  # e.g. the release's crash on a preempted request's restart
                last = str(error).strip().splitlines()[-1]
                print(f"rate {rate}: {kind} failed, left out at this rate: {last}", flush=True)
                continue
            batches[kind] = vidur_iterations(out)
        print(f"rate {rate}: arrival times x {inputs[rate].scale:.3f}; batches (counted in an untimed run): "
              + ", ".join(f"{kind} {n}" for kind, n in batches.items()), flush=True)
        for pair in range(args.pairs):
            walls = {}
            for kind in batches:
                cmd, cwd, out = command(kind, rate)
                walls[kind], log = timed(cmd, cwd=cwd)
                v = vidur_results(out, log)
                print(f"{rate:>6} {pair:>4} {kind:<18} {walls[kind]:>7.2f} {batches[kind]:>10} "
                      f"{v['makespan_s']:>10.1f} {v['mean_e2e_s']:>10.2f} {v['mean_ttft_s']:>11.3f}", flush=True)
            for policy in args.policies:
                wall, stdout = timed(servegym_command(inputs[rate].servegym, policy))
                s = json.loads(stdout.strip().splitlines()[-1])
                if policy not in shown:  # what servegym's engine ran with, once per policy
                    shown.add(policy)
                    print(f"servegym {policy}: " + ", ".join(f"{k} {s[k]}" for k in LIMITS), flush=True)
                for kind, vidur_wall in walls.items():
                    ratios.setdefault((rate, policy, kind), []).append(wall / vidur_wall)
                print(f"{rate:>6} {pair:>4} {'servegym ' + policy:<18} {wall:>7.2f} {s['iterations']:>10} "
                      f"{s['makespan_s']:>10.1f} {s['mean_e2e_s']:>10.2f} {s['mean_ttft_s']:>11.3f} "
                      + " ".join(f"{wall / w:>6.3f}" for w in walls.values()), flush=True)
    print("median servegym / Vidur wall-time ratio (min-max over pairs):")
    for (rate, policy, kind), values in ratios.items():
        print(f"  rate {rate}, servegym {policy} / {kind}: {statistics.median(values):.3f} "
              f"({min(values):.3f}-{max(values):.3f}), {1 / statistics.median(values):.1f}x faster")


if __name__ == "__main__":
    main()
