"""Calibration's sweep plan, repeat spread, provenance and clocks, and the calibrate/fidelity commands.

Expected values are worked out by hand in the comments; the command tests use the tiny preset and sweeps of
a few points.
"""

from __future__ import annotations

import csv
import json
from types import SimpleNamespace

import numpy as np
import pytest

from servegym.backends.calibration_fit import Sample
from servegym.backends.calibration_provenance import (
    FORWARD_ONLY,
    HOST_INCLUSIVE,
    backend_clock,
    clock_option,
    cpu_model,
    device_name,
    point_spreads,
    spread_summary,
    spread_warning,
)
from servegym.backends.calibration_sweep import SweepPlan
from servegym.cli import main
from servegym.evaluation.fidelity import FirstRequests, RealSteps, real_timing, timing_table
from tests.conftest import fixed

# ------------------------------------------------------------------------------------------- the plan


def test_the_cpu_limits_give_the_default_cpu_sweep():
    assert SweepPlan.up_to(64, 512, repeats=3, max_tokens=2048) == SweepPlan()
    # Without max_tokens the chunks stop at the context limit: 2048 / 8 = 256 and 2048 / 16 = 128 become 64, 32.
    plan = SweepPlan.up_to(64, 512)
    assert plan.chunks == (16, 32, 64, 128, 256, 512) and plan.batched == ((4, 64), (8, 64), (16, 32))


def test_the_gpu_limits_reach_batch_256_and_context_2048():
    plan = SweepPlan.up_to(256, 2048)
    assert plan.batches == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    assert plan.contexts == (32, 128, 512, 2048)
    assert plan.chunks == (16, 32, 64, 128, 256, 512, 1024, 2048)
    assert plan.chunk_starts == (0, 1024)
    # 256/16, 256/4 and 256/2 decodes, each beside a chunk of 16, 64 and 256 tokens
    assert plan.mixed == ((16, 16), (16, 64), (16, 256), (64, 16), (64, 64), (64, 256), (128, 16), (128, 64),
                          (128, 256))


def test_limits_off_the_ladder_are_swept_themselves():
    plan = SweepPlan.up_to(100, 300, repeats=1)
    assert plan.batches == (1, 2, 4, 8, 16, 32, 64, 100)
    assert plan.contexts == (32, 128, 300)
    assert plan.chunks == (16, 32, 64, 128, 256, 300)
    assert plan.chunk_starts == (0, 150)
    # Below 128 tokens the mixed steps' decode context and chunks are capped at the limit; max_batch / 16 and
    # max_batch / 4 round down to 0, so the smallest mixed batch is 1 (once).
    small = SweepPlan.up_to(6, 100)
    assert (small.batches, small.contexts, small.chunks) == ((1, 2, 4, 6), (32, 100), (16, 32, 64, 100))
    assert small.mixed == ((1, 16), (1, 64), (1, 100), (3, 16), (3, 64), (3, 100)) and small.mixed_context == 100


def test_kv_blocks_needed_by_hand():
    # Decode: 64 requests of 512 tokens + 1 generated + one per timed decode (7 batches x 3 repeats) = 534
    # tokens = 34 blocks each, 2176 in all; prefill (256 + 2048 + 1 = 2305 tokens, 145 blocks), batched
    # (16 x ceil(129 / 16) = 144) and mixed (32 x ceil(132 / 16) + ceil(257 / 16) = 305) need fewer. With equal
    # contexts (no spread):
    assert SweepPlan(context_spread=0.0).kv_blocks_needed(16) == 2176
    # Spread, 4 rows around 30 tokens hold 30, 30, 56 (30 x 1.875 = 56.25) and 4 (30 x 0.125 = 3.75), each + 1
    # generated + 2 x 2 decodes: 35, 35, 61, 9 tokens = 3 + 3 + 4 + 1 = 11 blocks (12 when all hold 30).
    assert SweepPlan(batches=(1, 4), contexts=(30,), chunks=(16,), chunk_starts=(0,), mixed=(), repeats=2,
                     batched=()).kv_blocks_needed(16) == 11
    # 4 requests of 30 tokens + 1 + 2 x 2 decodes = 35 tokens = 3 blocks each.
    small = SweepPlan(batches=(1, 4), contexts=(30,), chunks=(16,), chunk_starts=(0,), mixed=(), repeats=2,
                      batched=(), context_spread=0.0)
    assert small.kv_blocks_needed(16) == 12
    # 28 + 1 + 4 = 33 tokens: still 3 blocks each (without the generated token, 32 would be 2).
    assert SweepPlan(batches=(1, 4), contexts=(28,), chunks=(16,), chunk_starts=(0,), mixed=(),
                     repeats=2, batched=(), context_spread=0.0).kv_blocks_needed(16) == 12
    # Batched prefills: 8 prompts of 256 tokens + 1 = 17 blocks each, 136; 16 of 128 + 1: 9 each, 144.
    assert SweepPlan(batches=(1,), contexts=(30,), chunks=(16,), chunk_starts=(0,), mixed=(), repeats=1,
                     batched=((8, 256), (16, 128))).kv_blocks_needed(16) == 144


