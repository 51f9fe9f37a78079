"""The real backend: batching correctness, cache accounting, the env on a real model, calibration, fidelity."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from gymnasium.utils.env_checker import check_env  # noqa: E402

from servegym.backends import TokenLatencyModel, load_profile  # noqa: E402
from servegym.backends.base import StepBatch  # noqa: E402
from servegym.backends.torch_backend import TorchBackend  # noqa: E402
from servegym.policies import make_policy  # noqa: E402
from servegym.runner import make_env, run_episode  # noqa: E402
from tests.conftest import fixed  # noqa: E402

EMPTY = np.zeros(0, dtype=np.int64)


@pytest.fixture(scope="module", params=["grouped", "padded"])
def backend(request):
    return TorchBackend("tiny-llama", num_kv_blocks=512, keep_logits=True, attention=request.param)


def reference_logits(model, tokens):
    """Next-token logits of one request run alone through the model's stock SDPA attention, no cache."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        with torch.inference_mode():
            return model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0, -1].float().numpy()
    finally:
        model.config._attn_implementation = previous


def assert_mixed_steps_match_each_request_alone(backend, atol=1e-4):
    """Three packed steps of prefill chunks and decodes; each request's last logits must equal its own run."""
    backend.reset(np.random.default_rng(1))
    a, b, c = 0, 1, 2
    # Step 1: A's first chunk and B's whole prompt. Step 2: B decodes while A and C prefill chunks (A's 24-token
    # chunk is split into query tiles by the padded kernel). Step 3: A and B decode while C finishes.
    backend.execute(StepBatch(EMPTY, EMPTY, np.array([a, b]), np.array([0, 0]), np.array([16, 10]),
                              np.array([40, 10])))
    backend.execute(StepBatch(np.array([b]), np.array([11]), np.array([a, c]), np.array([16, 0]),
                              np.array([24, 7]), np.array([40, 30])))
    backend.execute(StepBatch(np.array([a, b]), np.array([41, 12]), np.array([c]), np.array([7]), np.array([23]),
                              np.array([30])))
    for rid in (a, b, c):
        tokens = backend.request_tokens(rid)
        np.testing.assert_allclose(backend.last_logits[rid], reference_logits(backend.model, tokens[:-1]),
                                   atol=atol, rtol=atol)
        assert int(np.argmax(backend.last_logits[rid])) == tokens[-1]


def test_mixed_prefill_and_decode_batch_matches_each_request_alone(backend):
    assert_mixed_steps_match_each_request_alone(backend)


@pytest.mark.slow
def test_engine_kv_occupancy_matches_the_cache_blocks():
    policy = make_policy("fcfs")
    env = make_env(policy, workload=fixed(np.zeros(12), np.full(12, 40), np.full(12, 30)),
                   backend="torch", backend_options={"model": "tiny-llama"},
                   engine={"num_kv_blocks": 40, "block_size": 8, "check_invariants": True})
    obs, _ = env.reset(seed=0)
    engine, preempted = env.unwrapped.engine, 0
    done = False
    while not done:
        obs, _, done, _, info = env.step(policy.act(obs))
        preempted += info["num_preemptions"]
        assert engine.backend.allocated_blocks() == engine.num_used_blocks
    assert preempted > 0  # the small cache forced recompute, and the accounting held through it


class TickClock:
    """A deterministic clock: every reading advances 2**-8 s, a binary fraction, so differences of readings are
    exact (the checker replays steps and compares rewards, which wall-clock timing can never repeat)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 2.0**-8
        return self.now


def test_real_backend_passes_the_env_checker():
    env = make_env(None, workload=fixed([0.0, 0.0, 0.1], [20, 30, 10], [5, 5, 5]), backend="torch",
                   backend_options={"model": "tiny-llama", "clock": TickClock()}, engine={"num_kv_blocks": 64})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped, skip_render_check=True)


@pytest.mark.slow
def test_same_trace_runs_through_both_backends():
    workload = fixed(np.linspace(0, 1, 8), np.full(8, 24), np.full(8, 12))
    results = {}
    for backend in ("calibrated", "torch"):
        policy = make_policy("fcfs")
        env = make_env(policy, workload=workload, backend=backend, backend_options={"model": "tiny-llama"}
                       if backend == "torch" else None, engine={"num_kv_blocks": 256})
        results[backend] = run_episode(env, policy, seed=0)
    for result in results.values():
        assert result.summary["num_finished"] == 8
    real = results["torch"].log
    assert all(real.token_times(r).size == 12 for r in range(8))
    assert results["torch"].summary["itl_mean"] > 0


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a preset"):
        TorchBackend(str(tmp_path / "nowhere"))


def test_backend_cache_and_engine_config_must_agree():
    backend = TorchBackend("tiny-llama", num_kv_blocks=32)
    with pytest.raises(ValueError, match="KV cache has 32 blocks"):
        make_env(None, backend=backend, engine={"num_kv_blocks": 64})


def test_shipped_cpu_profile_round_trips_and_carries_provenance(tmp_path):
    profile = load_profile("cpu-small-llama")
    for key in ("hardware", "model", "method", "date", "versions", "fit_error"):
        assert key in profile.provenance
    groups = {"decode", "prefill", "batched", "mixed"}
    assert set(profile.provenance["fit_error"]) == set(profile.provenance["holdout_error"]) == groups
    assert profile.runtime == "eager" and isinstance(profile.latency, TokenLatencyModel)
    # The recorded terms are the model's: KV bytes over the effective bandwidth, FLOPs over the FLOP rate.
    lat, terms = profile.latency, profile.provenance["terms"]
    assert lat.kv_bytes_per_token / lat.decode_bandwidth_bytes_s == pytest.approx(terms["kv_s_per_token"]["value"])
    assert lat.attention_flops_per_pair / lat.prefill_flops_s == pytest.approx(terms["s_per_pair"]["value"])
    assert lat.cpu_s[0] == pytest.approx(terms["cpu_s_per_step"]["value"] + terms["cpu_s_per_row"]["value"])
    profile.save(tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == profile
    data = json.loads((tmp_path / "p.json").read_text())
    data["latency"]["B0"] = 3
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="unknown key"):
        load_profile(tmp_path / "bad.json")


@pytest.mark.slow
def test_calibrate_and_fidelity_commands_run_end_to_end(tmp_path, capsys):
    from servegym.backends.calibration import calibrate
    from servegym.backends.calibration_sweep import SweepPlan
    from servegym.evaluation.fidelity import fidelity, fidelity_table

    backend = TorchBackend("tiny-llama", num_kv_blocks=1024)
    plan = SweepPlan(batches=(1, 4, 16), contexts=(16, 64), chunks=(16, 64), chunk_starts=(0, 32),
                     mixed=((4, 16),), repeats=1)
    profile, samples = calibrate(backend, "tiny-test", plan)
    assert profile.latency.decode_s(1) > 0 and len(samples["decode"]) == 6
    path = tmp_path / "tiny.json"
    profile.save(path)
    report = fidelity(["fcfs", "flow-control"], fixed(np.linspace(0, 0.3, 6), np.full(6, 20), np.full(6, 8)),
                      str(path), seeds=(0, 1), repeats=2, backend_options={"model": "tiny-llama"})
    assert {r.metric for r in report.rows} >= {"ttft_p50", "itl_mean", "throughput_rps"}
    assert all(len(r.seed_errors) == 2 and r.spread >= 0 for r in report.rows)
    timing = report.timings["fcfs"]
    assert timing.forward_ms_mean > 0 and timing.overhead_ms_mean > 0
    assert "relative error" in fidelity_table(report.rows)
