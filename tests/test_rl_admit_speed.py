"""The batched slot distributions of the ``admit`` mode: same maths as SB3 / sb3-contrib, masks respected,
tiny training runs whose models drive the env directly and through ``RLPolicy``."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("sb3_contrib")

import gymnasium as gym
import torch as th
from gymnasium import spaces
from sb3_contrib.common.maskable.distributions import MaskableMultiCategoricalDistribution
from stable_baselines3.common.distributions import MultiCategoricalDistribution

from servegym import ENV_ID
from servegym.rl import AdmitMask
from servegym.rl.agent import RLPolicy
from servegym.rl.fast_dist import (
    MaskableSlotCategoricalDistribution,
    MaskableSlotMultiInputPolicy,
    SlotCategoricalDistribution,
    SlotMultiInputPolicy,
    policy_for,
    uniform_slots,
)
from servegym.rl.train import algorithm_class

TINY = {"ppo": {"n_steps": 64, "batch_size": 64, "n_epochs": 1}, "a2c": {"n_steps": 16},
        "maskable-ppo": {"n_steps": 64, "batch_size": 64, "n_epochs": 1}}
SLOT_POLICY = {"ppo": SlotMultiInputPolicy, "a2c": SlotMultiInputPolicy, "maskable-ppo": MaskableSlotMultiInputPolicy}


def _batch(slots: int, choices: int, batch: int = 40, seed: int = 0) -> tuple[th.Tensor, np.ndarray, th.Tensor]:
    """Random logits, masks in the admit layout (choice 0 always allowed, the rest on the first k slots), and
    actions that respect the masks."""
    rng = np.random.default_rng(seed)
    logits = th.as_tensor(rng.normal(scale=3.0, size=(batch, slots * choices)), dtype=th.float32)
    masks = np.ones((batch, slots, choices), dtype=bool)
    for row, visible in enumerate(rng.integers(0, slots + 1, batch)):
        masks[row, visible:, 1:] = False
    actions = rng.integers(0, choices, (batch, slots)) * masks[:, :, 1]
    return logits, masks.reshape(batch, -1), th.as_tensor(actions, dtype=th.float32)


def _admit_env(**kwargs: object) -> AdmitMask:
    return AdmitMask(gym.make(ENV_ID, workload="low", **kwargs).unwrapped)


@pytest.mark.parametrize(("slots", "choices"), [(32, 2), (5, 3)])
def test_slot_distribution_matches_sb3(slots, choices):
    logits, _, actions = _batch(slots, choices)
    reference = MultiCategoricalDistribution([choices] * slots).proba_distribution(logits)
    fast = SlotCategoricalDistribution([choices] * slots).proba_distribution(logits)
    th.testing.assert_close(fast.log_prob(actions), reference.log_prob(actions))
    th.testing.assert_close(fast.entropy(), reference.entropy())
    assert th.equal(fast.mode(), reference.mode())
    assert fast.sample().shape == (logits.shape[0], slots)


@pytest.mark.parametrize(("slots", "choices"), [(32, 2), (5, 3)])
def test_masked_slot_distribution_matches_sb3_contrib(slots, choices):
    logits, masks, actions = _batch(slots, choices)
    reference = MaskableMultiCategoricalDistribution([choices] * slots).proba_distribution(logits)
    fast = MaskableSlotCategoricalDistribution([choices] * slots).proba_distribution(logits)
    reference.apply_masking(masks)
    fast.apply_masking(masks)
    th.testing.assert_close(fast.log_prob(actions), reference.log_prob(actions))
    th.testing.assert_close(fast.entropy(), reference.entropy())
    assert th.equal(fast.mode(), reference.mode())
    reference.apply_masking(None)
    fast.apply_masking(None)
    th.testing.assert_close(fast.log_prob(actions), reference.log_prob(actions))
    th.testing.assert_close(fast.entropy(), reference.entropy())


def test_masked_choices_are_never_sampled_and_samples_follow_the_probabilities():
    th.manual_seed(0)
    logits, masks, _ = _batch(32, 2, batch=8)
    fast = MaskableSlotCategoricalDistribution([2] * 32).proba_distribution(logits)
    fast.apply_masking(masks)
    draws = th.stack([fast.sample() for _ in range(2000)]).float()
    allowed = th.as_tensor(masks.reshape(8, 32, 2)[:, :, 1])
    assert not draws[:, ~allowed].any()
    expected = th.softmax(logits.reshape(8, 32, 2), -1)[:, :, 1] * allowed
    assert th.allclose(draws.mean(0), expected, atol=0.05)


def test_unequal_sub_spaces_are_refused_and_keep_the_stock_policy():
    with pytest.raises(ValueError, match="equal sub-space sizes"):
        SlotCategoricalDistribution([2, 3])
    assert uniform_slots(spaces.MultiDiscrete([2, 3])) is None
    assert policy_for("ppo", spaces.MultiDiscrete([2, 3])) == "MultiInputPolicy"


def test_policy_for_picks_the_slot_policy_only_for_the_admit_mode():
    admit = _admit_env().action_space
    assert uniform_slots(admit) == (admit.nvec.size, 2)
    assert policy_for("ppo", admit) is SlotMultiInputPolicy
    assert policy_for("a2c", admit) is SlotMultiInputPolicy
    assert policy_for("maskable-ppo", admit) is MaskableSlotMultiInputPolicy
    for algo, space in [("ppo", spaces.Discrete(9)), ("maskable-ppo", spaces.Discrete(9)),
                        ("ppo", spaces.Box(-1.0, 1.0, (1,))), ("dqn", admit)]:
        assert policy_for(algo, space) == "MultiInputPolicy"


def _drive(model, env: AdmitMask, masked: bool, steps: int = 200) -> int:
    """Step ``env`` with the model's actions; return how many requests it admitted."""
    obs, _ = env.reset(seed=1)
    admitted = 0
    for _ in range(steps):
        mask = env.action_masks()
        action, _ = model.predict(obs, deterministic=False, **({"action_masks": mask} if masked else {}))
        assert env.action_space.contains(action)
        if masked:
            assert np.all(mask.reshape(-1, 2)[np.arange(action.size), action])
        admitted += int(action.sum())
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            obs, _ = env.reset()
    return admitted


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ppo", "a2c", "maskable-ppo"])
def test_tiny_training_in_admit_mode_drives_the_env(algo, tmp_path):
    env = _admit_env(max_episode_steps=150)
    model = algorithm_class(algo)(policy_for(algo, env.action_space), env, seed=0, **TINY[algo])
    model.learn(128)
    assert isinstance(model.policy, SLOT_POLICY[algo])
    masked = algo == "maskable-ppo"
    strict = _admit_env(strict_actions=True, max_episode_steps=10**6)  # raises on an admit of an empty slot
    if masked:
        assert _drive(model, strict, masked=True) > 0
    else:
        _drive(model, _admit_env(max_episode_steps=10**6), masked=False)

    model.save(tmp_path / "model.zip")
    loaded = algorithm_class(algo).load(tmp_path / "model.zip", device="cpu")
    assert isinstance(loaded.policy, SLOT_POLICY[algo])
    obs, _ = env.reset(seed=2)
    kwargs = {"action_masks": env.action_masks()} if masked else {}
    np.testing.assert_array_equal(model.predict(obs, deterministic=True, **kwargs)[0],
                                  loaded.predict(obs, deterministic=True, **kwargs)[0])


def test_rl_policy_drives_the_unwrapped_env_with_a_slot_model(tmp_path):
    env = _admit_env(max_episode_steps=150)
    algo = "maskable-ppo"
    model = algorithm_class(algo)(policy_for(algo, env.action_space), env, seed=0, **TINY[algo])
    model.learn(64)
    model.save(tmp_path / "model.zip")
    (tmp_path / "config.json").write_text(json.dumps({"algo": "maskable-ppo", "mode": "admit", "normalize": False,
                                                      "engine": {}}))
    policy = RLPolicy(tmp_path, which="final")
    unwrapped = gym.make(ENV_ID, workload="low", strict_actions=True).unwrapped
    obs, _ = unwrapped.reset(seed=0)
    for _ in range(100):
        action = policy.act(obs)
        assert policy.masks(obs).shape == (2 * unwrapped.queue_window,)
        obs, _, terminated, truncated, _ = unwrapped.step(action)
        if terminated or truncated:
            break