def test_a_sweep_that_overflows_the_cache_is_refused_before_it_starts():
    SweepPlan().check_fits(2164, 16)
    with pytest.raises(ValueError, match=r"needs 2164 KV blocks of 16 tokens .* cache has 2163"):
        SweepPlan().check_fits(2163, 16)


def test_decode_rows_spread_around_the_point_context_by_hand():
    from servegym.backends.calibration_sweep import row_contexts

    # Pairs 128 x (1 +- a): a = 0, 0.875, 0.4375 (56), 0.65625 (84); each even prefix and the first row mean 128.
    rows = row_contexts(128, 8, 0.875)
    assert rows.tolist() == [128, 128, 240, 16, 184, 72, 212, 44]
    assert [rows[:n].mean() for n in (1, 2, 4, 6, 8)] == [128.0] * 5
    assert row_contexts(128, 3, 0.875).tolist() == [128, 128, 240]  # an odd count keeps its last pair's first
    assert row_contexts(128, 5, 0.0).tolist() == [128] * 5
    assert row_contexts(4, 4, 0.875).tolist() == [4, 4, 8, 1]  # 4 x 0.125 = 0.5 rounds to 0: at least 1 token
    with pytest.raises(ValueError, match="context_spread"):
        SweepPlan(context_spread=1.0)


def test_the_decode_sweep_prefills_spread_rows_and_records_their_context():
    from servegym.backends.calibration_sweep import Sweeper

    steps = []
    fake = SimpleNamespace(execute=lambda batch: steps.append(batch) or 0.01, release=lambda ids: None)
    plan = SweepPlan(batches=(1, 3), contexts=(30,), chunks=(16,), chunk_starts=(0,), mixed=(), repeats=1,
                     batched=())
    samples = Sweeper(fake).decode(plan)
    # One untimed prefill of the 3 rows, each its own length (the prompt is what it prefills), then the two decodes.
    prefill = steps[0]
    assert prefill.prefill_len.tolist() == [30, 30, 56] and prefill.prefill_target.tolist() == [30, 30, 56]
    assert prefill.prefill_start.tolist() == [0, 0, 0]
    assert [s.decode_ids.tolist() for s in steps[1:]] == [[0], [0, 1, 2]]
    # Each row reads its context and the token it feeds: 31; 31 + 31 + 57 = 119 (an odd batch does not mean 30).
    assert [(s.decode, s.context) for s in samples] == [(1, 31.0), (3, 119.0)]


