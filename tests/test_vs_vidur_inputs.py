"""benchmarks/vs_vidur.py's inputs, without Vidur: every simulator gets the same requests at the same times, the
release's offline cache has the hub's layout, and its command sets the scale factors that default to other work."""

from __future__ import annotations

import csv
import itertools
import json
import lzma
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import load_benchmark


@pytest.fixture(scope="module")
def vs_vidur():
    return load_benchmark("vs_vidur")


def rows(path: Path) -> tuple[list[str], list[list[str]]]:
    with path.open() as f:
        table = list(csv.reader(f))
    return table[0], table[1:]


def test_each_simulator_reads_the_same_requests_at_the_same_times(vs_vidur, tmp_path):
    inputs = vs_vidur.write_inputs(tmp_path, 50, ["trace", "2"])
    for rate, expected_rate in (("trace", None), ("2", 2.0)):
        head, vidur = rows(inputs[rate].vidur)
        assert head == ["arrived_at", "num_prefill_tokens", "num_decode_tokens"]
        head, release = rows(inputs[rate].release)
        assert head == ["Date", "Time", "PromptTokenCount", "CompletionTokenCount"]
        assert {r[0] for r in release} == {vs_vidur.RELEASE_DATE}  # the release keeps one date's rows
        assert [r[1:] for r in release] == vidur
        head, ours = rows(inputs[rate].servegym)
        assert head == ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
        assert [r[1:] for r in ours] == [r[1:] for r in vidur]
        stamps = np.array([np.datetime64(r[0].replace(" ", "T"), "ns") for r in ours])
        seconds = (stamps - stamps[0]) / np.timedelta64(1, "s")
        np.testing.assert_allclose(seconds, [float(r[0]) for r in vidur], rtol=0, atol=1e-9)
        tokens = np.array([[int(r[1]), int(r[2])] for r in vidur])
        assert tokens.min() >= 1 and tokens.sum(axis=1).max() <= vs_vidur.MAX_TOKENS  # clipped as Vidur clips
        if expected_rate is not None:  # 49 gaps over the span: the stretched trace's mean rate
            assert (len(vidur) - 1) / float(vidur[-1][0]) == pytest.approx(expected_rate, rel=1e-6)


def test_the_release_cache_has_the_hubs_layout_and_the_checkouts_tables(vs_vidur, tmp_path):
    source = tmp_path / "checkout"
    tables = {source / vs_vidur.VIDUR_MLP: "mlp,1\n"}
    network = source / "data/profiling/network" / vs_vidur.VIDUR_NETWORK
    tables |= {network / "all_reduce.csv": "ar,2\n", network / "send_recv.csv": "sr,3\n"}
    for path, text in tables.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    attention = tmp_path / "attention.csv"
    attention.write_text("attention,4\n")
    vs_vidur.release_cache(tmp_path / "cache", source, attention)
    expected = {"compute": ({"mlp": "mlp,1\n", "attention": "attention,4\n"},
                            {"model": vs_vidur.MODEL, "device_sku": "a100"}),
                "network": ({"all_reduce": "ar,2\n", "send_recv": "sr,3\n"}, {"sku": vs_vidur.VIDUR_NETWORK})}
    for kind, (files, config) in expected.items():
        org, name = vs_vidur.RELEASE_DATASETS[kind].split("/")
        repo = tmp_path / "cache" / "profiling_data" / kind / f"datasets--{org}--{name}"
        revision = (repo / "refs" / "main").read_text()
        snapshot = repo / "snapshots" / revision
        assert json.loads((snapshot / "config.json").read_text()) == config
        for table, text in files.items():
            assert lzma.decompress((snapshot / f"{table}.csv.xz").read_bytes()).decode() == text


def flags(command: list[str]) -> dict[str, str]:
    return {a: b for a, b in itertools.pairwise(command) if a.startswith("--") and not b.startswith("--")}


