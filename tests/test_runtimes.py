"""Serving runtimes (issue 28): each runtime's terms by hand, eager's TP8-vs-TP4 behaviour, the fit reproduced
from its references, the stated CPU tail, runtime names in files and on the command line."""

from __future__ import annotations

import csv
import json
import warnings

import gymnasium as gym
import numpy as np
import pytest

import servegym  # noqa: F401  (registers the envs)
from servegym.backends import ProfileError, TokenLatencyModel, load_profile
from servegym.backends.build import TABLES, build_profile
from servegym.backends.runtime_fit import (
    REFERENCES,
    Cell,
    compare,
    coverage,
    fit_cuda_graphs,
    fit_eager,
    prefill_iterations_s,
)
from servegym.backends.runtimes import RUNTIMES
from servegym.cli import main

CPU_COLUMNS = ("schedule_median", "sampler_e2e_median", "prepare_inputs_e2e_median", "process_model_outputs_median")


def table_cpu_ms(model: str, tp: int, batch: int) -> tuple[float, float]:
    """(host columns summed, Ray time) of Vidur's A100 CPU table at one batch, read by hand (median of rows)."""
    with (TABLES / "cpu_overheads" / "a100" / "cpu_overheads.csv").open() as handle:
        rows = [r for r in csv.DictReader(handle) if r["model_name"] == model
                and int(r["tensor_parallel_degree"]) == tp and int(r["batch_size"]) == batch]
    host = float(np.median([sum(float(r[c]) for c in CPU_COLUMNS) for r in rows]))
    ray = float(np.median([float(r["ray_comm_time_mean"]) for r in rows]))
    return host, ray


def tiny(**overrides) -> TokenLatencyModel:
    fields = dict(cpu_rows=(1.0, 9.0), cpu_s=(0.001, 0.003), linear_tokens=(1.0, 100.0), linear_s=(0.010, 0.020),
                  allreduce_s=(0.0, 0.0), kv_bytes_per_token=1000.0, decode_bandwidth_bytes_s=1e9,
                  attention_flops_per_pair=100.0, prefill_flops_s=1e12, lm_head_bytes=2e6,
                  lm_head_flops_per_row=4e9, memory_bandwidth_bytes_s=1e9, peak_flops_s=1e12)
    return TokenLatencyModel(**{**fields, **overrides})


def test_the_launch_floor_holds_back_the_gpu_terms_only_when_they_are_shorter():
    # One decode at context 0: cpu 1 ms; GPU = linear 10 ms + LM head max(2 ms, 4 ms) = 14 ms.
    assert tiny().decode_s(1) == pytest.approx(0.015)
    floored = tiny(launch_floor_s=0.020)  # 20 ms of launches: the iteration waits 6 ms for them
    terms = floored.terms(1, 1, 0.0, 0.0, 1)
    assert terms["launch"] == pytest.approx(0.006) and floored.decode_s(1) == pytest.approx(0.021)
    assert sum(terms.values()) == pytest.approx(floored.decode_s(1), rel=1e-12)
    # A floor below the GPU terms changes nothing (the cpu term is not hidden by it).
    assert tiny(launch_floor_s=0.013).decode_s(1) == pytest.approx(0.015)


def test_past_the_last_cpu_knot_the_stated_slope_continues_not_the_last_segment():
    # Knots (1, 1 ms), (9, 3 ms): last segment 0.25 ms/row. A stated tail of 0.1 ms/row: 19 rows -> 3 + 1 = 4 ms.
    assert tiny().terms(19, 19, 0, 0, 0)["cpu"] == pytest.approx(0.003 + 10 * 0.00025)
    assert tiny(cpu_tail_s_per_row=1e-4).terms(19, 19, 0, 0, 0)["cpu"] == pytest.approx(0.004)
    assert tiny(cpu_tail_s_per_row=1e-4).terms(5, 5, 0, 0, 0)["cpu"] == pytest.approx(0.002)  # knots unchanged


