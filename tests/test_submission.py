"""Submitting a trained agent and verifying the submission (issue 26): stamped, replayed, tampering caught."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("stable_baselines3")

from servegym import ENV_ID, __version__
from servegym.cli import main
from servegym.envs import TEST_SEEDS
from servegym.evaluation.submission import read_submission, submit, verify, write_submission
from servegym.rl.train import TrainConfig, train

SEEDS = TEST_SEEDS[:2]
pytestmark = pytest.mark.slow  # trains a tiny agent and replays its episodes (about 45 s)


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    cfg = TrainConfig(algo="ppo", mode="count", task="relaxed", timesteps=128, n_envs=1, max_episode_steps=200,
                      eval_freq=128, eval_episodes=1, hyperparams={"n_steps": 64, "batch_size": 64, "n_epochs": 1},
                      out=str(tmp_path_factory.mktemp("runs")))
    return train(cfg, progress=False, subprocess=False)


@pytest.fixture(scope="module")
def submission(agent, tmp_path_factory):
    return write_submission(submit(agent, SEEDS, workers=1), tmp_path_factory.mktemp("sub") / "submission.json")


def test_a_submission_is_stamped_with_what_produced_it(agent, submission):
    data = read_submission(submission)
    assert (data["servegym_version"], data["env_id"], data["task"], data["track"]) == \
        (__version__, ENV_ID, "relaxed", "test")
    assert data["seeds"] == list(SEEDS) and [row["seed"] for row in data["rows"]] == list(SEEDS)
    assert data["task_settings"]["workload"] == "low" and data["task_settings"]["engine"]["length_mode"] == "predicted"
    assert len(data["agent"]["sha256"]) == 64 and data["commit"]
    assert all(row["policy"] == f"rl:{agent.name}" for row in data["rows"])


def test_verify_replays_a_submission_exactly_and_catches_tampering(submission, tmp_path, capsys):
    assert verify(submission, workers=1) == []
    assert main(["bench", "--verify", str(submission), "--workers", "1"]) == 0
    assert "verified: all 2 rows" in capsys.readouterr().out
    data = json.loads(submission.read_text())
    data["rows"][1]["episode_return"] += 1e-9
    data["env_id"] = "servegym/Serving-v0"
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(data))
    problems = verify(forged, workers=1)
    assert any(p.startswith(f"seed {SEEDS[1]}: episode_return submitted") for p in problems)
    assert any(p.startswith("env id: submitted on servegym/Serving-v0") for p in problems)
    assert main(["bench", "--verify", str(forged), "--workers", "1"]) == 1
    assert "NOT verified" in capsys.readouterr().out


def test_a_file_that_is_not_a_submission_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="not a format-1 servegym submission"):
        read_submission(bad)


def test_an_agent_copies_for_the_oracle_sharing_its_frozen_model(agent):
    # The oracle copies every base policy at each decision point; an agent's VecNormalize cannot be deep-copied,
    # so a copy shares the model and statistics (the agent keeps no state between steps) and acts the same.
    import copy

    from servegym.evaluation.oracle import Budget, plan_episode
    from servegym.policies import make_policy
    from servegym.runner import make_env, run_episode

    policy = make_policy(f"rl:{agent}")
    clone = copy.deepcopy(policy)
    assert clone is not policy and clone.model is policy.model
    env = make_env(task="relaxed", split="test", apply_overrides=False)
    alone = run_episode(env, policy, SEEDS[0]).total_reward
    episode = plan_episode(env, {"agent": clone, "fcfs": make_policy("fcfs")}, SEEDS[0], Budget(replans=2, width=2))
    assert episode.sweep["agent"] == alone and episode.result.total_reward >= alone
