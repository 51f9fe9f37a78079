"""A routing agent (``servegym train --task cluster-routing``): the ``route`` action mode trains PPO on the task's
routing env, and the run plays as ``make_policy("rl:RUN")``, a router (``decision == "route"``) that returns a
replica for each arrival; the ``route`` mode is a routing task's only mode and no admission task's."""

from __future__ import annotations

import json
import pickle

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("sb3_contrib")

from servegym import ENV_ID
from servegym.cli import main
from servegym.policies import make_policy
from servegym.rl.config import TrainConfig
from servegym.rl.train import make_training_env, train
from servegym.rl.wrappers import RouteReplica, route_masks, route_observation

TASK = "cluster-routing"
TINY = {"n_steps": 128, "batch_size": 64, "n_epochs": 1}


@pytest.fixture(scope="module")
def route_run(tmp_path_factory):
    """PPO trained 256 steps on cluster-routing (two updates, one validation episode: a few seconds)."""
    cfg = TrainConfig(task=TASK, timesteps=256, n_envs=1, eval_freq=256, eval_episodes=1, checkpoint_freq=256,
                      hyperparams=TINY, out=str(tmp_path_factory.mktemp("runs")))
    return train(cfg, progress=False, subprocess=False)


def test_a_routing_task_trains_in_the_route_mode(route_run):
    assert route_run.name == "Serving-v2__ppo__route__cluster-routing__s0"
    config = json.loads((route_run / "config.json").read_text())
    assert config["mode"] == "route" and config["status"] == "finished" and config["timesteps_done"] >= 256
    assert np.isfinite(config["best_mean_reward"]) and config["best_mean_reward"] < 0  # latency: minus seconds
    for name in ("best_model.zip", "best_vecnormalize.pkl", "model.zip", "vecnormalize.pkl", "eval.csv"):
        assert (route_run / name).is_file(), name
    stats = pickle.loads((route_run / "best_vecnormalize.pkl").read_bytes())
    assert stats.norm_reward and not stats.norm_obs  # the replica-shared network scales the raw counts itself


def test_the_run_is_a_router_on_the_routing_env(route_run):
    policy = make_policy(f"rl:{route_run}")
    assert policy.decision == "route"
    env = gym.make(ENV_ID, task=TASK, split="test")
    flat = gym.make(ENV_ID, task=TASK, split="test", flat_obs=True)
    try:
        obs, _ = env.reset(seed=900_000)
        flat_obs, _ = flat.reset(seed=900_000)
        policy.reset()
        for _ in range(150):
            action = policy.act(obs)
            assert isinstance(action, np.int64) and 0 <= action < 8
            assert policy.act(flat_obs) == action  # the same agent on the flat observation
            assert env.unwrapped.action_masks()[action]
            np.testing.assert_array_equal(route_masks(obs, 8), env.unwrapped.action_masks())
            obs, reward, terminated, truncated, _ = env.step(action)
            flat_obs, flat_reward, *_ = flat.step(action)
            assert reward == flat_reward and np.isfinite(reward)
            assert not (terminated or truncated)
    finally:
        env.close()
        flat.close()


def test_an_admission_agent_still_decides_admission(tmp_path):
    from servegym.benchmark.bench import Entry, entry_decision

    cfg = TrainConfig(mode="count", workload="low", timesteps=64, n_envs=1, max_episode_steps=64, eval_freq=64,
                      eval_episodes=1, hyperparams={"n_steps": 64, "batch_size": 64, "n_epochs": 1}, out=str(tmp_path))
    run = train(cfg, progress=False, subprocess=False)
    assert make_policy(f"rl:{run}").decision == "admission"
    assert entry_decision(Entry("agent", f"rl:{run}")) == "admission"