def test_the_mixed_sweep_prefills_long_spread_rows_in_steps_and_records_their_context():
    from servegym.backends.calibration_sweep import Sweeper

    steps = []
    fake = SimpleNamespace(execute=lambda batch: steps.append(batch) or 0.01, release=lambda ids: None)
    plan = SweepPlan(batches=(1,), contexts=(16,), chunks=(16,), chunk_starts=(0,), mixed=((3, 64),),
                     mixed_context=600, repeats=1, batched=())
    samples = Sweeper(fake).mixed(plan)
    # Rows around 600 hold 600, 600 and 1125 tokens: 512 each in the first untimed step, then 88, 88 and 512 from
    # 512, then the last row's 101 from 1024 alone (the others are done); then the timed step.
    assert [s.prefill_ids.tolist() for s in steps[:3]] == [[0, 1, 2], [0, 1, 2], [2]]
    assert [s.prefill_len.tolist() for s in steps[:3]] == [[512, 512, 512], [88, 88, 512], [101]]
    assert [s.prefill_start.tolist() for s in steps[:3]] == [[0, 0, 0], [512, 512, 512], [1024]]
    assert steps[2].prefill_target.tolist() == [1125]
    assert steps[3].decode_ids.tolist() == [0, 1, 2] and steps[3].prefill_len.tolist() == [64]
    # 601 + 601 + 1126 = 2328 KV tokens read (3 x 601 = 1803 if the rows all held 600).
    assert [(s.decode, s.context, s.chunk) for s in samples] == [(3, 2328.0, 64)]


@pytest.mark.slow
def test_the_kv_estimate_is_exactly_what_the_decode_sweep_holds():
    pytest.importorskip("transformers")
    from servegym.backends.base import StepBatch
    from servegym.backends.calibration_sweep import Sweeper
    from servegym.backends.torch_backend import TorchBackend

    plan = SweepPlan(batches=(1, 4), contexts=(30,), chunks=(16,), chunk_starts=(0,), mixed=(), repeats=2,
                      batched=())
    backend = TorchBackend("tiny-llama", device="cpu", num_kv_blocks=plan.kv_blocks_needed(16))
    assert len(Sweeper(backend).decode(plan)) == 4  # 11 blocks suffice: 2 batch sizes x 2 repeats timed
    backend.reset(np.random.default_rng(0))
    empty, other = np.zeros(0, dtype=np.int64), np.array([10_000])
    backend.execute(StepBatch(empty, empty, other, np.array([0]), np.array([1]), np.array([1])))  # takes 1 block
    with pytest.raises(RuntimeError, match="full"):  # 10 do not: the decodes need all 11
        Sweeper(backend).decode(plan)


def test_scatter_leaves_the_free_blocks_shuffled():
    # 10 one-token requests, at most 4 a step (4 + 3 + 3 rows), released in a seeded random order.
    from servegym.backends.calibration_sweep import Sweeper

    steps, released = [], []
    fake = SimpleNamespace(execute=lambda batch: steps.append(batch.prefill_ids.tolist()) or 0.0,
                           release=lambda ids: released.extend(ids.tolist()))
    Sweeper(fake).scatter(10, np.random.default_rng(0), rows=4)
    assert steps == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert sorted(released) == list(range(10)) and released != list(range(10))
    assert released == np.random.default_rng(0).permutation(10).tolist()


def test_the_largest_step_by_hand():
    # Untimed prefills of equal contexts: 16 of the 64 requests x 512 tokens = 8192, more than any timed step.
    assert SweepPlan(context_spread=0.0).max_step_tokens() == 8192
    # Spread around 600 tokens, 4 rows hold 600, 600, 1125 and 75; a step prefills at most 512 of each: 1611.
    assert SweepPlan(batches=(1, 4), contexts=(600,), chunks=(16,), chunk_starts=(0,), mixed=(),
                     batched=()).max_step_tokens() == 512 + 512 + 512 + 75
    # 4 requests around 30 tokens (30, 30, 56, 4) = 120, more than the 64-token warm-up and the 16-token chunk.
    assert SweepPlan(batches=(1, 4), contexts=(30,), chunks=(16,), chunk_starts=(0,), mixed=(),
                     batched=()).max_step_tokens() == 120
    # A batch of 16 prompts of 200 tokens is the largest step: 3200 > 4 x 30 and the chunk.
    assert SweepPlan(batches=(1, 4), contexts=(30,), chunks=(16,), chunk_starts=(0,), mixed=(),
                     batched=((16, 200),)).max_step_tokens() == 3200


@pytest.mark.parametrize("bad", [{"batches": ()}, {"contexts": (0,)}, {"repeats": 0}, {"chunk_starts": (-1,)},
                                 {"mixed": ((0, 16),)}, {"batched": ((4, 0),)}])
