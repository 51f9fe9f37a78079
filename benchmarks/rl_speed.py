"""Training throughput (env steps/s) of the RL action modes, with SB3's stock policy and the batched-slot one.

Usage: python benchmarks/rl_speed.py [--steps 4096] [--workload low] [--skip-baseline] [--out rl_speed.md]

Each row times ``model.learn(steps)`` (rollouts and gradient updates; model construction excluded) on a
``DummyVecEnv`` of ``--n-envs`` envs built by ``servegym.rl.train.make_training_env``
(no training-seed stream: episodes reset unseeded after the first). Policy variants:

* ``stock`` - ``"MultiInputPolicy"``, what ``servegym train`` used before: the ``admit`` mode builds one
  validated ``Categorical`` per queue slot (32) on every forward pass;
* ``no-validate`` - the stock policy with ``torch.distributions`` argument validation switched off;
* ``slot`` - ``servegym.rl.fast_dist.policy_for``: one batched distribution per forward pass (``admit`` only;
  the other modes already have a single distribution and keep the stock policy);
* ``score-net`` - the ``score`` mode's network shared across queue slots (``servegym.rl.equivariant``);
  ``score-residual`` is the same mode as a residual on a tuned scorer, ``params`` the scorer's four
  parameters per step on the scaled observation (PPO and SAC, stock ``MultiInputPolicy``).

The ``env`` rows step the wrapped env with random actions: the ceiling any agent could train at. The last row
trains PPO on Gymnasium's ``CartPole-v1`` (``MlpPolicy``) with the same settings, in the same run: the yardstick.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import torch as th
from stable_baselines3.common.vec_env import DummyVecEnv

from servegym.rl.fast_dist import policy_for
from servegym.rl.train import algorithm_class, make_training_env

CASES = [("ppo", "admit"), ("ppo", "count"), ("ppo", "window"), ("ppo", "rank"), ("ppo", "score"),
         ("ppo", "score-residual"), ("ppo", "params"), ("sac", "params"),
         ("maskable-ppo", "admit"), ("maskable-ppo", "count")]
ENGINE = {"length_mode": "predicted"}
BASE = {"output_weight": 3.8, "wait_weight": 5.2, "target_base": 0.58, "target_slope": 0.24}
"""The residual modes' base scorer (memory-tight's tuned parameters, rounded)."""
VARIANTS = {"score-residual": ("score", {"base": BASE}, "raw"), "params": ("params", {"base": BASE}, "scaled")}
"""Case labels that are not plain modes: (mode, wrapper arguments, observation)."""


def make_env(args: argparse.Namespace, case: str) -> gym.Env:
    mode, kwargs, observation = VARIANTS.get(case, (case, {}, "raw"))
    return make_training_env({"workload": args.workload, "engine": dict(ENGINE)}, mode, args.max_episode_steps,
                             mode_kwargs=kwargs, observation=observation)


@dataclass(frozen=True)
class Row:
    algo: str
    mode: str
    variant: str
    steps_per_s: float


@contextlib.contextmanager
def validation(enabled: bool) -> Iterator[None]:
    """Switch ``torch.distributions`` argument validation for the block, then restore the previous default."""
    previous = th.distributions.Distribution._validate_args
    th.distributions.Distribution.set_default_validate_args(enabled)
    try:
        yield
    finally:
        th.distributions.Distribution.set_default_validate_args(previous)


def env_rate(args: argparse.Namespace, mode: str) -> float:
    env = make_env(args, mode)
    env.reset(seed=0)
    env.action_space.seed(0)
    actions = [env.action_space.sample() for _ in range(args.steps)]
    start = time.perf_counter()
    for action in actions:
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            env.reset()
    return args.steps / (time.perf_counter() - start)


def train_rate(args: argparse.Namespace, algo: str, mode: str, variant: str) -> float:
    factory = [lambda: make_env(args, mode)] * args.n_envs
    venv = DummyVecEnv(factory)
    plain = VARIANTS.get(mode, (mode,))[0]
    policy = policy_for(algo, venv.action_space, plain) if variant in ("slot", "score-net") else "MultiInputPolicy"
    return _timed(algo, policy, venv, args, variant != "no-validate")


def cartpole_rate(args: argparse.Namespace) -> float:
    venv = DummyVecEnv([lambda: gym.make("CartPole-v1")] * args.n_envs)
    return _timed("ppo", "MlpPolicy", venv, args, validate=True)


def _timed(algo: str, policy: object, venv: DummyVecEnv, args: argparse.Namespace, validate: bool) -> float:
    hyperparams = {"n_steps": args.n_steps, "batch_size": args.batch_size, "n_epochs": args.n_epochs}
    if algo == "sac":  # one gradient step per env step, SB3's default, from the first step
        hyperparams = {"batch_size": args.batch_size, "learning_starts": 0}
    with validation(validate):
        model = algorithm_class(algo)(policy, venv, seed=0, verbose=0, **hyperparams)
        start = time.perf_counter()
        model.learn(total_timesteps=args.steps)
        wall = time.perf_counter() - start
    venv.close()
    return model.num_timesteps / wall


def variants(mode: str, skip_baseline: bool) -> list[str]:
    if mode in ("score", "score-residual"):
        return ["score-net"] if skip_baseline else ["stock", "score-net"]
    if mode != "admit":
        return ["stock"] if skip_baseline else ["stock", "no-validate"]
    return ["slot"] if skip_baseline else ["stock", "no-validate", "slot"]


def table(rows: list[Row], env_rates: dict[str, float]) -> str:
    baseline = {(r.algo, r.mode): r.steps_per_s for r in rows if r.variant == "stock"}
    lines = ["| algo | mode | policy | steps/s | vs stock | env steps/s (random) |", "|---|---|---|---:|---:|---:|"]
    for r in rows:
        ratio = f"{r.steps_per_s / baseline[r.algo, r.mode]:.1f}x" if (r.algo, r.mode) in baseline else "-"
        lines.append(f"| {r.algo} | {r.mode} | {r.variant} | {r.steps_per_s:.0f} | {ratio} | "
                     f"{env_rates[r.mode]:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4096, help="timesteps per measurement")
    parser.add_argument("--workload", default="low", help="workload name passed to the env")
    parser.add_argument("--n-envs", type=int, default=1, help="envs in the DummyVecEnv")
    parser.add_argument("--n-steps", type=int, default=512, help="PPO rollout length per env")
    parser.add_argument("--batch-size", type=int, default=64, help="PPO minibatch size")
    parser.add_argument("--n-epochs", type=int, default=10, help="PPO epochs per rollout")
    parser.add_argument("--max-episode-steps", type=int, default=3000, help="episode truncation")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads (0: torch default)")
    parser.add_argument("--skip-baseline", action="store_true", help="only the fast path (no stock rows)")
    parser.add_argument("--out", type=Path, default=None, help="also write the Markdown table here")
    args = parser.parse_args()
    if args.torch_threads:
        th.set_num_threads(args.torch_threads)

    env_rates = {mode: env_rate(args, mode) for mode in sorted({mode for _, mode in CASES})}
    print("env steps/s with random actions: " + ", ".join(f"{m} {r:.0f}" for m, r in env_rates.items()), flush=True)
    rows = []
    for algo, mode in CASES:
        for variant in variants(mode, args.skip_baseline):
            rows.append(Row(algo, mode, variant, train_rate(args, algo, mode, variant)))
            print(f"{algo:>12} {mode:>6} {variant:>11}: {rows[-1].steps_per_s:7.1f} steps/s", flush=True)
    cartpole = cartpole_rate(args)
    print(f"{'ppo':>12} {'cartpole':>6} {'stock':>11}: {cartpole:7.1f} steps/s", flush=True)
    report = table(rows, env_rates) + f"\n| ppo | CartPole-v1 | MlpPolicy | {cartpole:.0f} | - | - |"
    print(report)
    if args.out is not None:
        args.out.write_text(report + "\n")


if __name__ == "__main__":
    main()
