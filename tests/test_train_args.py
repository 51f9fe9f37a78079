"""``servegym train`` refuses bad input in the parent, before a run folder or an env worker exists (issue 48): one
line ``servegym: error: ...`` naming the flag and the value, exit status 2; and a start that fails after the
checks leaves no folder that would refuse the corrected command."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("stable_baselines3")

from servegym.cli import main
from servegym.rl.config import TrainConfig

TASK = ["train", "--task", "memory-tight", "--n-envs", "2", "--timesteps", "128", "--quiet"]


@pytest.fixture
def spawned(monkeypatch) -> list[int]:
    """The training vector envs (``NativeVecEnv``, the default, and ``SubprocVecEnv``) replaced by spies that record
    each construction's env count and build nothing."""
    import stable_baselines3.common.vec_env as vec_env

    import servegym.rl.vec_env as native

    calls: list[int] = []

    def spy(env_fns, start_method=None):
        calls.append(len(env_fns))
        raise RuntimeError("the training envs started")

    monkeypatch.setattr(vec_env, "SubprocVecEnv", spy)
    monkeypatch.setattr(native, "NativeVecEnv", spy)
    return calls


def refused(capsys, argv: list[str], started: bool = False) -> str:
    """Run ``servegym ARGV``; check exit status 2, exactly one line on stderr and nothing on stdout (unless the
    command ``started``: then its banner line); return the error line."""
    status = main(argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert status == 2, lines
    assert len(out.splitlines()) == started, out
    assert len(lines) == 1 and lines[0].startswith("servegym: error: "), lines
    return lines[0].removeprefix("servegym: error: ")


BAD = [
    (["--engine", '{"bogus": 1}'], """--engine {"length_mode": "predicted", "bogus": 1}: engine: unknown key(s) """
                                   """['bogus']; allowed: ['block_size',"""),
    (["--engine", '{"num_kv_blocks": "x"}'],
     """--engine {"length_mode": "predicted", "num_kv_blocks": "x"}: num_kv_blocks must be a positive int, got 'x'"""),
    (["--pool", '{"bogus": 1}'], """--pool {"bogus": 1}: pool: unknown key(s) ['bogus']"""),
    (["--pool", '{"num_containers": 1000000}'],
     """--pool {"num_containers": 1000000}: num_containers must be a whole number in [1, 1,024]"""),
    (["--env", '{"foo": 1}'], """--env {"foo": 1}: gym.make('servegym/Serving-v2') takes no argument 'foo'"""),
    (["--env", '{"decision_steps": "yes"}'],
     """--env {"decision_steps": "yes"}: decision_steps must be true or false, got 'yes'"""),
    (["--env", '{"engine": {}}'], "env must not hold ['engine']: they have their own fields"),
    (["--profile", "nope"], "--profile nope: unknown profile 'nope'; shipped: ["),
    (["--hyperparams", '{"learning_rate": "x"}'], "--hyperparams: learning_rate must be a finite number, got 'x'"),
    (["--hyperparams", '{"learning_rate": NaN}'], "--hyperparams: learning_rate must be a finite number, got nan"),
    (["--hyperparams", '{"n_steps": 1.5}'], "--hyperparams: n_steps must be a whole number, got 1.5"),
    (["--hyperparams", '{"normalize_advantage": 1}'],
     "--hyperparams: normalize_advantage must be true or false, got 1"),
    (["--hyperparams", '{"target_kl": "0.02"}'],
     "--hyperparams: target_kl must be a finite number or null, got '0.02'"),
    (["--hyperparams", '{"learning_rat": 0.001}'],
     "--hyperparams: PPO has no argument 'learning_rat'; did you mean 'learning_rate'?"),
    (["--hyperparams", '{"seed": 3}'], "--hyperparams: 'seed' is set by servegym train (use --seed)"),
    (["--hyperparams", "[1]"], "--hyperparams must be a JSON object, got '[1]'"),
    (["--algo", "sac", "--hyperparams", '{"n_epochs": 4}'], "--hyperparams: SAC has no argument 'n_epochs'"),
    (["--eval-episodes", "6"], "eval_episodes must be in [1, 5], got 6"),
]


@pytest.mark.parametrize(("flags", "message"), BAD, ids=[" ".join(flags)[:40] for flags, _ in BAD])
def test_bad_input_is_one_line_before_any_folder_or_worker(tmp_path, capsys, spawned, flags, message):
    out = tmp_path / "out"
    line = refused(capsys, [*TASK, *flags, "--out", str(out)])
    assert line.startswith(message), line
    assert spawned == [] and not out.exists()


COUNTS = [("--n-envs", "0", "[1, 1,024] (each env is a process or an engine in memory), got 0"),
          ("--n-envs", "1025", "[1, 1,024] (each env is a process or an engine in memory), got 1,025"),
          ("--timesteps", "0", "[1, 1,000,000,000] (env steps), got 0"),
          ("--max-episode-steps", "-5", "[1, 1,000,000,000] (env steps), got -5"),
          ("--checkpoint-freq", "0", "[1, 1,000,000,000] (env steps), got 0"),
          ("--eval-episodes", "10001", "[1, 10,000] (each seed is one episode per policy and workload), got 10,001")]


@pytest.mark.parametrize(("flag", "value", "rule"), COUNTS, ids=[f"{f} {v}" for f, v, _ in COUNTS])
def test_counts_follow_the_shared_bounded_count_rule(tmp_path, capsys, spawned, flag, value, rule):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        main([*TASK, flag, value, "--out", str(out)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"servegym train: error: argument {flag}: must be a whole number in {rule}"
    assert spawned == [] and not out.exists()


@pytest.mark.parametrize(("field", "value", "message"), [
    ("max_episode_steps", 0, "max_episode_steps must be a whole number in [1, 1,000,000,000] (env steps), got 0"),
    ("n_envs", 2.5, "n_envs must be a whole number in [1, 1,024] (each env is a process or an engine in memory), "
                    "got 2.5"),
    ("timesteps", True, "timesteps must be a whole number in [1, 1,000,000,000] (env steps), got True"),
    ("hyperparams", [1], "hyperparams must be a mapping, got [1]"),
    ("normalize", "no", "normalize must be true or false, got 'no'"),
    ("vec_env", "dummy", "vec_env must be one of ('native', 'sharded', 'subprocess'), got 'dummy'"),
])
def test_the_config_applies_the_same_rules(field, value, message):
    with pytest.raises(ValueError) as err:
        TrainConfig(task="memory-tight", **{field: value})
    assert str(err.value) == message


def test_a_whole_float_count_is_taken_as_an_int():
    cfg = TrainConfig(timesteps=6e4, n_envs=2.0)  # a YAML file's !!float 6e4
    assert (cfg.timesteps, cfg.n_envs) == (60_000, 2) and isinstance(cfg.timesteps, int)


def test_good_input_reaches_the_workers_and_their_failure_leaves_no_folder(tmp_path, spawned):
    # The spy above is what a good command reaches (so its silence above means something); a start that fails
    # there, whatever the error, removes the run folder it made.
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="the training envs started"):
        main([*TASK, "--out", str(out)])
    assert spawned == [2]
    assert out.is_dir() and list(out.iterdir()) == []
    with pytest.raises(RuntimeError, match="the training envs started"):  # in workers: the same reach
        main([*TASK, "--vec-env", "subprocess", "--out", str(out)])
    assert spawned == [2, 2]


def test_a_value_the_algorithm_refuses_at_start_leaves_nothing_and_the_corrected_command_runs(tmp_path, capsys):
    # PPO asserts batch_size > 1 when it builds (normalised advantages): that passes the type check, fails at the
    # start, and must not leave a folder that makes the corrected command "already hold a run".
    out = tmp_path / "out"
    small = ["train", "--task", "memory-tight", "--n-envs", "1", "--timesteps", "64", "--max-episode-steps", "50",
             "--eval-episodes", "1", "--quiet", "--out", str(out)]
    line = refused(capsys, [*small, "--hyperparams", '{"n_steps": 64, "batch_size": 1}'], started=True)
    assert line.startswith('--hyperparams {"n_steps": 64, "batch_size": 1}: PPO refuses them: `batch_size` must be '
                           "greater than 1")
    assert list(out.iterdir()) == []
    assert main([*small, "--hyperparams", '{"n_steps": 64, "batch_size": 64, "n_epochs": 1}']) == 0
    [config] = out.glob("*/config.json")
    data = json.loads(config.read_text())
    assert (data["status"], data["timesteps_done"], data["interrupted"]) == ("finished", 64, False)


def test_a_run_that_cannot_resume_is_one_line(tmp_path, capsys):
    assert refused(capsys, ["train", "--resume", str(tmp_path / "nope")]) == \
        f"{tmp_path / 'nope'} is not a servegym train run (no config.json)"
    run = tmp_path / "r"
    run.mkdir()
    record = {"algo": "ppo", "task": "memory-tight", "timesteps": 256, "status": "running", "timesteps_done": 0}
    (run / "config.json").write_text(json.dumps(record))
    assert refused(capsys, ["train", "--resume", str(run)]) == \
        f"{run} has no checkpoint to resume from (checkpoints/model_<N>_steps.zip)"
    (run / "config.json").write_text(json.dumps({**record, "status": "finished", "timesteps_done": 256}))
    assert refused(capsys, ["train", "--resume", str(run)]) == f"{run} finished its 256 timesteps already: nothing " \
                                                                "to resume"


def test_training_on_the_test_split_is_refused():
    # The side door of issue 51: --env '{"split": "test"}' trained on a trace task's held-out test windows.
    from servegym.rl.config import TrainConfig

    with pytest.raises(ValueError, match="env split='test': training always uses a task's training data"):
        TrainConfig(task="long-context", env={"split": "test"})
