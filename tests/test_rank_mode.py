"""The rank action mode spans FCFS and MC-SF: its corner actions reproduce them exactly."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from servegym import ENV_ID
from servegym.policies import make_policy
from servegym.rl.wrappers import RANK_MEMORY_TARGETS, RANK_ORDERS, RankAdmit, rank_action
from servegym.runner import serving_env


def _finish_times(env, act):
    obs, _ = env.reset(seed=4)
    done = False
    while not done:
        obs, _, terminated, truncated, _ = env.step(act(obs))
        done = terminated or truncated
    return serving_env(env).cluster.log.finish_s.copy()


@pytest.mark.parametrize(("policy", "order", "target"), [("fcfs", "arrival", np.inf),
                                                         ("mc-sf", "shortest_output", 1.0)])
def test_corner_actions_reproduce_the_hand_coded_policy(policy, order, target):
    o, t = RANK_ORDERS.index(order), RANK_MEMORY_TARGETS.index(target)
    make = lambda: gym.make(ENV_ID, task="memory-tight", max_steps=3000)  # noqa: E731
    reference = make_policy(policy)
    expected = _finish_times(make(), reference.act)
    got = _finish_times(make(), lambda obs: rank_action(obs, o, t))
    np.testing.assert_array_equal(got, expected)


def test_orders_and_targets_change_what_is_admitted():
    env = gym.make(ENV_ID, task="memory-tight", max_steps=3000)
    obs, _ = env.reset(seed=1)
    while (obs["queue"].reshape(32, -1)[:, 0] > 0).sum() < 6:  # let a queue build up under no admissions
        obs, *_ = env.step(np.zeros(32, dtype=np.int64))
    prompts = obs["queue"].reshape(32, -1)[:, 0]
    fifo = rank_action(obs, RANK_ORDERS.index("arrival"), len(RANK_MEMORY_TARGETS) - 1)
    short = rank_action(obs, RANK_ORDERS.index("shortest_prompt"), len(RANK_MEMORY_TARGETS) - 1)
    first = int(np.flatnonzero(short == 1)[0])
    assert prompts[first] == prompts[prompts > 0].min()  # rank 1 goes to the shortest prompt
    assert fifo[0] == 1
    tight = rank_action(obs, RANK_ORDERS.index("arrival"), 0)
    assert np.count_nonzero(tight) <= np.count_nonzero(fifo)


@pytest.mark.filterwarnings("ignore:requests have waited", "ignore:.*different from the unwrapped")
def test_rank_wrapper_steps_and_checks():
    from gymnasium.utils.env_checker import check_env

    env = RankAdmit(gym.make(ENV_ID, task="memory-tight").unwrapped)
    check_env(env, skip_render_check=True)
    assert env.action_space.nvec.tolist() == [len(RANK_ORDERS), len(RANK_MEMORY_TARGETS)]


def test_mc_sf_parameters_match_the_rank_rule_and_matter():
    make = lambda: gym.make(ENV_ID, task="memory-tight", max_steps=3000)  # noqa: E731
    tuned = make_policy("mc-sf", order="total", memory_target=0.85)
    got = _finish_times(make(), tuned.act)
    o, t = RANK_ORDERS.index("shortest_total"), RANK_MEMORY_TARGETS.index(0.85)
    np.testing.assert_array_equal(got, _finish_times(make(), lambda obs: rank_action(obs, o, t)))
    paper = _finish_times(make(), make_policy("mc-sf").act)
    assert not np.array_equal(np.nan_to_num(got), np.nan_to_num(paper))
    with pytest.raises(ValueError, match="order must be one of"):
        make_policy("mc-sf", order="longest")


@pytest.mark.slow
def test_a_rank_agent_records_its_grid_and_a_changed_grid_is_refused(tmp_path):
    import json

    pytest.importorskip("stable_baselines3")
    from servegym.rl.train import TrainConfig, train
    from servegym.rl.wrappers import rank_grid

    cfg = TrainConfig(algo="ppo", mode="rank", task="memory-tight", timesteps=128, n_envs=1, max_episode_steps=60,
                      eval_freq=128, eval_episodes=1, hyperparams={"n_steps": 64, "batch_size": 64, "n_epochs": 1},
                      out=str(tmp_path))
    run = train(cfg, progress=False, subprocess=False)
    config = json.loads((run / "config.json").read_text())
    assert config["rank_grid"] == rank_grid()
    assert make_policy(f"rl:{run}").mode == "rank"
    config["rank_grid"]["memory_targets"][0] = 0.123
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="retrain it"):
        make_policy(f"rl:{run}")