def test_a_bad_plan_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="SweepPlan"):
        SweepPlan(**bad)


# ------------------------------------------------------------------------------------------- spread


def _repeats(sample: Sample, times: list[float]) -> list[Sample]:
    return [Sample(sample.decode, sample.context, sample.chunk, sample.chunk_start, t) for t in times]


def test_spread_is_max_minus_min_over_the_median_and_warns_on_the_noisy_points():
    samples = {"decode": _repeats(Sample(1, 33.0, 0, 0, 0), [1.0, 1.1, 1.2])  # (1.2-1.0)/1.1 = 18.2%
               + _repeats(Sample(4, 132.0, 0, 0, 0), [1.0, 2.0, 3.0]),  # (3-1)/2 = 100%
               "prefill": _repeats(Sample(0, 0.0, 64, 256, 0), [1.0, 1.25, 1.25])}  # 0.25/1.25 = 20% exactly
    points = {p.label: p for p in point_spreads(samples)}
    assert set(points) == {"decode B=1 context=32", "decode B=4 context=32", "prefill chunk=64 start=256"}
    assert points["decode B=1 context=32"].relative_spread == pytest.approx(0.2 / 1.1)
    assert points["decode B=4 context=32"].median_s == 2.0
    assert points["decode B=4 context=32"].relative_spread == pytest.approx(1.0)
    assert points["prefill chunk=64 start=256"].relative_spread == 0.2  # binary fractions: no rounding below 20%
    # The median of 18.2%, 20% and 100% is 20%: not above the 20% threshold, so no warning ...
    assert spread_warning(list(points.values())) is None
    # ... but with a 15% threshold it warns, naming the two points above 15%, noisiest first.
    text = spread_warning(list(points.values()), threshold=0.15)
    assert "median point's (max - min) / median is 20%" in text and "--threads 1" in text
    assert text.index("decode B=4 context=32 100%") < text.index("prefill chunk=64 start=256 20%")
    summary = spread_summary(list(points.values()))
    assert summary["median"] == pytest.approx(0.2) and summary["max"] == pytest.approx(1.0)
    assert summary["above_threshold"] == {"decode B=4 context=32": 1.0}  # the point at exactly 20% is not above


def test_a_single_repeat_has_no_spread_and_no_warning():
    points = point_spreads({"decode": [Sample(1, 33.0, 0, 0, 0.01)]})
    assert points[0].relative_spread is None
    assert spread_warning(points) is None
    assert spread_summary(points)["measure"].startswith("not measured")


# ------------------------------------------------------------------------------------------- provenance


def test_cpu_model_comes_from_cpuinfo_with_a_fallback(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Example CPU @ 2.00GHz\n")
    assert cpu_model(info) == "Example CPU @ 2.00GHz"
    info.write_text("processor\t: 0\n")  # no model name (e.g. some ARM kernels)
    assert cpu_model(info) and cpu_model(info) != "Example CPU @ 2.00GHz"
    assert cpu_model(tmp_path / "missing") == cpu_model(info)


def test_a_cuda_device_is_named_by_its_own_index(monkeypatch):
    torch = pytest.importorskip("torch")
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: asked.append(device) or "Fake GPU")
    assert device_name(torch.device("cuda:1")) == "Fake GPU"
    assert asked == [torch.device("cuda:1")] and asked[0].index == 1


def test_the_clock_a_backend_reports():
    assert backend_clock(SimpleNamespace(count_host_time=True)) == HOST_INCLUSIVE
    assert backend_clock(SimpleNamespace(count_host_time=False)) == FORWARD_ONLY


def test_choosing_a_clock():
    assert clock_option(None) == {}  # the backend's default
    assert clock_option(HOST_INCLUSIVE) == {"count_host_time": True}
    assert clock_option(FORWARD_ONLY) == {"count_host_time": False}
    with pytest.raises(ValueError, match="clock must be one of"):
        clock_option("wall")


# ------------------------------------------------------------------------------------------- fidelity