def test_bench_plays_the_route_agent_on_routing_tasks_only(route_run):
    from servegym.benchmark.bench import entry_decision, make_entries, make_jobs, run_job

    (entry,) = make_entries((), (), [route_run])
    assert entry_decision(entry) == "route"
    jobs = make_jobs([TASK, "memory-tight"], [entry], seeds=[900_000])
    assert [job.task for job in jobs] == [TASK]
    row = run_job(jobs[0])
    assert np.isfinite(row.episode_return) and not row.truncated


def test_route_observation_is_the_flat_obs():
    env = gym.make(ENV_ID, task=TASK)
    flat = gym.make(ENV_ID, task=TASK, flat_obs=True)
    obs, _ = env.reset(seed=3)
    flat_obs, _ = flat.reset(seed=3)
    np.testing.assert_array_equal(route_observation(obs), flat_obs)
    np.testing.assert_array_equal(route_observation(flat_obs), flat_obs)
    wrapped = RouteReplica(env)
    assert wrapped.observation_space == flat.observation_space
    np.testing.assert_array_equal(wrapped.action_masks(), env.unwrapped.action_masks())
    obs, *_ = wrapped.step(np.array([2]))  # a vectorised env's action array
    assert obs.shape == flat.observation_space.shape


def test_the_training_env_is_the_routing_env():
    env = make_training_env(TrainConfig(task=TASK).env_kwargs(), "route", seeds=(0, 1))
    assert isinstance(env, RouteReplica) and env.action_space == gym.spaces.Discrete(8)
    obs, _ = env.reset()
    assert env.observation_space.contains(obs)


@pytest.mark.parametrize("algo", ["ppo", "a2c", "dqn", "maskable-ppo"])
def test_route_is_the_default_and_only_mode_of_a_routing_task(algo):
    assert TrainConfig(algo=algo, task=TASK).resolved_mode == "route"
    with pytest.raises(ValueError, match="its only action mode is 'route'"):
        TrainConfig(algo=algo, task=TASK, mode="count")


@pytest.mark.parametrize("where", [{"task": "memory-tight"}, {"workload": "low"}, {"task": "mixture"}])
def test_the_route_mode_is_refused_on_admission_tasks(where):
    with pytest.raises(ValueError, match="the 'route' mode routes arrivals on a routing task"):
        TrainConfig(mode="route", **where)


