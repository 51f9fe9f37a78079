"""The learning agents' action bounds (issue 48, item 9): the token window's log mapping and its clipping, counts
past the queue, too-long actions, the score and params modes' floors and clipping, and count-mode masks.

Each case hands the mapping a crafted observation (a real one from ``env.reset`` with chosen features and rows
written in) whose admissions are computed by hand. Lengths are known (``output_lo = output_hi``), so a request's
remaining tokens are its ``output_hi`` minus what it generated.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest

from servegym.envs import ENGINE_INDEX, QUEUE_FEATURES, RUNNING_INDEX, queue_matrix, running_matrix
from servegym.envs.actions import count_action_masks
from servegym.policies import make_policy
from servegym.rl.wrappers import (
    AdmitCount,
    RankAdmit,
    ScoreAdmit,
    TokenWindow,
    count_action,
    params_action,
    score_action,
    state_params,
    window_action,
)
from servegym.runner import make_env
from tests.conftest import fixed, flat_profile

W = 8  # queue window


def base_env(max_num_seqs: int = 16, num_kv_blocks: int = 12_000, block_size: int = 16, waiting: int = 1):
    """An env on the flat test profile with known lengths and ``waiting`` requests queued at reset."""
    workload = fixed([0.0] * waiting, [4] * waiting, [5] * waiting)
    return make_env(workload=workload, profile=flat_profile(num_kv_blocks=num_kv_blocks, block_size=block_size),
                    engine={"length_mode": "known", "max_num_seqs": max_num_seqs}, queue_window=W)


def crafted(env, queue=(), running=()):
    """``env``'s reset observation with the queue and the running batch replaced (dicts of feature values), the
    cache empty but for what ``running`` holds (its blocks are not counted: these cases never fill it)."""
    obs, _ = env.reset(seed=0)
    out = {k: v.copy() for k, v in obs.items()}
    rows = queue_matrix(out)
    rows[:] = 0.0
    for i, row in enumerate(queue):
        rows[i] = [row.get(name, 0.0) for name in QUEUE_FEATURES]
    batch = running_matrix(out)
    batch[:] = 0.0
    for i, row in enumerate(running):
        for name, value in row.items():
            batch[i, RUNNING_INDEX[name]] = value
    out["engine"][ENGINE_INDEX["num_waiting"]] = len(queue)
    out["engine"][ENGINE_INDEX["num_running"]] = len(running)
    out["engine"][ENGINE_INDEX["kv_free_frac"]] = 1.0
    return out


def request(prompt: float, output: float, generated: float = 0.0) -> dict[str, float]:
    return {"num_prompt_tokens": prompt, "output_lo": output, "output_hi": output, "num_generated": generated}


def admitted(action: np.ndarray) -> int:
    return int(np.count_nonzero(action))


# ---------------------------------------------------------------------------------------------- token window

WANTS = [1, 20, 70, 200, 16, 600, 90]
"""Remaining tokens of seven queued requests. With a running request 9 tokens from its end, the load after each
admission is 9 + the running sum: 10, 30, 100, 300, 316, 916, 1006."""
RUNNING = [{"num_prompt_tokens": 4, "num_kv_tokens": 45, "num_generated": 41, "output_lo": 50, "output_hi": 50}]


@pytest.mark.parametrize(("value", "count"), [
    (-1.0, 1),  # window 10 (the minimum): loads 10
    (-0.5, 2),  # window exp(log 10 + 0.25 log 100) = 31.6: 10, 30
    (0.0, 3),  # window 100 (the geometric middle; linear would be 505 and admit 5): 10, 30, 100
    (0.5, 5),  # window 316.2: ..., 300, 316
    (1.0, 6),  # window 1000 (the maximum): ..., 916; 1006 does not fit (without the running load it would)
    (5.0, 6),  # out of range: clipped to 1
    (-7.0, 1),  # out of range: clipped to -1
])
def test_the_window_maps_the_action_on_a_log_scale_and_clips_it(value, count):
    obs = crafted(base_env(), [request(4, want) for want in WANTS], RUNNING)
    action = window_action(obs, value, window_min=10.0, window_max=1000.0, unknown_output_tokens=None)
    assert action.tolist() == [1] * count + [0] * (W - count)


def test_a_request_that_ends_exactly_at_the_window_is_admitted():
    # window_min 1 at action -1 makes the window exactly 1.0 (exp(log 1) = exp(0), no rounding): the first request
    # wants exactly 1 token, so load + its want equals the window and it is admitted (the window's end is
    # included); the second (2 more) is not.
    obs = crafted(base_env(), [request(4, 1), request(4, 2)])
    action = window_action(obs, -1.0, window_min=1.0, window_max=1000.0, unknown_output_tokens=None)
    assert action.tolist() == [1] + [0] * (W - 1)


def test_the_window_never_admits_past_the_free_slots():
    # Four sequence slots, one taken: at most three admissions whatever the window.
    obs = crafted(base_env(max_num_seqs=4), [request(4, want) for want in WANTS], RUNNING)
    assert admitted(window_action(obs, 1.0, 10.0, 1000.0, None)) == 3


def test_the_window_wrapper_reads_the_first_value_and_refuses_what_is_not_finite():
    env = TokenWindow(base_env(), window_min=10.0, window_max=1000.0, unknown_output_tokens=None)
    obs = crafted(base_env(), [request(4, want) for want in WANTS], RUNNING)
    assert admitted(env.to_env_action(obs, np.array([0.0, 1.0], dtype=np.float32))) == 3  # a too-long action
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match="window action must be finite"):
            env.to_env_action(obs, np.array([bad]))
    for low, high in ((0.0, 10.0), (10.0, 10.0), (20.0, 10.0)):
        with pytest.raises(ValueError, match="need 0 < window_min < window_max"):
            TokenWindow(base_env(), window_min=low, window_max=high)


# ---------------------------------------------------------------------------------------------- counts and masks


def test_a_count_past_the_visible_queue_admits_the_visible_queue():
    obs = crafted(base_env(), [request(4, 5)] * 3)
    assert count_action(obs, 2).tolist() == [1, 1, 0, 0, 0, 0, 0, 0]
    assert count_action(obs, 7).tolist() == [1, 1, 1, 0, 0, 0, 0, 0]  # three visible: the rest stay empty
    assert count_action(obs, 0).tolist() == [0] * W
    wrapped = AdmitCount(base_env(), max_admit=8)
    assert wrapped.to_env_action(obs, np.array([2, 7])).tolist() == [1, 1, 0, 0, 0, 0, 0, 0]  # the first value
    with pytest.raises(ValueError, match="max_admit must be >= 1"):
        AdmitCount(base_env(), max_admit=0)


def test_a_negative_count_is_refused():
    obs = crafted(base_env(), [request(4, 5)] * 3)
    with pytest.raises(ValueError, match="count"):
        count_action(obs, -1)


def test_a_negative_rank_action_is_refused():
    obs = crafted(base_env(), [request(4, 5)] * 3)
    with pytest.raises(ValueError, match="rank"):
        RankAdmit(base_env()).to_env_action(obs, np.array([-1, 5]))


def test_count_masks_allow_counts_up_to_the_visible_queue():
    # Discrete(9) counts 0..8: with 3 visible, 0..3 allowed; with none, only 0; with more than 8, all.
    assert count_action_masks(9, 3).tolist() == [True] * 4 + [False] * 5
    assert count_action_masks(9, 0).tolist() == [True] + [False] * 8
    assert count_action_masks(9, 12).tolist() == [True] * 9


def test_the_count_wrapper_masks_by_the_visible_window_not_the_whole_queue():
    # Six requests wait, the window shows four: counts 0..4 of 0..8 are allowed.
    env = AdmitCount(make_env(workload=fixed([0.0] * 6, [4] * 6, [5] * 6), profile=flat_profile(), queue_window=4),
                     max_admit=8)
    env.reset(seed=0)
    assert env.unwrapped.engine.waiting.size == 6
    assert env.action_masks().tolist() == [True] * 5 + [False] * 4


def test_a_count_agent_masks_by_its_observation():
    pytest.importorskip("stable_baselines3")
    from servegym.rl.agent import RLPolicy

    agent = RLPolicy.__new__(RLPolicy)  # the mask needs only the mode and the action space, not a trained model
    agent.mode, agent.model = "count", type("Model", (), {"action_space": gym.spaces.Discrete(6)})()
    obs = crafted(base_env(), [request(4, 5)] * 2)
    assert agent.masks(obs).tolist() == [True, True, True, False, False, False]


# ---------------------------------------------------------------------------------------------- score mode

FIVE = [request(100, 100)] * 5
"""Five requests of 100 prompt and 100 output tokens on a 1000-token cache (one-token blocks, no slack): admitted
together, k of them peak at k x (100 + 100) tokens, when they finish."""
SCORES = [0.1, 0.5, -0.2, 0.3, 0.0]
"""Slot scores: highest first is slots 1, 3, 0, 4, 2."""


@pytest.mark.parametrize(("target_value", "expected"), [
    (-1.0, [0, 1, 0, 0, 0, 0, 0, 0]),  # target 0.3 x 1000 = 300: one request (peak 200)
    (0.0, [3, 1, 0, 2, 4, 0, 0, 0]),  # target 0.9: four (peak 800)
    (1.0, [3, 1, 5, 2, 4, 0, 0, 0]),  # target 1.5: all five (peak 1000)
    (4.0, [3, 1, 5, 2, 4, 0, 0, 0]),  # clipped to 1
    (-4.0, [0, 1, 0, 0, 0, 0, 0, 0]),  # clipped to -1 (unclipped, the target would be negative: an error)
])
def test_the_score_modes_target_spans_its_range_and_clips(target_value, expected):
    obs = crafted(base_env(num_kv_blocks=1000, block_size=1), FIVE)
    action = np.array([*SCORES, 0.0, 0.0, 0.0, target_value])
    assert score_action(obs, action).tolist() == expected


@pytest.mark.parametrize("target_value", [1.0, 4.0])
def test_the_score_modes_largest_target_is_one_and_a_half_caches(target_value):
    # Eight such requests peak at 1600 tokens: the target 1.5 x 1000 admits seven (1400); 4 is clipped to 1, the same
    # (unclipped it would be 3.3 x 1000 and admit all eight). Equal scores: queue order.
    obs = crafted(base_env(num_kv_blocks=1000, block_size=1), [request(100, 100)] * W)
    assert score_action(obs, np.array([0.0] * W + [target_value])).tolist() == [1, 2, 3, 4, 5, 6, 7, 0]


def test_a_score_action_whose_target_is_not_a_number_is_refused():
    # NaN is not clipped into the range (it would act as -1, the smallest target): it stays NaN and is refused.
    obs = crafted(base_env(num_kv_blocks=1000, block_size=1), FIVE)
    with pytest.raises(ValueError, match="memory_target finite"):
        score_action(obs, np.array([*SCORES, 0.0, 0.0, 0.0, math.nan]))


def test_a_residual_beyond_the_action_range_is_clipped_to_it():
    # Base target 0.5; a residual target value of 4 counts as 1: 0.5 + 1 x 0.2 x (1.5 - 0.3) / 2 = 0.62 (620
    # tokens), three requests (peak 600); unclipped it would be 0.98 and admit four (peak 800). Equal base scores
    # and zero slot residuals keep queue order.
    obs = crafted(base_env(num_kv_blocks=1000, block_size=1), FIVE)
    wrapper = ScoreAdmit(base_env(num_kv_blocks=1000, block_size=1), base={"target_base": 0.5})
    action = np.zeros(W + 1)
    action[W] = 4.0
    assert wrapper.to_env_action(obs, action).tolist() == [1, 2, 3, 0, 0, 0, 0, 0]


def test_a_score_action_of_the_wrong_length_is_refused():
    obs = crafted(base_env(num_kv_blocks=1000, block_size=1), FIVE)
    for size in (W, W + 2):
        with pytest.raises(ValueError, match=rf"a score action has {W + 1} values .* got {size}"):
            score_action(obs, np.zeros(size))


def test_a_residual_memory_target_is_floored_at_5_percent():
    # Base scorer target 0.05; a residual of -1 moves it by -1 x 0.2 x (1.5 - 0.3) / 2 = -0.12, to -0.07: floored
    # at 0.05 (50 tokens), where no request fits (peak 200), instead of an invalid target.
    obs = crafted(base_env(num_kv_blocks=1000, block_size=1), FIVE)
    wrapper = ScoreAdmit(base_env(num_kv_blocks=1000, block_size=1), base={"target_base": 0.05})
    action = np.zeros(W + 1)
    action[W] = -1.0
    assert wrapper.to_env_action(obs, action).tolist() == [0] * W
    # With target_base 0.5 the same residual gives 0.38 (380 tokens): one request, the best scored (scorer's
    # scores: all equal, so queue order: slot 0).
    wrapper = ScoreAdmit(base_env(num_kv_blocks=1000, block_size=1), base={"target_base": 0.5})
    assert wrapper.to_env_action(obs, action).tolist() == [1, 0, 0, 0, 0, 0, 0, 0]


# ---------------------------------------------------------------------------------------------- params mode


def test_params_floor_weights_at_zero_and_the_target_at_5_percent_and_clip_the_slope():
    base = make_policy("scorer", output_weight=0.0, wait_weight=0.0, target_base=0.1, target_slope=0.9)
    # Action -1 scales 1 + w by exp(-0.7): (1 + 0) x 0.4966 - 1 < 0, floored at 0; target 0.1 - 0.2 floored at 0.05;
    # slope 0.9 + 0.2 clipped at 1.
    assert state_params(base, np.array([-1.0, -1.0, -1.0, 1.0])) == pytest.approx((0.0, 0.0, 0.05, 1.0), abs=1e-12)
    # Out-of-range values are clipped to [-1, 1] first: 3 -> 1 (1 x e^0.7 - 1), 0.5 (e^0.35 - 1), -3 -> -1.
    assert state_params(base, np.array([3.0, 0.5, 0.0, -3.0])) == pytest.approx(
        (math.exp(0.7) - 1.0, math.exp(0.35) - 1.0, 0.1, 0.7), abs=1e-12)
    # Action 0 is the base exactly.
    assert state_params(base, np.zeros(4)) == pytest.approx((0.0, 0.0, 0.1, 0.9), abs=1e-12)


def test_a_params_action_of_the_wrong_length_or_not_finite_is_refused():
    base = make_policy("scorer")
    for bad in (np.zeros(3), np.zeros(5), np.array([0.0, math.nan, 0.0, 0.0]), np.array([math.inf, 0, 0, 0])):
        with pytest.raises(ValueError, match="a params action is 4 finite values"):
            state_params(base, bad)


def test_a_params_action_admits_with_the_moved_parameters():
    # Base target 0.5 (500 tokens: two of FIVE, peak 400); the action's target value +1 moves it to 0.7 (700:
    # three, peak 600). Scores are all equal (same prompt and output), so queue order.
    obs = crafted(base_env(num_kv_blocks=1000, block_size=1), FIVE)
    base = make_policy("scorer", target_base=0.5)
    assert params_action(obs, np.zeros(4), base).tolist() == [1, 2, 0, 0, 0, 0, 0, 0]
    assert params_action(obs, np.array([0.0, 0.0, 1.0, 0.0]), base).tolist() == [1, 2, 3, 0, 0, 0, 0, 0]
