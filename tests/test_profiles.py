"""Schema-2 profiles: the token-keyed latency model, KV capacity as vLLM computes it, the build from Vidur's
tables (and its rebuild check), and the ``servegym profile`` commands."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from servegym.backends import LatencyModel, ProfileError, StepBatch, TokenLatencyModel, load_profile
from servegym.backends.build import (
    GPUS,
    MODELS,
    SHIPPED,
    TABLES,
    build_profile,
    kv_capacity,
    profile_name,
    rebuild_shipped,
)
from servegym.cli import main

PROFILES = Path(__file__).resolve().parents[1] / "backends" / "profiles"


def tiny_model(**overrides) -> TokenLatencyModel:
    fields = dict(cpu_rows=(1.0, 9.0), cpu_s=(0.001, 0.003), linear_tokens=(1.0, 100.0, 200.0),
                  linear_s=(0.010, 0.010, 0.030), allreduce_s=(0.0, 0.001, 0.002), kv_bytes_per_token=1000.0,
                  decode_bandwidth_bytes_s=1e9, attention_flops_per_pair=100.0, prefill_flops_s=1e12,
                  lm_head_bytes=2e6, lm_head_flops_per_row=4e9, memory_bandwidth_bytes_s=1e9, peak_flops_s=1e12)
    return TokenLatencyModel(**{**fields, **overrides})


def test_token_model_sums_its_terms_by_hand():
    # 2 decodes (contexts 300 and 700) and one chunk of 40 tokens starting at 10 whose target is 50 (it completes):
    # rows 3 -> cpu 1 ms + (3-1)/(9-1) * 2 ms = 1.5 ms; T = 42 -> linear 10 ms (flat to 100 tokens);
    # allreduce 41/99 * 1 ms = 0.41414 ms; decode attention 1000 bytes x 1000 tokens / 1e9 = 1 ms;
    # prefill pairs sum_{j=1..40} (10 + j) = 400 + 820 = 1220 -> 1220 x 100 / 1e12 = 1.22e-7 s;
    # LM head for 3 emitting rows: max(2e6 / 1e9 = 2 ms, 3 x 4e9 / 1e12 = 12 ms) = 12 ms.
    model = tiny_model()
    batch = StepBatch(np.array([0, 1]), np.array([300, 700]), np.array([2]), np.array([10]), np.array([40]),
                      np.array([50]))
    expected = 0.0015 + 0.010 + 0.001 * 41 / 99 + 0.001 + 1.22e-7 + 0.012
    assert model.iteration_s(batch) == pytest.approx(expected, rel=1e-9)
    # The same chunk not completing emits no token: the LM head then serves the 2 decodes only (max(2, 8) ms).
    partial = batch._replace(prefill_target=np.array([80]))
    assert model.iteration_s(partial) == pytest.approx(expected - 0.012 + 0.008, rel=1e-9)


def test_token_model_extrapolates_the_last_segment_and_holds_the_first_value():
    model = tiny_model()
    # T = 300: last segment slope 0.02 s per 100 tokens -> 30 + 20 = 50 ms linear; allreduce 2 + 1 = 3 ms.
    terms = model.terms(rows=20, tokens=300, decode_context=0.0, prefill_pairs=0.0, emitting_rows=0)
    assert terms["linear"] == pytest.approx(0.050) and terms["allreduce"] == pytest.approx(0.003)
    assert terms["cpu"] == pytest.approx(0.003 + 11 * 0.002 / 8) and terms["lm_head"] == 0.0
    assert model.terms(rows=0, tokens=0, decode_context=0, prefill_pairs=0, emitting_rows=0)["cpu"] == 0.0


@pytest.mark.parametrize(("field", "value", "message"), [
    ("linear_s", (0.02, 0.01, 0.03), "non-decreasing"),
    ("linear_tokens", (1.0, 1.0, 200.0), "increase strictly"),
    ("cpu_s", (0.001,), "as many knots"),
    ("peak_flops_s", 0.0, "must be > 0"),
    ("kv_bytes_per_token", float("nan"), "finite"),
])
def test_token_model_rejects_bad_fields(field, value, message):
    with pytest.raises(ValueError, match=message):
        tiny_model(**{field: value})


def test_schema_1_profiles_load_and_mean_what_they_meant():
    profile = load_profile("paper-v100-llama3.2-3b")
    assert isinstance(profile.latency, LatencyModel) and profile.to_json()["schema_version"] == 1
    # l(B) = 43 ms + 2 ms x (B - 8) beyond B0 = 8: 20 decodes -> 43 + 24 = 67 ms.
    assert profile.latency.decode_s(20) == pytest.approx(0.067)
    assert profile.latency.decode_s(5) == pytest.approx(0.043)
    # A prefill-only iteration: the flat 43 ms, 300 prompt tokens at 1.3e-4 s, and attention
    # 7e-9 x sum_{j=1..300} j = 7e-9 x 45,150.
    assert profile.latency.prefill_s(300) == pytest.approx(0.043 + 300 * 1.3e-4 + 7e-9 * 45_150)


def test_kv_capacity_of_llama3_8b_on_an_a100_by_hand():
    # 32 layers x 8 KV heads x 128 dims x 2 (K and V) x 2 bytes = 131,072 bytes = 128 KiB per token.
    blocks, report = kv_capacity(GPUS["a100"], MODELS["llama3-8b"], tp=1)
    assert report["kv_bytes_per_token_per_gpu"] == 131_072
    free = 0.9 * 80 * 2**30 - 8.03e9 * 2 - 2 * 2**30
    assert blocks == math.floor(free / 131_072) // 16 == 28_181
    # Tensor parallelism splits the weights and the KV heads across GPUs.
    _, tp4 = kv_capacity(GPUS["a100"], MODELS["llama2-70b"], tp=4)
    assert tp4["kv_bytes_per_token_per_gpu"] == 80 * 8 * 128 * 2 * 2 / 4


@pytest.mark.parametrize(("gpu", "model", "tp"), SHIPPED, ids=[profile_name(*s) for s in SHIPPED])
def test_shipped_profile_predicts_its_operator_table_within_5_percent(gpu, model, tp):
    profile = load_profile(profile_name(gpu, model, tp))
    assert isinstance(profile.latency, TokenLatencyModel)
    terms = profile.provenance["terms"]
    assert terms["linear"]["median_rel_error"] < 0.05
    if tp > 1:
        assert terms["allreduce"]["median_rel_error"] < 0.05
    # Independently of the stored report: rebuild the linear term from the table and compare at every row.
    table = TABLES / terms["linear"]["table"]
    with table.open() as handle:
        rows = [r for r in csv.DictReader(handle) if int(r["num_tensor_parallel_workers"]) == tp]
    layers = MODELS[model].layers
    ops = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
           "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
    errors = []
    for r in rows:
        measured = (layers * sum(float(r[f"time_stats.{op}.median"]) for op in ops)
                    + float(r["time_stats.emb.median"])) / 1e3
        predicted = profile.latency.terms(1, float(r["num_tokens"]), 0.0, 0.0, 0)["linear"]
        errors.append(abs(predicted - measured) / measured)
    assert np.median(errors) < 0.05


def same_json(built, shipped, where: str = "") -> list[str]:
    """Where two parsed JSON values differ: keys, strings, integers and lengths exactly, floats to 1e-9 relative
    (numpy releases differ in the last digit of a sum: 0.025280000000000004 against 0.02528)."""
    if isinstance(shipped, dict) and isinstance(built, dict):
        if set(built) != set(shipped):
            return [f"{where}: keys {sorted(set(built) ^ set(shipped))} differ"]
        return [d for key in shipped for d in same_json(built[key], shipped[key], f"{where}.{key}" if where else key)]
    if isinstance(shipped, list) and isinstance(built, list):
        if len(built) != len(shipped):
            return [f"{where}: {len(built)} items, shipped {len(shipped)}"]
        pairs = enumerate(zip(built, shipped, strict=True))
        return [d for i, (b, s) in pairs for d in same_json(b, s, f"{where}[{i}]")]
    if isinstance(shipped, float) and isinstance(built, (int, float)) and not isinstance(built, bool):
        return [] if built == pytest.approx(shipped, rel=1e-9, abs=1e-15) else [f"{where}: {built!r} != {shipped!r}"]
    return [] if (type(built), built) == (type(shipped), shipped) else [f"{where}: {built!r} != {shipped!r}"]


def test_json_comparison_tolerates_the_last_digit_only():
    assert same_json({"a": [0.025280000000000004, 3, "x"]}, {"a": [0.02528, 3, "x"]}) == []
    assert same_json({"a": [0.02529, 3]}, {"a": [0.02528, 3]}) == ["a[0]: 0.02529 != 0.02528"]
    assert same_json({"a": 3.0}, {"a": 3}) == ["a: 3.0 != 3"]  # an integer field stays an integer
    assert same_json({"a": 1, "b": 2}, {"a": 1}) == [": keys ['b'] differ"]
    assert same_json({"a": "y"}, {"a": "x"}) and same_json([1, 2], [1])


def test_rebuilding_gives_the_shipped_json(tmp_path):
    for path in rebuild_shipped(tmp_path):
        built, shipped = json.loads(path.read_text()), json.loads((PROFILES / path.name).read_text())
        assert same_json(built, shipped, path.stem) == []


def test_a100_llama3_8b_decode_is_in_the_measured_range(capsys):
    # docs/PROFILES.md: reading 16.06 GB of fp16 weights at 2,039 GB/s takes 7.9 ms, a floor; served engines reach
    # 70-85% of that bandwidth plus about 1 ms of host overhead, so 9-14 ms per decode iteration at batch 1.
    assert main(["profile", "predict", "a100-llama3-8b", "--batch", "1", "--context", "512"]) == 0
    value = float(capsys.readouterr().out.strip())
    assert 9.0 <= value <= 14.0


def test_predict_prefill_prints_one_number_that_grows_with_the_batch(capsys):
    main(["profile", "predict", "a100-llama3-8b", "--prefill", "512"])
    one = float(capsys.readouterr().out.strip())
    main(["profile", "predict", "a100-llama3-8b", "--prefill", "512", "--batch", "4"])
    four = float(capsys.readouterr().out.strip())
    assert 2 * one < four < 5 * one


def test_profile_list_and_show(capsys):
    assert main(["profile", "list"]) == 0
    out = capsys.readouterr().out
    assert "a100-llama3-8b" in out and "450,896" in out and "paper-v100-llama3.2-3b" in out
    assert main(["profile", "show", "a40-llama2-7b"]) == 0
    out = capsys.readouterr().out
    assert "linear: median" in out and "efficiency 0.7" in out


def _copy_table(tmp_path: Path, drop: str | None = None) -> Path:
    src = TABLES / "compute" / "a100" / "meta-llama" / "Llama-2-7b-hf" / "mlp.csv"
    dst = tmp_path / "compute" / "a100" / "meta-llama" / "Llama-2-7b-hf" / "mlp.csv"
    dst.parent.mkdir(parents=True)
    with src.open() as fin, dst.open("w", newline="") as fout:
        reader = csv.DictReader(fin)
        names = [n for n in reader.fieldnames if n != drop]
        writer = csv.DictWriter(fout, names, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(reader)
    (tmp_path / "cpu_overheads").symlink_to(TABLES / "cpu_overheads")
    return tmp_path


def test_build_errors_name_the_table_column_model_tp_or_gpu(tmp_path):
    with pytest.raises(ProfileError, match=r"missing column\(s\) \['time_stats.mlp_up_proj.median'\]"):
        build_profile("a100", "llama2-7b", 1, _copy_table(tmp_path, drop="time_stats.mlp_up_proj.median"))
    with pytest.raises(ProfileError, match="no rows for tensor-parallel degree 3"):
        build_profile("a100", "llama2-7b", 3)
    with pytest.raises(ProfileError, match="model 'llama9-1t' unknown"):
        build_profile("a100", "llama9-1t", 1)
    with pytest.raises(ProfileError, match="GPU 'v100' has no stated specs"):
        build_profile("v100", "llama2-7b", 1)
    with pytest.raises(ProfileError, match="does not exist"):
        build_profile("a40", "llama3-8b", 1)  # no A40 table for Llama-3-8B
    with pytest.raises(ProfileError, match="no all-reduce table"):
        build_profile("a40", "llama2-7b", 2)


def test_unknown_schema_version_is_an_error(tmp_path):
    data = json.loads((PROFILES / "a100-llama3-8b.json").read_text())
    data["schema_version"] = 3
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=r"schema_version 3 unsupported \(supported: \[1, 2\]\)"):
        load_profile(path)
    data["schema_version"] = 2
    del data["latency"]["linear_s"]
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=r"missing key\(s\) \['linear_s'\]"):
        load_profile(path)


def test_iteration_time_grows_with_tokens_and_context():
    lat = load_profile("a100-llama3-8b").latency
    decode = [lat.decode_s(b, 1024) for b in (1, 8, 32, 128, 256)]
    assert decode == sorted(decode) and decode[-1] > 2 * decode[0]
    assert lat.decode_s(32, 4096) > lat.decode_s(32, 512)


def test_the_per_step_total_equals_the_sum_of_the_named_terms():
    # total_s is the hot path; terms() is what the docs and reports show. They must agree everywhere, including
    # below the first knot and beyond the last (extrapolation).
    rng = np.random.default_rng(0)
    for name in ("a100-llama3-8b", "h100-llama2-70b-tp8", "a40-llama2-7b"):
        lat = load_profile(name).latency
        for _ in range(200):
            rows = int(rng.integers(0, 300))
            args = (rows, float(rng.integers(0, 70_000)), float(rng.integers(0, 10**6)), float(rng.integers(0, 10**7)),
                    int(rng.integers(0, rows + 1)))
            assert lat.total_s(*args) == pytest.approx(sum(lat.terms(*args).values()), rel=1e-12)