@pytest.mark.parametrize("release", [False, True])
def test_both_vidurs_simulate_the_whole_trace_with_the_same_limits(vs_vidur, release):
    p = Path("/p")
    command = vs_vidur.vidur_command("python", p / "t.csv", p / "a.csv", p / "out", p / "cache", release=release)
    f = flags(command)
    for factor in ("prefill", "decode", "time"):  # the release's defaults are 0.3 and 0.04: other work
        assert f[f"--trace_request_generator_config_{factor}_scale_factor"] == "1.0"
    assert f["--vllm_scheduler_config_batch_size_cap"] == str(vs_vidur.BATCH_CAP)
    assert f["--vllm_scheduler_config_max_tokens_in_batch"] == str(vs_vidur.TOKEN_BUDGET)
    assert f["--trace_request_generator_config_trace_file"] == "/p/t.csv"
    predictor = "--random_forrest_execution_time_predictor_config_"
    if release:
        assert f[predictor + "model_profiling_dataset"] == vs_vidur.RELEASE_DATASETS["compute"]
        assert f[predictor + "cache_dir"] == "/p/cache"
        assert f["--trace_request_generator_config_date"] == vs_vidur.RELEASE_DATE
        # the git head's prediction grid, not the release's (2M tokens a request, every 256 of KV)
        assert f[predictor + "prediction_max_tokens_per_request"] == str(vs_vidur.MAX_TOKENS)
        assert f[predictor + "kv_cache_prediction_granularity"] == "64"
    else:
        assert f[predictor + "attention_input_file"] == "/p/a.csv"
        assert f["--vllm_scheduler_config_block_size"] == str(vs_vidur.BLOCK)


def test_servegyms_side_reports_its_episode(vs_vidur, tmp_path):
    # The child process runs vLLM-style with the benchmark's limits, not the policy's own defaults (2,048 tokens),
    # prompts whole up to the budget; it counts as iterations those that processed a token (Vidur counts
    # batches), not idle advances between arrivals; a policy whose overrides change a limit is refused.
    import subprocess
    import sys

    from servegym.engine import STEP_INDEX
    from servegym.policies import make_policy
    from servegym.runner import make_env, run_episode
    from servegym.workloads import TraceWorkload

    trace = vs_vidur.write_inputs(tmp_path, 60, ["2"])["2"].servegym
    done = subprocess.run([sys.executable, str(vs_vidur.SERVEGYM_SIDE), str(trace), "vllm", vs_vidur.PROFILE, "4",
                           "96"], capture_output=True, text=True, timeout=300, check=True)
    reported = json.loads(done.stdout.strip().splitlines()[-1])
    limits = ("max_num_seqs", "max_num_batched_tokens", "prefill_chunk_tokens")
    assert [reported[name] for name in limits] == [4, 96, 96]
    policy = make_policy("vllm", max_num_batched_tokens=96, max_num_seqs=4)
    env = make_env(policy, max_episode_steps=10**8, workload=TraceWorkload(str(trace)), profile=vs_vidur.PROFILE,
                   engine={"length_mode": "unknown"})
    run_episode(env, policy, seed=0)
    log = env.unwrapped.cluster.log
    steps = log.steps()
    busy = steps[:, STEP_INDEX["num_decode_tokens"]] + steps[:, STEP_INDEX["num_prefill_tokens"]] > 0
    assert 0 < busy.sum() < len(steps)  # idle advances exist, and are not counted
    assert reported["requests"] == reported["finished"] == 60
    assert reported["iterations"] == busy.sum()
    assert reported["makespan_s"] == pytest.approx(np.nanmax(log.finish_s) - log.arrival_s.min(), rel=1e-12)
    assert reported["mean_ttft_s"] == pytest.approx(np.nanmean(log.first_token_s - log.arrival_s), rel=1e-12)
    # E2E runs from arrival (not from the first token); the KV capacity is in tokens (not blocks).
    assert reported["mean_e2e_s"] == pytest.approx(np.nanmean(log.finish_s - log.arrival_s), rel=1e-12)
    assert reported["mean_e2e_s"] > reported["mean_ttft_s"] > 0
    assert log.block_size == 16 and reported["kv_tokens"] == log.num_kv_blocks * 16 > 0
    refused = subprocess.run([sys.executable, str(vs_vidur.SERVEGYM_SIDE), str(trace), "sarathi", vs_vidur.PROFILE,
                              "4", "96"], capture_output=True, text=True, timeout=300, check=False)
    assert refused.returncode != 0 and "change the benchmark's limits" in refused.stderr


def test_every_timed_process_caches_its_bytecode_whatever_the_callers_environment(vs_vidur, monkeypatch):
    """An inherited PYTHONDONTWRITEBYTECODE would make each side recompile its own sources in every timed run: the
    sides would be timed on a condition no user has, each paying in proportion to its source, not its work."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    probe = "import os, sys; print(os.environ.get('PYTHONDONTWRITEBYTECODE'), sys.dont_write_bytecode)"
    wall, out = vs_vidur.timed([sys.executable, "-c", probe])
    assert out.split() == ["None", "False"] and wall > 0
