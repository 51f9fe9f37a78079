"""Profiles know their limits: values outside physical ranges are refused when a profile loads (or a latency model
is built), and ``servegym profile predict`` warns when a shape exceeds the KV capacity or the measured range."""

from __future__ import annotations

import json
import re

import pytest

from servegym.backends import CalibratedBackend, LatencyModel, ProfileError, load_profile, shipped_profiles
from servegym.backends.profile_limits import (
    BANDWIDTH_BYTES_S,
    FLOPS_S,
    MAX_COLD_START_S,
    MAX_KV_TOKENS,
    MAX_NOISE_CV,
    MAX_TERM_S,
)
from servegym.backends.token_model import TokenLatencyModel
from servegym.cli import main

SCHEMA_1 = "paper-v100-llama3.2-3b"
SCHEMA_2 = "a100-llama3-8b"


def write(tmp_path, name: str, mutate) -> str:
    data = load_profile(name).to_json()
    mutate(data)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    return str(path)


def refused(tmp_path, name: str, mutate, match: str) -> None:
    path = write(tmp_path, name, mutate)
    with pytest.raises(ProfileError, match=match) as err:
        load_profile(path)
    assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)


def loads(tmp_path, name: str, mutate) -> None:
    load_profile(write(tmp_path, name, mutate))


def lat(**changes):
    return lambda d: d["latency"].update(changes)


@pytest.mark.parametrize("name", shipped_profiles())
def test_every_shipped_profile_is_within_the_limits(name):
    load_profile(name)


# ------------------------------------------------------------------------------------ seconds per unit of work
@pytest.mark.parametrize(("key", "unit"), [("l_min_s", "iteration"), ("alpha_s", "decoding request beyond B0"),
                                           ("prefill_s_per_token", "prompt token"),
                                           ("prefill_s_per_token_context", "query-key pair"),
                                           ("decode_s_per_context_token", "KV token read")])
def test_schema_1_terms_over_the_limit_are_refused_at_the_limit_accepted(tmp_path, key, unit):
    # Rule: no term charges more than MAX_TERM_S for one unit; exactly MAX_TERM_S is allowed.
    refused(tmp_path, SCHEMA_1, lat(**{key: 1e300}), rf"latency\.{key} gives 1e\+300 s per {unit}, over the 60 s")
    refused(tmp_path, SCHEMA_1, lat(**{key: MAX_TERM_S * (1 + 1e-12)}), rf"latency\.{key}")
    loads(tmp_path, SCHEMA_1, lat(**{key: MAX_TERM_S}))
    fields = dict(l_min_s=0.04, saturation_batch=8, alpha_s=0.0, prefill_s_per_token=0.0)
    with pytest.raises(ProfileError, match=rf"latency\.{key} gives"):  # built in code, too
        LatencyModel(**{**fields, key: 1e300})


@pytest.mark.parametrize("key", ["cpu_s", "linear_s", "allreduce_s"])
def test_schema_2_table_values_over_the_limit_are_refused(tmp_path, key):
    def last(value):
        return lambda d: d["latency"][key].__setitem__(-1, value)

    refused(tmp_path, SCHEMA_2, last(1e300), rf"latency\.{key} gives 1e\+300 s per iteration")
    loads(tmp_path, SCHEMA_2, last(MAX_TERM_S))


@pytest.mark.parametrize(("numerator", "denominator", "unit"), [
    ("kv_bytes_per_token", "decode_bandwidth_bytes_s", "KV token read"),
    ("attention_flops_per_pair", "prefill_flops_s", "query-key pair"),
    ("lm_head_bytes", "memory_bandwidth_bytes_s", "iteration"),
    ("lm_head_flops_per_row", "peak_flops_s", "emitting row"),
])
def test_schema_2_per_unit_costs_over_the_limit_are_refused(tmp_path, numerator, denominator, unit):
    rate = load_profile(SCHEMA_2).to_json()["latency"][denominator]
    refused(tmp_path, SCHEMA_2, lat(**{numerator: 1e300}),
            rf"latency\.{numerator} / {denominator} gives .* s per {unit}, over the 60 s")
    loads(tmp_path, SCHEMA_2, lat(**{numerator: MAX_TERM_S * rate}))


