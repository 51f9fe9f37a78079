"""The native vector env (``servegym.envs.vector``): the same episodes as single envs, Gymnasium's vector API and
autoreset modes, SB3's ``VecEnv`` over it with ``DummyVecEnv``'s transitions, and clear errors."""

from __future__ import annotations

from functools import partial

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import servegym
from servegym import ENV_ID, task_id
from servegym.envs.vector import ServingVectorEnv, make_serving_vector_env, vector_info

N = 3
LIMIT = 40
"""A short episode limit, so every sub-env ends (truncated) and autoresets within the steps a test plays."""


def _equal(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return np.array_equal(np.asarray(a), np.asarray(b))


def _actions(space: gym.Space, steps: int, seed: int) -> list[np.ndarray]:
    space.seed(seed)
    return [space.sample() for _ in range(steps)]


@pytest.mark.parametrize(("env_id", "kwargs"), [
    (task_id("memory-tight"), {"flat_obs": True}),
    (task_id("serverless-burst"), {}),  # a pool of containers, the Dict observation
    (ENV_ID, {"workload": "burst", "decision_steps": True}),
    (task_id("prefix-reuse"), {"flat_obs": True}),  # the prefix keys in the observation
], ids=["memory-tight-flat", "serverless-burst-dict", "burst-decision-steps", "prefix-reuse-flat"])
def test_each_sub_env_plays_the_episode_a_single_env_plays_seed_by_seed(env_id, kwargs):
    # Rule: sub-env i is gym.make(id) reset with seed + i, its later episodes reset unseeded (drawing from its own
    # np_random), and the step after an end resets it and ignores its action (Gymnasium's NextStep autoreset).
    vec = servegym.make_vec(env_id, num_envs=N, max_episode_steps=LIMIT, **kwargs)
    singles = [gym.make(env_id, max_episode_steps=LIMIT, **kwargs) for _ in range(N)]
    obs, _ = vec.reset(seed=11)
    for i, env in enumerate(singles):
        assert _equal({k: v[i] for k, v in obs.items()} if isinstance(obs, dict) else obs[i], env.reset(seed=11 + i)[0])
    ended, episodes = [False] * N, 0
    for action in _actions(vec.action_space, 3 * LIMIT, seed=5):
        obs, rewards, terminations, truncations, _ = vec.step(action)
        for i, env in enumerate(singles):
            if ended[i]:
                expected, reward, terminated, truncated = env.reset()[0], 0.0, False, False
            else:
                expected, reward, terminated, truncated, _ = env.step(action[i])
            row = {k: v[i] for k, v in obs.items()} if isinstance(obs, dict) else obs[i]
            assert _equal(row, expected) and rewards[i] == reward
            assert (terminations[i], truncations[i]) == (terminated, truncated)
            ended[i] = terminated or truncated
            episodes += ended[i]
    assert episodes >= N  # every sub-env ended at least once, so autoresets were compared too
    vec.close()


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_observations_rewards_and_infos_match_gymnasiums_sync_vector_env(mode):
    # Rule: the batch, the flags and the vector infos (arrays and "_key" masks, final_obs / final_info in SameStep)
    # are exactly what Gymnasium's own SyncVectorEnv returns over the same sub-envs.
    make = partial(gym.make, task_id("memory-tight"), max_episode_steps=LIMIT)
    ours = ServingVectorEnv([make] * N, autoreset_mode=mode)
    theirs = SyncVectorEnv([make] * N, autoreset_mode=mode)
    a, b = ours.reset(seed=3), theirs.reset(seed=3)
    assert _equal(a[0], b[0]) and _infos_equal(a[1], b[1])
    finals = 0
    for action in _actions(ours.action_space, 2 * LIMIT + 5, seed=9):
        a, b = ours.step(action), theirs.step(action)
        for x, y in zip(a[:4], b[:4], strict=True):
            assert _equal(x, y)
        assert _infos_equal(a[4], b[4])
        finals += int(a[4].get("_final_obs", np.zeros(N, bool)).sum())
    assert (finals > 0) == (mode == AutoresetMode.SAME_STEP)
    assert ours.observation_space == theirs.observation_space and ours.action_space == theirs.action_space
    assert ours.metadata["autoreset_mode"] == mode


def _infos_equal(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, dict):
            if not _infos_equal(x, y):
                return False
        elif x.dtype == object:
            if not all(_equal(u, v) if u is not None else v is None for u, v in zip(x, y, strict=True)):
                return False
        elif not np.array_equal(x, y) or x.dtype.kind != np.asarray(y).dtype.kind:
            return False
    return True


def test_make_vec_uses_the_vector_entry_point_and_batches_the_spaces():
    vec = gym.make_vec(task_id("memory-tight"), num_envs=4, flat_obs=True)  # the registered default mode
    assert isinstance(vec, ServingVectorEnv) and vec.num_envs == 4
    single = gym.make(task_id("memory-tight"), flat_obs=True)
    assert vec.single_observation_space == single.observation_space
    assert vec.observation_space.shape == (4, *single.observation_space.shape)
    assert vec.action_space.shape == (4, *single.action_space.shape)
    obs, info = vec.reset(seed=0)
    assert obs in vec.observation_space and obs.dtype == np.float32
    assert info["_num_waiting"].all() and info["num_waiting"].dtype == np.int64
    assert vec.get_attr("queue_window") == (32,) * 4
    masks = vec.call("action_masks")
    assert len(masks) == 4 and masks[0].shape == (32 * 33,)


def test_copy_false_returns_the_buffer_the_next_step_overwrites_and_copy_true_does_not():
    shared = make_serving_vector_env(2, task="memory-tight", flat_obs=True, copy=False)
    first, _ = shared.reset(seed=0)
    shared.step(np.ones((2, 32), dtype=np.int64))
    assert first is shared.observations
    copied = make_serving_vector_env(2, task="memory-tight", flat_obs=True)
    first, _ = copied.reset(seed=0)
    before = first.copy()
    second = copied.step(np.ones((2, 32), dtype=np.int64))[0]
    assert np.array_equal(first, before) and not np.array_equal(first, second)


def test_gymnasiums_episode_statistics_wrapper_sums_the_rewards_of_each_episode():
    vec = gym.wrappers.vector.RecordEpisodeStatistics(servegym.make_vec(task_id("memory-tight"), num_envs=2,
                                                                        max_episode_steps=LIMIT))
    vec.reset(seed=1)
    returns, seen = np.zeros(2), []
    for action in _actions(vec.action_space, LIMIT + 2, seed=2):
        _, rewards, terminations, truncations, info = vec.step(action)
        returns += rewards
        for i in np.flatnonzero(terminations | truncations):
            assert info["episode"]["r"][i] == pytest.approx(returns[i], rel=1e-6)
            assert info["episode"]["l"][i] == LIMIT
            seen.append(i)
            returns[i] = 0.0
    assert sorted(seen) == [0, 1]


def test_bad_input_is_refused_with_a_clear_error():
    vec = make_serving_vector_env(2, task="memory-tight")
    with pytest.raises(RuntimeError, match="call reset"):
        vec.step(np.zeros((2, 32), dtype=np.int64))
    vec.reset(seed=0)
    with pytest.raises(ValueError, match=r"actions must have shape \(2, 32\).*got \(32,\)"):
        vec.step(np.zeros(32, dtype=np.int64))
    with pytest.raises(ValueError, match="one seed per sub-env"):
        vec.reset(seed=[1, 2, 3])
    for bad in (0, -1, 2.5, True, 1_025):  # 1,025: past the shared count rule's 1,024 envs, before any is built
        with pytest.raises(ValueError, match="num_envs must be a positive integer"):
            make_serving_vector_env(bad)
    with pytest.raises(ValueError, match="sub-env 1's spaces differ"):
        ServingVectorEnv([partial(gym.make, ENV_ID, queue_window=8), partial(gym.make, ENV_ID, queue_window=16)])
    with pytest.raises(ValueError, match="at least one sub-env"):
        ServingVectorEnv([])
    shared = gym.make(ENV_ID)
    with pytest.raises(ValueError, match="the same env instance"):
        ServingVectorEnv([lambda: shared] * 2)


def test_vector_info_lays_out_keys_masks_and_dtypes_as_gymnasium_does():
    # Hand-built: env 0 sets a (int) and b (float), env 2 sets a and c (a list), env 1 sets nothing.
    info = vector_info([{"a": 1, "b": 0.5}, {}, {"a": 3, "c": [1, 2], "d": {"x": True}}])
    assert info["a"].tolist() == [1, 0, 3] and info["a"].dtype == np.int64
    assert info["_a"].tolist() == [True, False, True]
    assert info["b"].tolist() == [0.5, 0.0, 0.0] and info["b"].dtype == np.float64
    assert info["c"].dtype == object and info["c"][2] == [1, 2] and info["c"][0] is None
    assert info["d"]["x"].tolist() == [False, False, True] and info["_d"].tolist() == [False, False, True]


def test_sb3_native_vec_env_gives_dummy_vec_envs_transitions_in_the_score_mode():
    # Rule: the training path's VecEnv is DummyVecEnv's semantics (same-step reset, terminal_observation,
    # TimeLimit.truncated, reset seeds), so a run trains on the same transitions either way.
    from stable_baselines3.common.vec_env import DummyVecEnv

    from servegym.rl.train import make_training_env
    from servegym.rl.vec_env import NativeVecEnv

    kwargs = {"task": "memory-tight", "decision_steps": True}
    factories = [partial(make_training_env, kwargs, "score", LIMIT, (7 + i, N)) for i in range(N)]
    ours, theirs = NativeVecEnv(factories), DummyVecEnv(factories)
    ours.seed(3)
    theirs.seed(3)
    assert _equal(ours.reset(), theirs.reset())
    ends = 0
    for action in _actions(gym.vector.utils.batch_space(ours.action_space, N), 2 * LIMIT, seed=4):
        a, b = ours.step(action), theirs.step(action)
        assert _equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and np.array_equal(a[2], b[2])
        assert a[1].dtype == b[1].dtype == np.float32
        for x, y in zip(a[3], b[3], strict=True):
            assert x.keys() == y.keys() and x["TimeLimit.truncated"] == y["TimeLimit.truncated"]
            if "terminal_observation" in x:
                ends += 1
                assert _equal(x["terminal_observation"], y["terminal_observation"])
                assert x["episode"]["r"] == y["episode"]["r"] and x["episode"]["l"] == y["episode"]["l"]
    assert ends >= N
    assert ours.reset_infos[0].keys() == theirs.reset_infos[0].keys()
    assert ours.env_is_wrapped(gym.wrappers.TimeLimit) == theirs.env_is_wrapped(gym.wrappers.TimeLimit)
    ours.close()


def test_a_reset_after_an_episode_ended_clears_the_pending_autoreset():
    # Rule: reset() starts every sub-env afresh; the next step steps them (it does not reset the one whose episode
    # had just ended a second time, which would ignore its action and return reward 0).
    vec = make_serving_vector_env(2, max_episode_steps=3, task="memory-tight", flat_obs=True)
    single = gym.make(task_id("memory-tight"), max_episode_steps=3, flat_obs=True)
    vec.reset(seed=0)
    action = np.ones((2, 32), dtype=np.int64)
    for _ in range(3):
        *_, truncations, _ = vec.step(action)
    assert truncations.all()
    vec.reset(seed=4)
    single.reset(seed=4)
    obs, rewards, *_ = vec.step(action)
    expected, reward, *_ = single.step(action[0])
    assert np.array_equal(obs[0], expected) and rewards[0] == reward != 0.0


def test_disabled_autoreset_leaves_ended_episodes_to_a_masked_reset_as_sync_vector_env_does():
    # Rule: with autoreset_mode="Disabled" an ended sub-env is not stepped again until the caller resets it;
    # reset(options={"reset_mask": mask}) resets the masked ones alone, with SyncVectorEnv's observations and infos.
    make = partial(gym.make, task_id("memory-tight"), flat_obs=True)
    limits = [partial(gym.make, task_id("memory-tight"), flat_obs=True, max_episode_steps=k) for k in (2, 50)]
    ours = ServingVectorEnv(limits, autoreset_mode="Disabled")
    theirs = SyncVectorEnv(limits, autoreset_mode="Disabled")
    ours.reset(seed=0)
    theirs.reset(seed=0)
    action = np.ones((2, 32), dtype=np.int64)
    for _ in range(2):
        a, b = ours.step(action), theirs.step(action)
    assert a[3].tolist() == b[3].tolist() == [True, False]
    with pytest.raises(RuntimeError, match=r"sub-env\(s\) \[0\] must be reset"):
        ours.step(action)
    mask = np.array([True, False])
    a, b = ours.reset(seed=7, options={"reset_mask": mask}), theirs.reset(seed=7, options={"reset_mask": mask})
    assert _equal(a[0], b[0]) and _infos_equal(a[1], b[1]) and a[1]["_num_waiting"].tolist() == [True, False]
    a, b = ours.step(action), theirs.step(action)
    for x, y in zip(a[:4], b[:4], strict=True):
        assert _equal(x, y)
    for bad, error, message in ((np.array([1, 0]), TypeError, "numpy bool array"),  # Gymnasium's errors
                                (np.array([True]), ValueError, r"shape \(2,\)"),
                                (np.array([False, False]), ValueError, "selects no")):
        with pytest.raises(error, match=message):
            ours.reset(options={"reset_mask": bad})
    assert make().observation_space == ours.single_observation_space