def test_shipped_cpu_tail_is_the_least_squares_slope_of_the_measured_batches():
    lat = load_profile("a100-llama3-8b").latency
    slope = np.polyfit(lat.cpu_rows, lat.cpu_s, 1)[0]
    assert lat.cpu_tail_s_per_row == pytest.approx(slope, rel=1e-9)
    # Batch 256 costs 128 more rows at that slope, not the noisy last segment's.
    assert lat.terms(256, 256, 0, 0, 0)["cpu"] == pytest.approx(lat.cpu_s[-1] + 128 * slope)


def test_eager_terms_by_hand_for_llama2_70b_tp8_on_an_a100_at_batch_1():
    rt = RUNTIMES["eager"]
    lat = build_profile("a100", "llama2-70b", 8, runtime="eager").latency
    # No Llama-2-70B TP8 rows in the A100 table: the TP4 rows are borrowed; below batch 8 the batch-8 host time
    # holds, the Ray time is measured per row, and one request adds host_s_per_row once.
    host, ray = table_cpu_ms("meta-llama/Llama-2-70b-hf", 4, 8)
    r = rt.host_s_per_row["a100"].value
    terms = lat.terms(1, 1, 512.0, 0.0, 1)
    assert terms["cpu"] == pytest.approx((host + ray) / 1e3 + r, rel=1e-9)
    # NCCL all-reduce from the table (no custom one in eager), linear scaled by the fitted factor.
    neutral = build_profile("a100", "llama2-70b", 8, runtime="cuda-graphs").latency
    assert terms["linear"] == pytest.approx(rt.linear_scale["a100"].value * neutral.terms(1, 1, 0, 0, 1)["linear"])
    # The launch floor is 80 layers x the per-layer launch; the iteration is cpu + that floor.
    floor = 80 * rt.launch_s_per_layer["a100"].value
    assert lat.launch_floor_s == pytest.approx(floor)
    assert lat.decode_s(1, 512) == pytest.approx(terms["cpu"] + floor, rel=1e-12)


def test_cuda_graphs_terms_by_hand_for_llama2_70b_tp4_on_an_a100_at_batch_1():
    rt = RUNTIMES["cuda-graphs"]
    lat = build_profile("a100", "llama2-70b", 4, runtime="cuda-graphs").latency
    host, _ = table_cpu_ms("meta-llama/Llama-2-70b-hf", 4, 8)
    terms = lat.terms(1, 1, 512.0, 0.0, 1)
    # Host: the table's columns (no Ray), the shared-memory dispatch and one request's metadata.
    assert terms["cpu"] == pytest.approx(host / 1e3 + rt.tp_dispatch_s.value + rt.tp_dispatch_s_per_row.value,
                                         rel=1e-9)
    # One token: 8,192 fp16 values = 16,384 bytes per all-reduce, two per layer over 80 layers, custom kernel.
    ar = rt.custom_allreduce
    assert terms["allreduce"] == pytest.approx(160 * (ar.latency_s.value + 16384 / ar.bus_bandwidth_bytes_s.value))
    assert lat.launch_floor_s == 0.0 and terms["launch"] == 0.0
    # Decode attention: 512 tokens x K+V bytes per token per GPU (80 x 8 x 128 x 2 x 2 / 4) over 0.7 x 2,039 GB/s.
    assert terms["decode_attention"] == pytest.approx(512 * 81920 / (0.7 * 2.039e12))


@pytest.mark.parametrize("gpu, eager_ratio", [("a100", 0.99), ("h100", 0.85)])
def test_eager_decode_at_tp8_is_no_faster_than_at_tp4_while_graphs_scale(gpu, eager_ratio):
    def b1(tp, runtime):
        return load_profile(f"{gpu}-llama2-70b-tp{tp}@{runtime}").latency.decode_s(1, 512)

    # Host-bound: the launch floor does not shrink with TP. On the A100 it binds at both TPs (measured 45.0 and
    # 44.9 ms); on the H100 TP4's GPU terms exceed it, and TP4 is predicted 11% over its measured 29.7 ms.
    assert b1(8, "eager") >= eager_ratio * b1(4, "eager")
    assert b1(8, "cuda-graphs") < 0.75 * b1(4, "cuda-graphs")  # the GPU work halves when nothing hides it


