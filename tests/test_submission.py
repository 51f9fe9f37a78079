"""Submitting a trained agent and verifying the submission (issue 26): stamped, replayed, tampering caught."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("stable_baselines3")

from servegym import ENV_ID, __version__
from servegym.benchmark import submission as sub
from servegym.benchmark.submission import read_submission, submit, verify, write_submission
from servegym.cli import main
from servegym.envs import TEST_SEEDS
from servegym.rl.train import TrainConfig, train

SEEDS = TEST_SEEDS[:2]
pytestmark = pytest.mark.slow  # trains a tiny agent and replays its episodes (about 45 s)


@pytest.fixture(scope="module", autouse=True)
def two_test_seeds():
    """The task's test seeds cut to two for speed: a submission must still hold all of them (``task_test_seeds``).
    The commit is fixed too: these tests replay episodes, and a checkout with local edits would add its own
    (correct) difference; the commit checks are tests/test_bite_round48_submission.py's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sub, "task_test_seeds", lambda task: SEEDS)
        patch.setattr(sub, "source_commit", lambda: "0123456789abcdef")
        yield


@pytest.fixture(scope="module")
def agent(tmp_path_factory, two_test_seeds):
    cfg = TrainConfig(algo="ppo", mode="count", task="relaxed", timesteps=128, n_envs=1, max_episode_steps=200,
                      eval_freq=128, eval_episodes=1, hyperparams={"n_steps": 64, "batch_size": 64, "n_epochs": 1},
                      out=str(tmp_path_factory.mktemp("runs")))
    return train(cfg, progress=False, subprocess=False)


@pytest.fixture(scope="module")
def submission(agent, tmp_path_factory):
    return write_submission(submit(agent, workers=1), tmp_path_factory.mktemp("sub") / "submission.json")


def test_a_submission_is_stamped_with_what_produced_it(agent, submission):
    data = read_submission(submission)
    assert (data["servegym_version"], data["env_id"], data["task"], data["track"]) == \
        (__version__, ENV_ID, "relaxed", "test")
    assert data["seeds"] == list(SEEDS) and [row["seed"] for row in data["rows"]] == list(SEEDS)
    assert data["task_settings"]["workload"] == "low" and data["task_settings"]["engine"]["length_mode"] == "predicted"
    assert set(data["agent"]["files"]) == {"best_model.zip", "best_vecnormalize.pkl", "config.json"}
    assert len(data["agent"]["digest"]) == 64
    assert data["training"]["status"] == "finished" and data["training"]["provenance"]["split"] == "train"
    assert data["training"]["provenance"]["env_id"] == ENV_ID and data["commit"]
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
    assert any(p.startswith("env_id: submitted 'servegym/Serving-v0'") for p in problems)
    assert main(["bench", "--verify", str(forged), "--workers", "1"]) == 1
    assert "NOT verified" in capsys.readouterr().out


def test_an_interrupted_run_is_a_listed_difference_not_an_error(agent, submission, tmp_path):
    # verify replays whatever the run's record says, and lists why it is not a verified submission.
    import shutil

    copy = tmp_path / agent.name  # the same name, so the same label on its rows
    shutil.copytree(agent, copy)
    config = json.loads((copy / "config.json").read_text())
    config.update(status="interrupted", stopped_by="SIGTERM", timesteps_done=64)
    (copy / "config.json").write_text(json.dumps(config))
    problems = verify(submission, run=copy, workers=1)
    assert "training: the run is interrupted, not finished" in problems
    assert "training status: submitted 'finished', the run's record says 'interrupted'" in problems
    assert not any(p.startswith("seed ") for p in problems)  # the rows themselves still replay exactly


def test_an_edited_config_changes_the_digest_though_the_model_is_the_same(agent, submission, tmp_path):
    # The config decides the actions too (a residual's base parameters, the observation scaling): an edit after
    # submitting is caught even though best_model.zip is untouched.
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(agent, copy)
    config = json.loads((copy / "config.json").read_text())
    config["reward_scale"] = 0.5
    (copy / "config.json").write_text(json.dumps(config))
    problems = verify(submission, run=copy, workers=1)
    assert any(p.startswith("agent file config.json: SHA-256 differs") for p in problems)
    assert any(p.startswith("agent digest: submitted") for p in problems)
    assert not any("best_model.zip" in p for p in problems)


def test_a_file_that_is_not_a_submission_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="not a format-2 servegym submission"):
        read_submission(bad)


def test_an_agent_copies_for_the_oracle_sharing_its_frozen_model(agent):
    # The oracle copies every base policy at each decision point; an agent's VecNormalize cannot be deep-copied,
    # so a copy shares the model and statistics (the agent keeps no state between steps) and acts the same.
    import copy

    from servegym.benchmark.oracle import Budget, plan_episode
    from servegym.policies import make_policy
    from servegym.runner import make_env, run_episode

    policy = make_policy(f"rl:{agent}")
    clone = copy.deepcopy(policy)
    assert clone is not policy and clone.model is policy.model
    env = make_env(task="relaxed", split="test", apply_overrides=False)
    alone = run_episode(env, policy, SEEDS[0]).total_reward
    episode = plan_episode(env, {"agent": clone, "fcfs": make_policy("fcfs")}, SEEDS[0], Budget(replans=2, width=2))
    assert episode.sweep["agent"] == alone and episode.result.total_reward >= alone
