"""The env against Gymnasium's and SB3's checkers, determinism, vector envs, spaces."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import servegym
from servegym.envs import ENGINE_FEATURES, ServingEnv, queue_matrix, running_matrix
from tests.conftest import admit_all, make

WORKLOADS = ["low", "burst", "gsm8k", "azure-code"]


@pytest.mark.parametrize("length_mode", ["known", "predicted", "unknown"])
def test_gymnasium_check_env_passes_without_warnings(length_mode):
    env = make(engine={"length_mode": length_mode})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped, skip_render_check=False)


def test_sb3_check_env_passes_without_warnings():
    from stable_baselines3.common.env_checker import check_env as sb3_check_env

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sb3_check_env(ServingEnv(workload="low"), warn=True)


def test_registered_id_works_after_import():
    assert servegym.ENV_ID in gym.registry
    env = gym.make(servegym.ENV_ID)
    assert env.spec.max_episode_steps == 20_000


def rollout(env: gym.Env, seed: int, steps: int) -> list:
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    trace = [obs]
    for _ in range(steps):
        action = env.action_space.sample()
        obs, reward, terminated, truncated, info = env.step(action)
        trace.append((obs, reward, info["clock_s"]))
        if terminated or truncated:
            break
    return trace


def assert_same(a, b) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        if isinstance(x, dict):
            for key in x:
                np.testing.assert_array_equal(x[key], y[key])
        else:
            assert_same(list(x), list(y)) if isinstance(x, tuple) else np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("workload", WORKLOADS)
def test_same_seed_same_episode(workload):
    a = rollout(make(workload, latency_noise_cv=0.05), seed=7, steps=300)
    b = rollout(make(workload, latency_noise_cv=0.05), seed=7, steps=300)
    assert_same(a, b)


def test_different_seeds_differ():
    a = rollout(make("medium"), seed=1, steps=50)
    b = rollout(make("medium"), seed=2, steps=50)
    assert any(not np.array_equal(x[0]["queue"], y[0]["queue"]) for x, y in zip(a[1:], b[1:], strict=False))


def test_make_vec_steps_all_envs():
    envs = gym.make_vec(servegym.ENV_ID, num_envs=2, workload="low")
    obs, _ = envs.reset(seed=0)
    assert obs["engine"].shape == (2, len(ENGINE_FEATURES))
    actions = np.ones((2, envs.single_action_space.shape[0]), dtype=np.int64)
    obs, reward, _, _, _ = envs.step(actions)
    assert reward.shape == (2,)
    envs.close()


def test_observation_reports_engine_state():
    env = make("medium")
    obs, _ = env.reset(seed=0)
    for _ in range(20):
        obs, *_ = env.step(admit_all(env))
    e = env.unwrapped.engine
    engine = dict(zip(ENGINE_FEATURES, obs["engine"], strict=True))
    assert engine["num_running"] == e.num_running
    assert engine["num_waiting"] == e.waiting.size
    assert engine["itl_last_s"] == pytest.approx(e.itl_last, rel=1e-6)
    assert engine["baseline_step_s"] == pytest.approx(0.043)
    rows = running_matrix(obs)[: e.num_running]
    assert np.all(rows[:, 0] > 0) and np.all(running_matrix(obs)[e.num_running :] == 0)
    assert queue_matrix(obs).shape == (32, 6)
    assert engine["token_load"] == pytest.approx(float((rows[:, 4] - rows[:, 2]).sum()))


def test_true_length_hidden_unless_known():
    for mode, check in [
        ("known", lambda lo, hi, true: np.all(lo == true) and np.all(hi == true)),
        ("unknown", lambda lo, hi, true: np.all(lo == 1) and np.all(hi == 2048)),
        ("truth_interval", lambda lo, hi, true: np.all(lo <= true) and np.all(true <= hi) and np.any(lo < hi)),
        # A real predictor's interval: within bounds, and wrong for some requests on both sides.
        ("predicted", lambda lo, hi, true: np.all((lo >= 1) & (lo <= hi) & (hi <= 2048)) and np.any(true < lo)
         and np.any(true > hi)),
    ]:
        env = make("medium", engine={"length_mode": mode})
        env.reset(seed=3)
        log = env.unwrapped.engine.log
        assert check(log.output_lo, log.output_hi, log.num_output_tokens), mode


def test_latency_reward_sums_to_minus_total_time_in_system():
    env = make("low")
    env.reset(seed=0)
    total, done = 0.0, False
    while not done:
        _, reward, terminated, truncated, _ = env.step(admit_all(env))
        total += reward
        done = terminated or truncated
    assert terminated
    log = env.unwrapped.engine.log
    assert total == pytest.approx(-np.sum(log.finish_s - log.arrival_s), rel=1e-9)


def test_action_masks_allow_only_filled_slots():
    env = make("low")
    env.reset(seed=0)
    w = env.unwrapped.queue_window
    mask = env.unwrapped.action_masks().reshape(w, w + 1)
    visible = env.unwrapped.engine.waiting.size
    assert mask[:, 0].all()
    assert mask[:visible, 1:].all() and not mask[visible:, 1:].any()


def test_checkers_pass_on_a_serverless_pool():
    from stable_baselines3.common.env_checker import check_env as sb3_check_env

    pool = {"num_containers": 3, "keep_alive_s": 2.0, "start_cold": True}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(make("burst", pool=pool).unwrapped, skip_render_check=False)
        sb3_check_env(ServingEnv(workload="burst", pool=pool), warn=True)


def test_every_engine_feature_is_the_named_engine_quantity():
    # The encoder builds obs["engine"] positionally for speed; this pins each position to its schema name, on a
    # tight cache where preemption, prefilling and a falling KV fraction all show.
    env = make("burst", engine={"num_kv_blocks": 300, "length_mode": "predicted", "prefill_chunk_tokens": 128})
    obs, _ = env.reset(seed=3)
    seen_preemption = False
    for _ in range(400):
        obs, _, _, _, info = env.step(admit_all(env))
        e = env.unwrapped.engine
        cfg = e.config
        expected = {
            "itl_last_s": e.itl_last, "itl_smoothed_s": e.itl_smoothed, "baseline_step_s": 0.043,
            "num_running": e.num_running, "num_prefilling": e.num_prefilling, "token_load": e.token_load,
            "num_waiting": e.waiting.size, "kv_free_frac": 1 - e.num_used_blocks / e.num_kv_blocks,
            "kv_free_delta": e.kv_free_delta, "kv_capacity_tokens": e.num_kv_blocks * e.block_size,
            "kv_block_size": e.block_size, "last_num_preemptions": info["num_preemptions"],
            "last_num_admitted": info["num_admitted"], "last_num_finished": info["num_finished"],
            "length_mode": 3.0, "prefill_chunk_tokens": cfg.prefill_chunk_tokens,  # predicted's code
            "max_num_batched_tokens": cfg.max_num_batched_tokens,
        }
        assert set(expected) == set(ENGINE_FEATURES)
        actual = dict(zip(ENGINE_FEATURES, obs["engine"], strict=True))
        for name, value in expected.items():
            assert actual[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
        seen_preemption |= info["num_preemptions"] > 0
    assert seen_preemption
