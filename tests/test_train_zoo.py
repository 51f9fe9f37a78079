"""``servegym train --zoo``: the hyperparameter files ship inside the package and are named by name (``--zoo ppo``),
and a malformed file is one line naming the file and the key, before any folder or worker (issue 48)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("yaml")
pytest.importorskip("stable_baselines3")

import servegym.rl
from servegym.cli import main
from servegym.rl.zoo import HYPERPARAMS_DIR, read_zoo, shipped_zoo_files

ROOT = Path(__file__).resolve().parents[1]


def test_the_files_ship_in_the_package_and_live_there_only():
    assert Path(servegym.rl.__file__).resolve().parent / "hyperparams" == HYPERPARAMS_DIR
    assert sorted(shipped_zoo_files()) == ["ppo", "ppo-residual"]
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "hyperparams/*.yml" in package_data["servegym.rl"]
    assert not (ROOT / "docs" / "rl" / "hyperparams").exists()  # one copy: no docs twin to drift
    docs = (ROOT / "docs" / "RL.md").read_text()
    assert "(../rl/hyperparams/ppo.yml)" in docs and "--zoo ppo " in docs and "docs/rl/hyperparams" not in docs


def test_a_shipped_name_reads_the_shipped_file():
    fields = read_zoo("ppo", "memory-tight", "ppo")
    assert fields == read_zoo(HYPERPARAMS_DIR / "ppo.yml", "memory-tight") == read_zoo("ppo.yml", "memory-tight")
    # The file's entry, read by hand: 6e4 steps on 2 envs, the score mode, no normalisation, decision steps.
    assert (fields["timesteps"], fields["n_envs"], fields["mode"], fields["normalize"], fields["env"]) == \
        (60_000, 2, "score", False, {"decision_steps": True})
    assert fields["hyperparams"] == {"n_steps": 2048, "batch_size": 512, "learning_rate": 2e-5, "ent_coef": 0.0,
                                     "gamma": 0.995, "n_epochs": 4, "clip_range": 0.1, "target_kl": 0.02,
                                     "policy_kwargs": {"log_std_init": -3.0}}
    assert read_zoo("ppo-residual", "long-context")["hyperparams"]["learning_rate"] == 1e-4


def test_train_takes_a_shipped_name(tmp_path, monkeypatch):
    import servegym.rl.train as train_module

    seen = []

    def fake_train(cfg, progress=True, subprocess=True, checked=False):
        seen.append(cfg)
        run = tmp_path / "run"
        run.mkdir(exist_ok=True)
        (run / "config.json").write_text(json.dumps({"wall_s": 1.0, "best_mean_reward": None,
                                                     "best_timesteps": None}))
        return run

    monkeypatch.setattr(train_module, "train", fake_train)
    assert main(["train", "--task", "long-context", "--zoo", "ppo-residual", "--out", str(tmp_path), "--quiet"]) == 0
    cfg = seen[0]
    assert (cfg.mode, cfg.timesteps, cfg.hyperparams["n_steps"]) == ("score", 60_000, 1024)
    assert cfg.hyperparams["policy_kwargs"] == {"log_std_init": -1.5, "head_gain": 0.0}


ENTRY = "servegym/MemoryTight-v2:\n"
MALFORMED = [
    ("a: [1, 2\n", "not valid YAML (line 2, column 1): expected ',' or ']', but got '<stream end>'"),
    ("- 1\n- 2\n", "expected a mapping of env ids to hyperparameters, got list"),
    ("", "expected a mapping of env ids to hyperparameters, got an empty file"),
    ("servegym/Relaxed-v2:\n  n_envs: 1\n",
     "has no entry for servegym/MemoryTight-v2 (entries: ['servegym/Relaxed-v2'])"),
    (ENTRY + "  - 1\n", "servegym/MemoryTight-v2: expected a mapping of hyperparameters, got [1]"),
    (ENTRY + "  n_timesteps: abc\n", "servegym/MemoryTight-v2: n_timesteps must be a whole number in "
                                     "[1, 1,000,000,000] (env steps), got 'abc'"),
    (ENTRY + "  n_envs: 0\n", "servegym/MemoryTight-v2: n_envs must be a whole number in [1, 1,024]"),
    (ENTRY + "  normalize: maybe\n", "servegym/MemoryTight-v2: normalize must be true or false, got 'maybe'"),
    (ENTRY + "  env_kwargs: [1]\n", "servegym/MemoryTight-v2: env_kwargs must be a mapping, got [1]"),
    (ENTRY + "  env_wrapper: [1]\n", "servegym/MemoryTight-v2: env_wrapper [1] is not an action mode"),
    (ENTRY + "  learning_rate: x\n", "servegym/MemoryTight-v2: learning_rate must be a finite number, got 'x'"),
    (ENTRY + "  learning_rat: 0.1\n", "servegym/MemoryTight-v2: PPO has no argument 'learning_rat'; did you mean "
                                      "'learning_rate'?"),
    (ENTRY + "  policy_kwargs: dict(activation_fn=nn.ReLU)\n", "servegym/MemoryTight-v2: policy_kwargs "
                                                               "'dict(activation_fn=nn.ReLU)': only literal values"),
    (b"\xff\xfe\x00\x01", "not a text file"),
]


@pytest.mark.parametrize(("text", "message"), MALFORMED, ids=[str(m)[:30] for _, m in MALFORMED])
def test_a_malformed_file_is_one_line_before_any_folder_or_worker(tmp_path, capsys, monkeypatch, text, message):
    import stable_baselines3.common.vec_env as vec_env

    spawned = []
    monkeypatch.setattr(vec_env, "SubprocVecEnv", lambda *args, **kwargs: spawned.append(args))
    path = tmp_path / "zoo.yml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    out = tmp_path / "out"
    status = main(["train", "--task", "memory-tight", "--zoo", str(path), "--out", str(out), "--quiet"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"servegym: error: --zoo {path}") and message in lines[0], lines[0]
    assert spawned == [] and not out.exists()


def test_a_missing_file_names_the_shipped_ones(capsys):
    line = "servegym: error: --zoo docs/rl/hyperparams/ppo.yml does not exist, and no shipped file has that name " \
           "(shipped: ppo-residual, ppo; e.g. --zoo ppo)"
    assert main(["train", "--task", "memory-tight", "--zoo", "docs/rl/hyperparams/ppo.yml"]) == 2
    assert capsys.readouterr().err.strip() == line
    assert main(["train", "--task", "memory-tight", "--zoo", "nope"]) == 2
    assert "--zoo nope does not exist" in capsys.readouterr().err