# ------------------------------------------------------------------------------------------------- hardware
@pytest.mark.parametrize(("key", "bounds"), [("memory_bandwidth_bytes_s", BANDWIDTH_BYTES_S),
                                             ("peak_flops_s", FLOPS_S)])
def test_data_sheet_rates_outside_the_physical_range_are_refused(tmp_path, key, bounds):
    low, high = bounds
    free = {"lm_head_bytes": 0.0, "lm_head_flops_per_row": 0.0}  # so no term exceeds its limit at a 1e6 rate first
    for bad in (low * 0.999, high * 1.001):
        refused(tmp_path, SCHEMA_2, lat(**{key: bad, **free}), rf"latency\.{key} .* is outside the physical range")
    loads(tmp_path, SCHEMA_2, lat(**{key: high}))


@pytest.mark.parametrize(("effective", "sheet", "bounds"),
                         [("decode_bandwidth_bytes_s", "memory_bandwidth_bytes_s", BANDWIDTH_BYTES_S),
                          ("prefill_flops_s", "peak_flops_s", FLOPS_S)])
def test_effective_rates_stay_in_range_and_within_the_data_sheet(tmp_path, effective, sheet, bounds):
    low, _ = bounds
    refused(tmp_path, SCHEMA_2, lat(**{effective: low * 0.999, "lm_head_bytes": 0.0, "kv_bytes_per_token": 0.0,
                                       "attention_flops_per_pair": 0.0}),
            rf"latency\.{effective} .* is outside the physical range {re.escape(f'[{low:g},')}")
    sheet_value = load_profile(SCHEMA_2).to_json()["latency"][sheet]
    refused(tmp_path, SCHEMA_2, lat(**{effective: sheet_value * 1.001}),
            rf"latency\.{effective} .* exceeds {sheet} .* cannot beat the data sheet")
    loads(tmp_path, SCHEMA_2, lat(**{effective: sheet_value}))  # equal to the data sheet: 100% efficiency


def test_models_built_in_code_may_use_toy_hardware_numbers():
    # The hardware ranges hold for profile files; tests build models with 1 B/s and 1 FLOP/s.
    TokenLatencyModel(cpu_rows=(1.0,), cpu_s=(0.0,), linear_tokens=(1.0,), linear_s=(0.04,), allreduce_s=(0.0,),
                      kv_bytes_per_token=1.0, decode_bandwidth_bytes_s=1.0, attention_flops_per_pair=0.0,
                      prefill_flops_s=1.0, lm_head_bytes=0.0, lm_head_flops_per_row=0.0, memory_bandwidth_bytes_s=1.0,
                      peak_flops_s=1.0)


