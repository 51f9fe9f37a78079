"""A residual agent against a uniformly random action of its own mode, paired over a task's test seeds.

Usage: python benchmarks/random_residual.py --task memory-tight
    --runs docs/rl/Serving-v1__ppo__score-residual__memory-tight__s* [--board docs/bench/leaderboard.csv]

The floor plays the residual ``score`` mode on each run's own base scorer (``score_base_params`` in its
``config.json``) with a uniformly random residual in [-1, 1] each step (a generator seeded per episode), on exactly
the task's test env (``split="test"``), the board's 30 seeds. The agents' returns are read from the leaderboard's
CSV (the same seeds, the same env), or, for a run not on the board, played here on the same env and seeds; each
line prints the agent minus the floor (and, for a run played here, minus its base scorer), paired per seed, mean
and 95% CI.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np

from servegym.envs import TEST_SEEDS
from servegym.envs.observation import queue_matrix
from servegym.evaluation.stats import paired_difference
from servegym.policies import make_policy
from servegym.policies.base import Observation, Policy
from servegym.rl.wrappers import RESIDUAL_SCALE, score_action, score_base
from servegym.runner import make_env, run_episode


class RandomResidual(Policy):
    """A uniformly random residual on a base scorer, each step."""

    name = "random-residual"
    source = "benchmark floor"
    rule = "base scorer plus a uniformly random residual"

    def __init__(self, base: dict, residual_scale: float, seed: int) -> None:
        self.base, self.residual_scale, self.seed = score_base(base), residual_scale, seed

    def reset(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    def act(self, obs: Observation) -> np.ndarray:
        width = queue_matrix(obs).shape[0]
        return score_action(obs, self.rng.uniform(-1.0, 1.0, width + 1), self.base, self.residual_scale)


def board_returns(path: Path, task: str, policy: str) -> dict[int, float]:
    with path.open() as handle:
        return {int(r["seed"]): float(r["episode_return"]) for r in csv.DictReader(handle)
                if r["task"] == task and r["policy"] == policy}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", required=True)
    parser.add_argument("--runs", nargs="+", required=True, type=Path)
    parser.add_argument("--board", type=Path, default=Path("docs/bench/leaderboard.csv"))
    args = parser.parse_args()
    floors: dict[str, dict[int, float]] = {}
    plains: dict[str, dict[int, float]] = {}
    for run in args.runs:
        config = json.loads((run / "config.json").read_text())
        base, scale = config["score_base_params"], config.get("residual_scale", RESIDUAL_SCALE)
        key = json.dumps([base, scale], sort_keys=True)
        if key not in floors:
            floors[key] = {}
            for seed in TEST_SEEDS:
                policy = RandomResidual(base, scale, seed)
                floors[key][seed] = run_episode(make_env(task=args.task, split="test"), policy, seed).total_reward
            scorer = make_policy("scorer", **base)
            plains[key] = {s: run_episode(make_env(task=args.task, split="test"), scorer, s).total_reward
                           for s in TEST_SEEDS}
            print(f"random residual minus its base scorer: "
                  f"{paired_difference(floors[key], plains[key]).describe('+.1f')}")
        agent = board_returns(args.board, args.task, f"rl:{run.name}")
        if sorted(agent) != sorted(TEST_SEEDS):  # not on the board: play it here, on the same env and seeds
            learned = make_policy(f"rl:{run}")
            agent = {s: run_episode(make_env(learned, task=args.task, split="test", apply_overrides=False), learned,
                                    s).total_reward for s in TEST_SEEDS}
            print(f"rl:{run.name} minus its base scorer (played here): "
                  f"{paired_difference(agent, plains[key]).describe('+.1f')}")
        gain = paired_difference(agent, floors[key]).describe("+.1f")
        print(f"rl:{run.name} minus the random residual ({len(TEST_SEEDS)} test seeds): {gain}")


if __name__ == "__main__":
    main()
