"""Trained agents' budgets on the board and their learning curves against the tuned heuristics (issue 53)."""

from __future__ import annotations

import json

from servegym.benchmark.bench import BenchRow, Entry, write_leaderboard
from servegym.benchmark.budgets import (
    BUDGETS_FILE,
    budget_lines,
    heuristic_validation_returns,
    training_budget,
    write_budgets,
    write_curves,
)


def _run(tmp_path, name: str, **config) -> Entry:
    run = tmp_path / name
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"task": "memory-tight", **config}))
    (run / "eval.csv").write_text("10000,-900.0\n100000,-700.0\n1000000,-650.5\n")
    return Entry(f"rl:{name}", f"rl:{run}", {}, ("memory-tight",))


def _row(policy: str, seed: int, episode_return: float, task: str = "memory-tight") -> BenchRow:
    return BenchRow(task, policy, seed, episode_return, 0.1, 5.0, 1.0, 0, False, 100)


def test_a_budget_is_what_the_run_recorded_and_old_runs_say_what_they_used(tmp_path):
    new = training_budget(_run(tmp_path, "a__s0", n_envs=16, vec_env="native", timesteps_done=1_003_520,
                               wall_s=600.0, timesteps=1_000_000))
    assert (new.timesteps, new.wall_s, new.n_envs, new.vec_env, new.task) == (1_003_520, 600.0, 16, "native",
                                                                              "memory-tight")
    old = training_budget(_run(tmp_path, "b__s0", n_envs=2, timesteps_done=61_440, wall_s=236.0))
    assert old.vec_env == "subprocess"  # before --vec-env, two envs meant SubprocVecEnv
    one = training_budget(_run(tmp_path, "c__s0", n_envs=1, timesteps_done=100))
    assert one.vec_env == "dummy" and one.wall_s != one.wall_s  # no wall time recorded: NaN, shown as "?"
    alone = training_budget(_run(tmp_path, "d__s0", n_envs=1, vec_env="subprocess", timesteps_done=1))
    assert alone.vec_env == "native"  # one env never starts a worker, whatever the flag said
    lines = budget_lines([new, old, one])
    # 1,003,520 steps in 600 s: 10.0 min, 1,673 steps/s (rounded from 1,672.53).
    assert "| rl:a__s0 | memory-tight | 1,003,520 | 10.0 min | 1,673 | 16 (native) |" in lines
    assert "| rl:b__s0 | memory-tight | 61,440 | 3.9 min | 260 | 2 (subprocess) |" in lines
    assert "| rl:c__s0 | memory-tight | 100 | ? | ? | 1 (dummy) |" in lines
    assert budget_lines([]) == []
    path = write_budgets([new, old], tmp_path)
    assert path.name == BUDGETS_FILE
    assert path.read_text().splitlines() == ["label,task,timesteps,wall_s,n_envs,vec_env",
                                             "rl:a__s0,memory-tight,1003520,600.0,16,native",
                                             "rl:b__s0,memory-tight,61440,236.0,2,subprocess"]


def test_the_leaderboard_ends_with_the_budgets_table_when_agents_ran(tmp_path):
    rows = [_row("fcfs", s, -1000.0 - s) for s in range(3)] + [_row("rl:a__s0", s, -900.0 + s) for s in range(3)]
    budget = training_budget(_run(tmp_path, "a__s0", n_envs=16, vec_env="native", timesteps_done=4096, wall_s=2.0))
    _, md = write_leaderboard(rows, tmp_path / "with", budgets=[budget])
    text = md.read_text()
    assert "## Trained agents' budgets" in text and "| rl:a__s0 | memory-tight | 4,096 | 2 s | 2,048 |" in text
    _, md = write_leaderboard(rows, tmp_path / "without")
    assert "budgets" not in md.read_text()


def test_the_curves_take_each_agents_eval_history_and_the_tuned_heuristics_validation_means(tmp_path):
    rows = [_row("scorer (tuned) [validation]", s, r) for s, r in ((0, -700.0), (1, -600.0))]
    rows += [_row("fcfs [validation]", 0, -2000.0), _row("scorer (tuned)", 0, -1.0),  # untuned; a test episode
             _row("twp (tuned) [validation]", 0, -5.0, task="long-context")]          # another task
    assert heuristic_validation_returns(rows, "memory-tight") == {"scorer (tuned)": -650.0}
    entries = [_run(tmp_path, "a__s0", n_envs=2), _run(tmp_path, "a__s1", n_envs=2), Entry("fcfs", "fcfs")]
    [path] = write_curves(entries, rows, tmp_path)
    assert path.name == "learning_curves_memory-tight.png" and path.stat().st_size > 10_000


def test_two_agents_with_the_same_seed_keep_their_own_labels_on_one_plot(tmp_path, monkeypatch):
    import servegym.evaluation.plots as plots

    drawn = {}
    monkeypatch.setattr(plots, "learning_curves", lambda runs, out, references, title, log_steps, labels:
                        drawn.update(runs=runs, labels=labels, log=log_steps) or out)
    ppo = _run(tmp_path, "Serving-v2__ppo__score__memory-tight__s0")
    dqn = _run(tmp_path, "Serving-v2__dqn__count__memory-tight__s0")
    write_curves([ppo, dqn], [], tmp_path)
    assert drawn["labels"] == [ppo.label, dqn.label] and drawn["log"]
    assert [r.name for r in drawn["runs"]] == ["Serving-v2__ppo__score__memory-tight__s0",
                                              "Serving-v2__dqn__count__memory-tight__s0"]


def test_curves_without_agents_are_refused_before_any_episode(tmp_path, capsys):
    from servegym.cli import main

    argv = ["bench", "--tasks", "relaxed", "--policies", "fcfs", "--seeds", "1", "--workers", "1", "--quiet"]
    assert main([*argv, "--curves", "--out", str(tmp_path / "b")]) == 2
    assert "--curves draws trained agents' validation returns against their budgets: give --rl RUN" in \
        capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_a_training_runs_config_records_what_its_budget_is_read_from(tmp_path):
    # The fields training_budget reads are the ones servegym train writes (config.json: the TrainConfig and the
    # run's state), so a run trained today shows its vector env, not the old-run guess.
    from servegym.rl.config import TrainConfig
    from servegym.rl.train import _write_config

    cfg = TrainConfig(task="memory-tight", n_envs=4, vec_env="native", out=str(tmp_path))
    run = tmp_path / "run"
    run.mkdir()
    _write_config(run, cfg, {"status": "finished", "timesteps_done": 8192, "wall_s": 4.0})
    budget = training_budget(Entry("rl:run", f"rl:{run}", {}, ("memory-tight",)))
    assert (budget.n_envs, budget.vec_env, budget.timesteps, budget.wall_s) == (4, "native", 8192, 4.0)