@pytest.mark.parametrize(("fields", "message"), [
    ({"algo": "sac"}, "sac cannot route"),
    ({"observation": "scaled", "normalize": False}, "use observation 'raw'"),
    ({"discount_half_life_s": 20.0}, "discount_half_life_s is not for the 'route' mode"),
    ({"reward_reference": "params.json"}, "reward_reference is not for the 'route' mode"),
])
def test_what_the_route_mode_cannot_combine_with(fields, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(task=TASK, **fields)


@pytest.mark.parametrize(("argv", "message"), [
    (["--task", TASK, "--mode", "count"], "task 'cluster-routing' decides which replica serves each arrival"),
    (["--task", "memory-tight", "--mode", "route"], "task 'memory-tight' decides admission"),
])
def test_the_command_line_refuses_a_wrong_mode_in_one_line(capsys, argv, message):
    status = main(["train", *argv, "--timesteps", "64", "--quiet"])
    out, err = capsys.readouterr()
    assert status == 2 and not out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("servegym: error: ") and message in lines[0], lines


def test_maskable_ppo_routes_with_the_env_masks(tmp_path):
    cfg = TrainConfig(algo="maskable-ppo", task=TASK, timesteps=128, n_envs=1, eval_freq=128, eval_episodes=1,
                      checkpoint_freq=128, hyperparams={"n_steps": 64, "batch_size": 64, "n_epochs": 1},
                      out=str(tmp_path))
    run = train(cfg, progress=False, subprocess=False)
    assert run.name == "Serving-v2__maskable-ppo__route__cluster-routing__s0"
    policy = make_policy(f"rl:{run}")
    env = gym.make(ENV_ID, task=TASK)
    obs, _ = env.reset(seed=100_000)
    for _ in range(50):
        action = policy.act(obs)
        assert env.unwrapped.action_masks()[action]
        obs, *_ = env.step(action)


def test_the_route_network_is_shared_across_replicas():
    """Permuting the replicas (the round-robin turn with them) permutes the logits: no replica is favoured."""
    import torch
    from stable_baselines3 import PPO

    from servegym.envs.routing import REPLICA_FEATURES, REQUEST_FEATURES
    from servegym.rl.route_policy import RoutePolicy

    env = RouteReplica(gym.make(ENV_ID, task=TASK))
    model = PPO(RoutePolicy, env, n_steps=64, batch_size=64, seed=0, device="cpu")
    obs, _ = env.reset(seed=5)
    for _ in range(40):  # some load on the replicas
        obs, *_ = env.step(np.int64(_ % 3))
    rows = obs[: 8 * len(REPLICA_FEATURES)].reshape(8, -1)
    request = obs[8 * len(REPLICA_FEATURES):].copy()
    order = np.random.default_rng(0).permutation(8)
    turn = REQUEST_FEATURES.index("turn")
    moved = request.copy()
    moved[turn] = np.flatnonzero(order == int(request[turn]))[0]  # the turn's replica, at its new place
    permuted = np.concatenate([rows[order].ravel(), moved]).astype(np.float32)

    def logits(x):
        with torch.no_grad():
            return model.policy.get_distribution(torch.as_tensor(x[None])).distribution.logits[0].numpy()

    np.testing.assert_allclose(logits(permuted), logits(obs)[order], rtol=1e-5, atol=1e-6)


def test_a_route_agent_can_start_as_a_router(tmp_path):
    """``imitate`` in the route mode: the policy is fitted to a router's choices before PPO (cross-entropy)."""
    cfg = TrainConfig(task=TASK, imitate="router-least-loaded", imitate_episodes=1, timesteps=64, n_envs=1,
                      eval_freq=64, eval_episodes=1, checkpoint_freq=64,
                      hyperparams={"n_steps": 64, "batch_size": 64, "n_epochs": 1, "learning_rate": 1e-6},
                      out=str(tmp_path))
    run = train(cfg, progress=False, subprocess=False)
    fit = json.loads((run / "config.json").read_text())["imitation"]
    assert fit["demonstration_steps"] > 300 and fit["last_loss"] < fit["first_loss"] and fit["agreement"] > 0.25
    # (chance is 1/8; one 120 s episode, about 380 arrivals, and its gradient steps)
    assert make_policy(f"rl:{run}").decision == "route"


@pytest.mark.parametrize(("imitate", "message"), [
    ("fcfs", "an admission policy"), ("no-such-router", "neither a router policy nor a params file"),
])
def test_a_route_agent_imitates_routers_only(imitate, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(task=TASK, imitate=imitate)


def test_route_masks_read_the_fits_column_by_hand():
    """Bug: the agent's masks read another column, keep replicas that cannot hold the request, or mask every
    replica when none fits (the env then takes any: ``action_masks()`` is all ones)."""
    from servegym.envs.routing import REPLICA_FEATURES, REQUEST_FEATURES

    rows = np.zeros((3, len(REPLICA_FEATURES)), dtype=np.float32)
    rows[:, REPLICA_FEATURES.index("free_blocks")] = [9.0, 0.0, 4.0]  # a column beside the one that decides
    rows[:, REPLICA_FEATURES.index("fits")] = [0.0, 1.0, 0.0]
    obs = {"replicas": rows, "request": np.ones(len(REQUEST_FEATURES), dtype=np.float32)}
    np.testing.assert_array_equal(route_masks(obs, 3), [False, True, False])
    np.testing.assert_array_equal(route_masks(route_observation(obs), 3), [False, True, False])
    rows[:, REPLICA_FEATURES.index("fits")] = 0.0
    np.testing.assert_array_equal(route_masks(obs, 3), [True, True, True])
