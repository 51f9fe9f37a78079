"""Hyperparameter files in the RL Baselines3 Zoo's format (issue 27): the shipped file is the recipe's, and bad
entries are clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("yaml")

from servegym.rl.zoo import policy_kwargs, read_zoo

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "rl" / "hyperparams" / "ppo.yml"


def test_the_shipped_entry_is_the_recipe_the_kept_agents_trained_with():
    fields = read_zoo(SHIPPED, "memory-tight")
    assert fields["mode"] == "score" and fields["timesteps"] == 60_000 and fields["n_envs"] == 2
    assert fields["normalize"] is False and fields["env"] == {"decision_steps": True}
    run = json.loads((ROOT / "docs/rl/Serving-v1__ppo__score__memory-tight__s0/config.json").read_text())
    assert fields["hyperparams"] == run["hyperparams"]  # learning_rate 2e-5 read as a float, policy_kwargs parsed
    assert (run["mode"], run["timesteps"], run["n_envs"], run["normalize"], run["env"]) == \
        ("score", 60_000, 2, False, {"decision_steps": True})


@pytest.mark.parametrize("task", ["memory-tight", "long-context"])
def test_the_residual_entries_are_the_recipe_the_kept_residual_agents_trained_with(task):
    fields = read_zoo(SHIPPED.with_name("ppo-residual.yml"), task)
    for seed in range(5):
        run = json.loads((ROOT / f"docs/rl/Serving-v1__ppo__score-residual__{task}__s{seed}/config.json").read_text())
        assert fields["hyperparams"] == run["hyperparams"], seed
        assert (fields["mode"], fields["timesteps"], fields["n_envs"], fields["normalize"], fields["env"]) == \
            (run["mode"], run["timesteps"], run["n_envs"], run["normalize"], run["env"])
        assert run["score_base"] == f"docs/tuning/scorer-{task}/best_params.json"
        # The file has since been re-tuned on Serving-v2; the run keeps the parameters it trained with.
        assert set(run["score_base_params"]) == set(json.loads((ROOT / run["score_base"]).read_text())["params"])
        assert (run["reward_scale"], run["discount_half_life_s"], run["residual_scale"]) == (0.01, 20.0, 0.2)


def test_policy_kwargs_are_read_without_running_code():
    # The Zoo's own style: nested dict(...) calls with literal values.
    assert policy_kwargs("dict(log_std_init=-2, net_arch=dict(pi=[64], vf=[64]))") == \
        {"log_std_init": -2, "net_arch": {"pi": [64], "vf": [64]}}
    with pytest.raises(ValueError, match="only literal values"):
        policy_kwargs("dict(activation_fn=nn.ReLU)")
    with pytest.raises(ValueError, match="not a dict"):
        policy_kwargs("__import__('os').getcwd()")


@pytest.mark.parametrize("entry, message", [
    ({"servegym/Relaxed-v2": {"n_envs": 1}}, "no entry for servegym/MemoryTight-v2"),
    ({"servegym/MemoryTight-v2": {"env_wrapper": "gymnasium.wrappers.TimeLimit"}}, "not an action mode"),
    ({"servegym/MemoryTight-v2": {"policy": "CnnPolicy"}}, "servegym's envs take"),
])
def test_bad_entries_are_clear_errors(tmp_path, entry, message):
    import yaml

    path = tmp_path / "ppo.yml"
    path.write_text(yaml.safe_dump(entry))
    with pytest.raises(ValueError, match=message):
        read_zoo(path, "memory-tight")
    with pytest.raises(ValueError, match="does not exist"):
        read_zoo(tmp_path / "nope.yml", "memory-tight")


def test_train_takes_the_files_entry_and_hyperparams_merge_on_top(tmp_path, monkeypatch, capsys):
    import servegym.rl.train as train_module
    from servegym.cli import main

    seen = {}

    def fake_train(cfg, progress=True, subprocess=True, checked=False):
        seen["cfg"] = cfg
        run = tmp_path / "run"
        run.mkdir()
        (run / "config.json").write_text(json.dumps({"wall_s": 1.0, "best_mean_reward": None,
                                                     "best_timesteps": None}))
        return run

    monkeypatch.setattr(train_module, "train", fake_train)
    assert main(["train", "--task", "memory-tight", "--zoo", str(SHIPPED), "--hyperparams",
                 '{"learning_rate": 0.001}', "--out", str(tmp_path), "--quiet"]) == 0
    cfg = seen["cfg"]
    assert (cfg.mode, cfg.timesteps, cfg.n_envs, cfg.normalize, cfg.env) == \
        ("score", 60_000, 2, False, {"decision_steps": True})
    assert cfg.hyperparams["learning_rate"] == 0.001 and cfg.hyperparams["policy_kwargs"] == {"log_std_init": -3.0}
    assert main(["train", "--zoo", str(SHIPPED), "--out", str(tmp_path)]) == 2
    assert "--zoo reads the entry of a task: give --task" in capsys.readouterr().err