def test_the_registry_holds_what_the_fit_gives():
    for gpu in ("a100", "h100"):
        fitted = fit_eager(gpu)
        rt = RUNTIMES["eager"]
        for key in ("launch_s_per_layer", "host_s_per_row", "linear_scale", "prefill_flops_efficiency"):
            assert getattr(rt, key)[gpu].value == pytest.approx(fitted[key], rel=2e-3), (gpu, key)
            assert getattr(rt, key)[gpu].kind == "fit"
    assert RUNTIMES["cuda-graphs"].tp_dispatch_s_per_row.value == pytest.approx(fit_cuda_graphs(), rel=2e-3)


KNOWN_MISSES = {("h100-llama2-70b-tp8", "prefill 8192"): (-0.25, -0.20),
                ("a100-llama2-70b-tp4", "request b=64 2048/2048"): (-0.25, -0.15),
                ("a100-llama2-70b-tp4", "decode b=64 c=65"): (0.20, 0.35),
                ("a100-llama2-70b-tp4", "decode b=64 c=1152"): (0.15, 0.25)}
"""Documented in docs/PROFILES.md: Splitwise's stack scaled long prompts worse from TP4 to TP8 than any
TP-independent efficiency can say; TensorRT-LLM v0.5's decode at 2-4k contexts cost more than attention at 70%
of the bandwidth says; LMDeploy's C++ TurboMind spends less host time per request at batch 64 than vLLM's Python
loop, which the cuda-graphs runtime's per-request dispatch is fitted to."""


def test_every_reference_is_predicted_within_its_stated_tolerance():
    # Fitted points and held-out checks within 15%; the known misses inside their stated bands, so that a change
    # that moves them (either way) is seen. Splitwise's batched prompts (16 x 512 tokens) cost 1.3-1.4x a lone
    # 512-token prompt each in that stack, which no runtime number reproduces: the model is 17-60% low there.
    for ref, predicted in compare():
        error = predicted / ref.measured_s - 1
        if ref.label == "prefill 512 x16":
            assert -0.65 <= error <= -0.15, (ref.profile, error)
            continue
        low, high = KNOWN_MISSES.get((ref.profile, ref.label), (-0.15, 0.15))
        assert low <= error <= high, (ref.profile, ref.runtime, ref.label, error)
    assert {r.runtime for r in REFERENCES} == set(RUNTIMES)


def test_a_cell_is_in_range_within_the_tolerance_of_its_measurements():
    # Measured 100 and 200 ms: in range from 85 ms to 230 ms (15% past each end), whatever shape each was at.
    cell = Cell("p", "eager", "decode b=1", (0.1, 0.2), (0.0851, 0.2299))
    assert cell.verdict == "in range"
    assert Cell("p", "eager", "decode b=1", (0.1, 0.2), (0.15, 0.2301)).verdict == "outside"
    assert Cell("p", "eager", "decode b=1", (0.1, 0.2), (0.0849,)).verdict == "outside"
    assert Cell("p", "eager", "prefill 8192", (), ()).verdict == "no measurement"


def test_issue_28s_shapes_are_in_range_where_measured_but_one_documented_miss():
    cells = {(c.profile, c.runtime, c.shape): c for c in coverage()}
    assert len(cells) == 4 * 2 * 4
    outside = [key for key, c in cells.items() if c.verdict == "outside"]
    assert outside == [("h100-llama2-70b-tp8", "eager", "prefill 8192")]
    assert all(c.verdict == "in range" for (_, runtime, _), c in cells.items() if runtime == "eager"
               and c.verdict != "outside")
    assert cells[("a100-llama2-70b-tp4", "cuda-graphs", "decode b=1")].measured_s == (1 / 38.01, 0.029, 0.031)
    missing = sorted(key for key, c in cells.items() if c.verdict == "no measurement")
    assert len(missing) == 9 and all(runtime == "cuda-graphs" for _, runtime, _ in missing)
    assert cells[("h100-llama2-70b-tp4", "cuda-graphs", "decode b=1")].measured_s == (0.017021,)


