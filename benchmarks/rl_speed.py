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

``--section vec`` steps ``--vec-envs`` envs of ``--task`` per action mode with pre-drawn random actions: one env
alone, the native vector env (``servegym.rl.vec_env.NativeVecEnv``: all in this process, one call), the same split
over ``--shards`` processes (``servegym.envs.sharded.ShardedVectorEnv``) and SB3's ``SubprocVecEnv`` (one spawned
worker each), side by side, each from the same seeds with the same actions (the same episodes), each rate timed
after the same ``WARMUP_STEPS`` untimed vector steps. ``--vec-rounds R`` measures every column R times, round after
round, and sums each mode's ratios up over the rounds (median, min, max): ``SubprocVecEnv``'s own rate moves up to
2x between minutes on a shared machine, so one round's ratio says little. ``--vec-modes`` picks the modes (``route``,
the routing agent's, with ``--task cluster-routing``).
``--section train`` trains PPO in the ``score`` mode
on ``--task`` two ways, each as the current path and as the lean one, with the same rollout size, minibatch,
epochs and learning rate: the shipped recipe (``SubprocVecEnv`` of 2, 2048 steps per env, minibatch 512, 4
epochs, the score network on every row, one torch thread) against the native vector env of ``--train-envs`` and
the packed network, updating with ``servegym train``'s default threads (one), in one process and sharded over
``--shards``, and sharded with ``--update-threads`` for the updates (rollouts keep one): the whole machine, where
nothing else runs on it; and this benchmark's
own PPO settings (one env, 512 / 64 / 10 epochs; lean: 16 native envs). The current paths run today's network
code (its tanh, layers, head and optimiser changes speed them up too), so a ratio here understates the gain over
the code of before (``benchmarks/side_by_side.sh`` runs an older commit's). Each row says where the wall time
went: stepping the envs, the rollout's forward passes, the update's forward passes and its backward passes and
optimiser steps (the rest: buffers, GAE, logging).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch as th
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv

from servegym.rl.config import TrainConfig
from servegym.rl.fast_dist import policy_for
from servegym.rl.threads import UpdateThreads
from servegym.rl.train import algorithm_class, make_training_env
from servegym.validation import count_arg

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


VEC_MODES = ("admit", "count", "window", "rank", "score", "params")


def vec_rates(args: argparse.Namespace) -> str:
    """Env steps per second per action mode: one env, the native vector env (in one process and sharded) and
    SubprocVecEnv of ``vec_envs``; with ``vec_rounds`` > 1 the columns are measured that many times, round after
    round (so each round's ratios are side by side in time), and the ratios are summarised per mode."""
    from stable_baselines3.common.vec_env import SubprocVecEnv

    from servegym.rl.vec_env import NativeVecEnv

    n = args.vec_envs
    lines = [f"| mode | round | one env | native x{n} | native x{n}, {args.shards} processes | SubprocVecEnv x{n} | "
             "native / SubprocVecEnv | sharded / SubprocVecEnv |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    ratios: dict[str, list[tuple[float, float]]] = {mode: [] for mode in args.vec_modes}
    for r in range(args.vec_rounds):
        for mode in args.vec_modes:
            factory = partial(_task_env, args.task, mode)
            single = _sb3_rate(partial(DummyVecEnv, [factory]), args.vec_steps * n)
            native = _sb3_rate(partial(NativeVecEnv, [factory] * n), args.vec_steps)
            sharded = _sb3_rate(partial(NativeVecEnv, [factory] * n, args.shards), args.vec_steps)
            workers = _sb3_rate(partial(SubprocVecEnv, [factory] * n, start_method="spawn"), args.vec_steps)
            ratios[mode].append((native / workers, sharded / workers))
            lines.append(f"| {mode} | {r + 1} | {single:.0f} | {native:.0f} | {sharded:.0f} | {workers:.0f} | "
                         f"{native / workers:.1f}x | {sharded / workers:.1f}x |")
            print(lines[-1], flush=True)
    if args.vec_rounds > 1:
        lines += ["", *ratio_summary(ratios)]
    return "\n".join(lines)


def ratio_summary(ratios: dict[str, list[tuple[float, float]]]) -> list[str]:
    """The vec section's ratios over its rounds, per mode: (native, sharded) / SubprocVecEnv, one pair a round."""
    lines = ["| mode | rounds | native / SubprocVecEnv: median [min, max] | sharded / SubprocVecEnv: median [min, "
             "max] |", "|---|---:|---:|---:|"]
    for mode, pairs in ratios.items():
        cells = [f"{np.median(col):.1f}x [{min(col):.1f}, {max(col):.1f}]" for col in zip(*pairs, strict=True)]
        lines.append(f"| {mode} | {len(pairs)} | {cells[0]} | {cells[1]} |")
    return lines


def _task_env(task: str, mode: str) -> gym.Env:
    case, kwargs, observation = VARIANTS.get(mode, (mode, {}, "raw"))
    return make_training_env({"task": task, "decision_steps": True}, case, None, mode_kwargs=kwargs,
                             observation=observation)


WARMUP_STEPS = 20
"""Vector steps every rate takes before its clock starts (first calls, caches and a spawned worker's first
wake-ups), the same for every column."""


def _sb3_rate(build: Callable[[], VecEnv], steps: int) -> float:
    venv = build()
    try:
        venv.seed(0)
        venv.reset()
        space = venv.action_space
        space.seed(0)
        actions = [np.stack([space.sample() for _ in range(venv.num_envs)]) for _ in range(64)]
        for k in range(WARMUP_STEPS):
            venv.step(actions[k % len(actions)])
        start = time.perf_counter()
        for k in range(WARMUP_STEPS, WARMUP_STEPS + steps):
            venv.step(actions[k % len(actions)])
        return steps * venv.num_envs / (time.perf_counter() - start)
    finally:
        venv.close()


@dataclass(frozen=True)
class TrainPath:
    label: str
    vec: str
    n_envs: int
    n_steps: int
    batch_size: int
    n_epochs: int
    packed: bool
    update_threads: int | None = None
    """Torch threads of the updates; None: the rollouts' (``--torch-threads``), one setting for the whole run."""


def train_paths(n: int, threads: int) -> list[TrainPath]:
    """Pairs (current, lean) with the same rollout size, minibatch and epochs; the lean paths with ``servegym
    train``'s default threads (``TrainConfig.update_threads``, one as the rollouts' by default) and, sharded on
    cores nothing else uses, updating with ``threads``."""
    if 4096 % n or 512 % min(n, 16):
        raise SystemExit(f"--train-envs {n} must divide the recipe's 4,096-step rollout (and, up to 16, 512)")
    default = TrainConfig().update_threads
    return [TrainPath("recipe, current", "subprocess", 2, 2048, 512, 4, False),
            TrainPath("recipe, lean", "native", n, 4096 // n, 512, 4, True, default),
            TrainPath("recipe, lean, sharded", "sharded", n, 4096 // n, 512, 4, True, default),
            TrainPath("recipe, lean, sharded, idle cores", "sharded", n, 4096 // n, 512, 4, True, threads),
            TrainPath("benchmark PPO, current", "dummy", 1, 512, 64, 10, False),
            TrainPath("benchmark PPO, lean", "native", min(n, 16), 512 // min(n, 16), 64, 10, True, default)]


def train_breakdown(args: argparse.Namespace, path: TrainPath) -> dict[str, float]:
    """Train PPO (score mode) on ``args.task`` along ``path`` for ``args.train_steps``; the wall time split."""
    from stable_baselines3.common.vec_env import SubprocVecEnv

    from servegym.rl.vec_env import NativeVecEnv

    factories = [partial(make_training_env, {"task": args.task, "decision_steps": True}, "score", None,
                         (i, path.n_envs)) for i in range(path.n_envs)]
    venv = {"subprocess": partial(SubprocVecEnv, factories, start_method="spawn"),
            "dummy": partial(DummyVecEnv, factories), "native": partial(NativeVecEnv, factories),
            "sharded": partial(NativeVecEnv, factories, args.shards)}[path.vec]()
    venv.seed(0)
    model = algorithm_class("ppo")(policy_for("ppo", venv.action_space, "score"), venv, seed=0, verbose=0,
                                   n_steps=path.n_steps, batch_size=path.batch_size, n_epochs=path.n_epochs,
                                   learning_rate=2e-5, policy_kwargs={"log_std_init": -3.0, "features_extractor_kwargs":
                                                                      {"packed": path.packed}})
    spent = dict.fromkeys(("env", "rollout forward", "update forward", "update"), 0.0)
    _timed_attr(venv, "step", spent, "env")
    _timed_attr(model.policy, "forward", spent, "rollout forward")
    _timed_attr(model.policy, "evaluate_actions", spent, "update forward")
    _timed_attr(model, "train", spent, "update")
    rollout = th.get_num_threads()
    threads = UpdateThreads(path.update_threads or rollout, rollout)
    with validation(False):
        start = time.perf_counter()
        model.learn(total_timesteps=args.train_steps, callback=threads)
        wall = time.perf_counter() - start
    venv.close()
    spent["update backward"] = spent.pop("update") - spent["update forward"]
    spent["other"] = wall - sum(spent.values())
    return {"steps/s": model.num_timesteps / wall, "wall": wall, **spent}


def _timed_attr(owner: object, name: str, spent: dict[str, float], key: str, within: list[bool] | None = None,
                sets: list[bool] | None = None) -> None:
    """Replace ``owner.name`` (an instance attribute from now on) by a wrapper adding its wall time to
    ``spent[key]``; where given, only while ``within[0]`` holds, and with ``sets[0]`` held during the call."""
    inner = getattr(owner, name)

    def timed(*args: object, **kwargs: object) -> object:
        if within is not None and not within[0]:
            return inner(*args, **kwargs)
        if sets is not None:
            sets[0] = True
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[key] += time.perf_counter() - start
            if sets is not None:
                sets[0] = False

    setattr(owner, name, timed)


def train_table(args: argparse.Namespace) -> str:
    keys = ("env", "rollout forward", "update forward", "update backward", "other")
    lines = ["| path | envs | n_steps / batch / epochs | network | update threads | steps/s | vs current | "
             + " | ".join(f"{k} (s)" for k in keys) + " |", "|---|---|---|---|---:|---:|---:|" + "---:|" * len(keys)]
    current = None
    for path in train_paths(args.train_envs, args.update_threads):
        row = train_breakdown(args, path)
        current = row["steps/s"] if path.label.endswith("current") else current
        ratio = "-" if path.label.endswith("current") else f"{row['steps/s'] / current:.1f}x"
        lines.append(f"| {path.label} | {path.vec} x{path.n_envs} | {path.n_steps} / {path.batch_size} / "
                     f"{path.n_epochs} | {'packed' if path.packed else 'every row'} | "
                     f"{path.update_threads or th.get_num_threads()} | "
                     f"{row['steps/s']:.0f} | {ratio} | "
                     + " | ".join(f"{row[k]:.1f}" for k in keys) + " |")
        print(lines[-1], flush=True)
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
    parser.add_argument("--section", choices=("modes", "vec", "train", "all"), default="all",
                        help="modes: the action modes' training rates; vec: one env, the native vector env and "
                             "SubprocVecEnv; train: the score mode's current and lean training paths")
    parser.add_argument("--task", default="memory-tight", help="the task of the vec and train sections")
    envs, steps, workers = count_arg("envs"), count_arg("steps"), count_arg("workers")
    parser.add_argument("--vec-envs", type=envs, default=16, help="envs in the vec section's vector envs")
    parser.add_argument("--vec-steps", type=steps, default=500, help="vector steps per rate in the vec section")
    parser.add_argument("--vec-rounds", type=steps, default=1, help="rounds of the vec section's "
                        "measurements (each round measures every column of every mode once)")
    parser.add_argument("--vec-modes", nargs="+", choices=(*VEC_MODES, "route"), default=list(VEC_MODES),
                        help="the action modes of the vec section (route: with --task cluster-routing)")
    parser.add_argument("--shards", type=workers, default=2, help="processes of the sharded native vector env (vec "
                        "and train sections)")
    parser.add_argument("--train-steps", type=steps, default=16_384, help="timesteps per path in the train section")
    parser.add_argument("--update-threads", type=workers, default=2, help="torch threads of the train section's "
                        "'idle cores' row (servegym train --update-threads)")
    parser.add_argument("--train-envs", type=envs, default=64, help="envs of the train section's lean recipe paths "
                        "(the benchmark's own PPO settings take at most 16: 512 steps a rollout)")
    args = parser.parse_args()
    if args.torch_threads:
        th.set_num_threads(args.torch_threads)
    reports = []
    if args.section in ("vec", "all"):
        reports.append(vec_rates(args))
    if args.section in ("train", "all"):
        reports.append(train_table(args))
    if args.section in ("vec", "train"):
        report = "\n\n".join(reports)
        print(report)
        if args.out is not None:
            args.out.write_text(report + "\n")
        return

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
    report = "\n\n".join([*reports, report])
    print(report)
    if args.out is not None:
        args.out.write_text(report + "\n")


if __name__ == "__main__":
    main()