def test_fidelity_reports_both_clocks_and_marks_the_engines():
    # Forward 10, 20, 30, 40 ms plus 1 ms of host work each: means 25 and 26 ms; P99 by linear interpolation
    # 10 + 0.99 x 3 x 10 = 39.7 ms forward-only, 40.7 ms host-inclusive.
    fake = RealSteps(True, [0.010, 0.020, 0.030, 0.040], [0.001] * 4)
    timing = real_timing(fake, (), profile_clock=FORWARD_ONLY)
    forward, host = timing.clocks
    assert (forward.clock, host.clock, timing.clock) == (FORWARD_ONLY, HOST_INCLUSIVE, HOST_INCLUSIVE)
    assert (forward.mean_ms, forward.p50_ms, forward.p99_ms) == pytest.approx((25.0, 25.0, 39.7))
    assert (host.mean_ms, host.p50_ms, host.p99_ms) == pytest.approx((26.0, 26.0, 40.7))
    assert timing.forward_ms_mean == pytest.approx(25.0) and timing.overhead_ms_mean == pytest.approx(1.0)
    table = timing_table({"fcfs": timing})
    assert "| fcfs | host-inclusive (engine clock) | 4 | 26.00 | 26.00 | 40.70 |" in table
    assert "| fcfs | forward-only | 4 | 25.00 | 25.00 | 39.70 |" in table
    assert "MISMATCH" in timing.describe()  # fitted forward-only, run host-inclusive
    forward_only = real_timing(RealSteps(False, fake.forward_s, fake.overhead_s), (), FORWARD_ONLY)
    assert forward_only.clock == FORWARD_ONLY and "MISMATCH" not in forward_only.describe()


def test_first_requests_keeps_the_head_of_each_episode():
    workload = fixed([0.0, 0.1, 0.2, 0.3, 0.4], [10, 20, 30, 40, 50], [1, 2, 3, 4, 5])
    spec = FirstRequests(workload, 3).sample(np.random.default_rng(0))
    assert spec.arrival_s.tolist() == [0.0, 0.1, 0.2] and spec.num_prompt_tokens.tolist() == [10, 20, 30]


# ------------------------------------------------------------------------------------------- the commands