def test_predict_prices_a_batch_of_prompts_in_the_runtimes_iterations(capsys):
    # eager's budget is 4,096 tokens: 64 prompts of 512 tokens run as 8 iterations of 8 prompts.
    lat = load_profile("a100-llama2-70b-tp4@eager").latency
    assert prefill_iterations_s(lat, 512, 64, 4096) == pytest.approx(8 * lat.prefill_s(512, 8))
    assert prefill_iterations_s(lat, 512, 10, 4096) == pytest.approx(lat.prefill_s(512, 8) + lat.prefill_s(512, 2))
    assert prefill_iterations_s(lat, 8192, 2, 4096) == pytest.approx(2 * lat.prefill_s(8192, 1))  # one at least
    # 600-token prompts: 6 whole prompts fit in 4,096 tokens (3,600), not 7; 13 run as 6 + 6 + 1.
    assert prefill_iterations_s(lat, 600, 13, 4096) == pytest.approx(2 * lat.prefill_s(600, 6) + lat.prefill_s(600, 1))
    assert main(["profile", "predict", "a100-llama2-70b-tp4", "--runtime", "eager", "--prefill", "512", "--batch",
                 "64"]) == 0
    out = capsys.readouterr()
    assert float(out.out) == pytest.approx(8e3 * lat.prefill_s(512, 8), rel=1e-4)
    assert "a100-llama2-70b-tp4, runtime eager" in out.err


def test_profiles_name_their_runtime_and_old_files_load_as_eager(tmp_path):
    shipped = load_profile("h100-llama2-70b-tp4")
    assert shipped.runtime == "cuda-graphs" and json.loads(
        (TABLES.parent / "profiles" / "h100-llama2-70b-tp4.json").read_text())["runtime"] == "cuda-graphs"
    data = shipped.to_json()
    del data["runtime"], data["latency"]["launch_floor_s"], data["latency"]["cpu_tail_s_per_row"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    assert load_profile(str(old)).runtime == "eager"  # schema 2 before runtimes: Vidur's (eager) tables
    data["runtime"] = "tensorrt"
    old.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="runtime 'tensorrt' unknown"):
        load_profile(str(old))
    assert load_profile("paper-v100-llama3.2-3b").runtime is None
    with pytest.raises(ProfileError, match="not built from tables"):
        load_profile("paper-v100-llama3.2-3b@eager")
    with pytest.raises(ProfileError, match="runtime 'graphs' unknown"):
        load_profile("a100-llama3-8b@graphs")


def test_a_runtime_variant_is_the_build_for_that_runtime():
    variant = load_profile("h100-llama2-70b-tp4@eager")
    assert variant.runtime == "eager"
    assert variant.to_json()["latency"] == build_profile("h100", "llama2-70b", 4, runtime="eager").to_json()["latency"]
    assert load_profile("h100-llama2-70b-tp4@cuda-graphs") == load_profile("h100-llama2-70b-tp4")


def test_profile_runtimes_show_and_check_print_sources(capsys):
    assert main(["profile", "runtimes"]) == 0
    out = capsys.readouterr().out
    assert "cuda-graphs (default of the shipped profiles)" in out and "eager:" in out and "Splitwise" in out
    assert main(["profile", "show", "a100-llama2-70b-tp8", "--runtime", "eager"]) == 0
    out = capsys.readouterr().out
    assert "runtime: eager" in out and "launch_s_per_layer = 0.0004506 (fit" in out
    assert main(["profile", "check"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| `")]
    assert len(rows) == len(REFERENCES) + 4 * 2 * 4  # then every TP profile x runtime x shape


def test_an_env_whose_engine_can_leave_the_measured_range_says_so():
    with pytest.warns(RuntimeWarning, match=r"measured up to 128 rows per iteration; the engine's max_num_seqs = 256"):
        gym.make("servegym/Serving-v2", workload="burst", profile="a100-llama3-8b",
                 engine={"max_num_seqs": 256, "max_num_batched_tokens": 4096}).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the defaults stay inside the tables: no warning
        gym.make("servegym/Serving-v2", workload="burst", profile="a100-llama3-8b").close()