# ---------------------------------------------------------------------------------- capacity, cold start, noise
def test_kv_capacity_is_bounded_by_what_the_observation_encodes(tmp_path):
    from servegym.envs.observation import BIG

    assert MAX_KV_TOKENS == BIG
    kv = lambda blocks: lambda d: d["kv_cache"].update(num_blocks=blocks, block_size=16)  # noqa: E731
    refused(tmp_path, SCHEMA_1, kv(MAX_KV_TOKENS // 16 + 1), r"kv_cache: 62,500,001 blocks x 16 tokens = "
            r"1,000,000,016 tokens, over the 1,000,000,000")
    loads(tmp_path, SCHEMA_1, kv(MAX_KV_TOKENS // 16))


def test_cold_start_over_an_hour_is_refused(tmp_path):
    refused(tmp_path, SCHEMA_1, lambda d: d.update(cold_start_s=1e300), r"cold_start_s 1e\+300 is over 3600 s")
    refused(tmp_path, SCHEMA_1, lambda d: d.update(cold_start_s=MAX_COLD_START_S + 1), "cold_start_s 3601")
    loads(tmp_path, SCHEMA_1, lambda d: d.update(cold_start_s=MAX_COLD_START_S))


@pytest.mark.parametrize("name", [SCHEMA_1, SCHEMA_2])
def test_noise_over_the_limit_is_refused_in_the_file_and_as_an_override(tmp_path, name):
    refused(tmp_path, name, lat(noise_cv=MAX_NOISE_CV + 0.01), r"latency\.noise_cv 1.01 is over 1")
    loads(tmp_path, name, lat(noise_cv=MAX_NOISE_CV))
    with pytest.raises(ValueError, match=r"noise_cv 1\.5 is over 1"):
        CalibratedBackend(load_profile(name), noise_cv=1.5)
    CalibratedBackend(load_profile(name), noise_cv=MAX_NOISE_CV)


# --------------------------------------------------------------------------------------------------- predict
def predict(capsys, *args: str) -> tuple[float, list[str]]:
    assert main(["profile", "predict", *args]) == 0
    out = capsys.readouterr()
    lines = out.err.splitlines()
    assert sum("warning" not in line for line in lines) == 1  # the line naming the profile's runtime
    return float(out.out), [line for line in lines if ": warning: " in line]


def test_predict_warns_how_far_past_the_kv_capacity_and_measured_range(capsys):
    ms, warnings = predict(capsys, SCHEMA_2, "--batch", "100000000", "--context", "100000000")
    assert ms > 1e11  # the time is still printed (ms), extrapolated
    assert warnings == [
        "servegym profile predict: warning: batch x context = 1e+16 tokens (625,000,000,000,000 blocks of 16) is "
        "2.22e+10 x the KV capacity of 450,896 tokens (28,181 blocks), 624,999,999,971,819 blocks over",
        "servegym profile predict: warning: 100,000,000 requests per iteration is 7.81e+05 x the largest measured "
        "(128); the time is extrapolated",
        "servegym profile predict: warning: 100,000,000 tokens per iteration is 3.05e+03 x the largest measured "
        "(32,768); the time is extrapolated",
    ]


def test_predict_is_silent_within_the_limits_and_warns_one_past_them(capsys):
    # a100-llama3-8b: 28,181 blocks of 16 tokens; measured up to 128 rows. A request of 16 tokens holds one block,
    # of 17 tokens two (blocks are whole).
    assert predict(capsys, SCHEMA_2, "--batch", "128", "--context", "16")[1] == []
    assert predict(capsys, SCHEMA_2, "--batch", "1", "--context", str(28_181 * 16))[1] == []
    (kv,) = predict(capsys, SCHEMA_2, "--batch", "1", "--context", str(28_181 * 16 + 1))[1]
    assert kv.endswith("(28,182 blocks of 16) is 1 x the KV capacity of 450,896 tokens (28,181 blocks), 1 blocks over")
    (rows,) = predict(capsys, SCHEMA_2, "--batch", "129", "--context", "16")[1]
    assert "129 requests per iteration is 1.01 x the largest measured (128)" in rows
    kv, tokens = predict(capsys, SCHEMA_2, "--batch", "2", "--prefill", str(28_181 * 8 + 1))[1]
    assert "warning: batch x prompt = 4.51e+05 tokens (28,182 blocks of 16) is 1 x the KV capacity" in kv
    assert "450,898 tokens per iteration is 13.8 x the largest measured (32,768)" in tokens


def test_predict_reads_a_calibrated_profiles_sweep(capsys):
    # cpu-small-llama was measured up to batch 128 (its cpu knots) and context 512 (its provenance's sweep).
    assert predict(capsys, "cpu-small-llama", "--batch", "128", "--context", "512")[1] == []
    warnings = predict(capsys, "cpu-small-llama", "--batch", "129", "--context", "513")[1]
    assert [w.split(": warning: ")[1].split(" is ")[0] for w in warnings] == ["129 requests per iteration",
                                                                              "513 tokens per request"]


def test_predict_help_states_the_unit(capsys):
    with pytest.raises(SystemExit):
        main(["profile", "predict", "--help"])
    assert "milliseconds (ms)" in " ".join(capsys.readouterr().out.split())