@pytest.fixture
def no_model_build(monkeypatch):
    """Fail the test if the command gets as far as building a model."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from servegym.backends import torch_backend

    def refuse(*args, **kwargs):
        raise AssertionError("the model was built before the arguments were checked")

    monkeypatch.setattr(torch_backend, "TorchBackend", refuse)


@pytest.mark.parametrize(("flags", "message"), [
    (["--max-context", "8"], "--max-context 8 is shorter than one KV block (--block-size 16)"),
    (["--kv-blocks", "100"], "the sweep needs 2164 KV blocks"),
    (["--device", "tpu"], "--device must be cpu, cuda or cuda:N"),
    (["--backend", "torch", "--plot", "/proc/no/plot.png"], "not writable"),
])
def test_calibrate_checks_its_arguments_before_building_the_model(no_model_build, tmp_path, capsys, flags, message):
    assert main(["calibrate", "--device", "cpu", "--out", str(tmp_path / "p.json"), *flags]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--threads", "0"], ["--max-batch", "0"], ["--repeats", "0"],
                                   ["--max-context", "x"]])
def test_calibrate_refuses_non_positive_counts(tmp_path, capsys, flags):
    with pytest.raises(SystemExit) as stop:
        main(["calibrate", "--out", str(tmp_path / "p.json"), *flags])
    assert stop.value.code == 2
    assert flags[0] in capsys.readouterr().err


def test_cuda_without_cuda_is_a_clear_error(no_model_build, tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["calibrate", "--device", "cuda", "--out", str(tmp_path / "p.json")]) == 2
    assert "torch sees no CUDA device" in capsys.readouterr().err


@pytest.mark.slow
def test_calibrate_then_fidelity_on_the_tiny_model(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path / "tiny.json"
    assert main(["calibrate", "--model", "tiny-llama", "--device", "cpu", "--threads", "1", "--max-batch", "2",
                 "--max-context", "16", "--max-tokens", "16", "--repeats", "2", "--kv-blocks", "64", "--out",
                 str(out), "--quiet"]) == 0
    prov = json.loads(out.read_text())["provenance"]
    assert (prov["device"], prov["dtype"], prov["threads"]) == ("cpu", "float32", 1)
    assert prov["hardware"].startswith("CPU: ") and prov["hardware"].endswith(", 1 thread")
    assert prov["clock"] == HOST_INCLUSIVE and HOST_INCLUSIVE in prov["method"]  # the backend's default
    assert {"python", "torch", "transformers"} <= set(prov["versions"])
    assert set(prov["load"]) == {"loadavg_before", "loadavg_after", "sweep_wall_s", "process_cpu_s", "cpu_per_wall"}
    # up_to(2, 16, 2, 16): decode B=1, 2 at context 16; prefill chunk 16 at starts 0 and 8; batched prefills of
    # 4 and 8 prompts of 2 tokens and 16 of 1; mixed (1 decode, chunk 16): 8 points of 2 repeats each. The
    # batched 16 x 1 holds the most: 16 one-block requests.
    assert prov["sweep"] == {"max_batch": 2, "max_context": 16, "max_tokens": 16, "repeats": 2,
                             "context_spread": 0.875, "kv_blocks_needed": 16}
    assert prov["spread"]["points"] == 8
    with out.with_suffix(".samples.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 16 and {r["group"] for r in rows} == {"decode", "prefill", "batched", "mixed"}
    assert out.with_suffix(".png").is_file()
    capsys.readouterr()

    assert main(["fidelity", "--profile", str(out), "--model", "tiny-llama", "--device", "cpu", "--speed-only"]) == 0
    *lines, advice = capsys.readouterr().out.splitlines()[-4:]
    head = (f"machine speed against {out} (the speed probe's medians of measured / profile, decode-only/with prefill, "
            "3 times): ")
    assert lines[0].startswith(head)
    probes = [tuple(float(v) for v in x.split("/")) for x in lines[0][len(head):].split(", ")]
    assert len(probes) == 3 and all(min(p) > 0 and len(p) == 2 for p in probes)
    for line, kind, index in zip(lines[1:], ("decode-only steps", "steps with prefill"), (0, 1), strict=True):
        median = sorted(p[index] for p in probes)[1]
        # the printed probes are rounded to 3 places, so the percentage is checked to a tenth of a point
        assert line.startswith(f"  {kind} run ") and line.endswith(f" {'slower' if median > 1 else 'faster'} than "
                                                                   "when the profile was fitted")
        assert float(line.split(" run ")[1].split("%")[0]) == pytest.approx(100 * abs(median - 1), abs=0.11)
    assert advice.startswith("within 5% of the profile's speed") or "beyond 5%: recalibrate" in advice
    assert main(["fidelity", "--profile", str(out), "--model", "tiny-llama", "--device", "cpu", "--policy", "fcfs",
                 "--max-requests", "3", "--out", str(tmp_path / "fid")]) == 0
    assert "(cpu, 1 thread)" in capsys.readouterr().out  # the profile's threads, not torch's default
    report = (tmp_path / "fid" / "fidelity.md").read_text()
    assert "first 3 requests" in report
    assert f"| fcfs | {HOST_INCLUSIVE} (engine clock) |" in report
    assert f"| fcfs | {FORWARD_ONLY} |" in report and "MISMATCH" not in report
    # The speed probe ran before each of the 6 real episodes (3 seeds, 2 repeats) and the model ran at that speed.
    speeds = report.split("## Machine speed")[1].split("## Ranking")[0]
    probes = [line for line in speeds.splitlines() if line.startswith("| fcfs |")]
    assert len(probes) == 1 and len(probes[0].split("|")) == 2 + 1 + 6
    assert all(float(v) > 0 for x in probes[0].split("|")[2:-1] for v in x.split("/"))
    assert "x on steps with prefill before the real episodes (speed probe), and at that speed the model" in report
    with (tmp_path / "fid" / "fidelity.csv").open() as handle:
        itl = next(r for r in csv.DictReader(handle) if r["metric"] == "itl_mean")
    # The model's second run is at the probes' speed, not a copy of the first (no probe reads exactly 1).
    assert float(itl["calibrated_at_speed"]) != float(itl["calibrated"]) > 0
