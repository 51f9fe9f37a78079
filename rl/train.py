"""Train stable-baselines3 agents on the serving env (extra ``rl``).

A run directory ``runs/<env>__<algo>__<mode>__<workload>__s<seed>`` holds ``model.zip`` (final),
``best_model.zip`` (best periodic evaluation on held-out seeds), ``vecnormalize.pkl`` (observation and reward
statistics), ``config.json`` and TensorBoard logs (SB3's namespaced ``rollout/``, ``train/``, ``eval/`` tags).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from servegym import ENV_ID
from servegym.rl.wrappers import wrap

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm

ALGOS = ("ppo", "a2c", "dqn", "sac", "maskable-ppo")
DEFAULT_MODE = {"ppo": "count", "a2c": "count", "dqn": "count", "sac": "window", "maskable-ppo": "admit"}
COMPATIBLE = {"ppo": {"admit", "window", "count"}, "a2c": {"admit", "window", "count"}, "dqn": {"count"},
              "sac": {"window"}, "maskable-ppo": {"admit", "count"}}
EVAL_SEED_BASE = 100_000
"""Periodic evaluation uses seeds from here on, apart from training seeds and the compare seeds 0.."""


@dataclass(frozen=True)
class TrainConfig:
    """One training run; every field is recorded in the run's ``config.json``."""

    algo: str = "ppo"
    mode: str | None = None
    """Action mode (see :mod:`servegym.rl.wrappers`); default per algorithm: PPO/A2C/DQN count, SAC window,
    MaskablePPO admit."""
    workload: str = "burst"
    timesteps: int = 100_000
    seed: int = 0
    n_envs: int = 2
    max_episode_steps: int = 3000
    eval_freq: int = 20_000
    """Timesteps between evaluations (summed over the vectorised envs)."""
    eval_episodes: int = 3
    normalize: bool = True
    engine: dict[str, Any] = field(default_factory=lambda: {"length_mode": "predicted"})
    hyperparams: dict[str, Any] = field(default_factory=dict)
    out: str = "runs"

    def __post_init__(self) -> None:
        if self.algo not in ALGOS:
            raise ValueError(f"algo must be one of {ALGOS}, got {self.algo!r}")
        if self.resolved_mode not in COMPATIBLE[self.algo]:
            raise ValueError(f"{self.algo} cannot use mode {self.resolved_mode!r}; it supports "
                             f"{sorted(COMPATIBLE[self.algo])}")
        if self.timesteps < 1 or self.n_envs < 1:
            raise ValueError("timesteps and n_envs must be >= 1")

    @property
    def resolved_mode(self) -> str:
        return self.mode or DEFAULT_MODE[self.algo]

    @property
    def run_name(self) -> str:
        return f"Serving-v0__{self.algo}__{self.resolved_mode}__{self.workload}__s{self.seed}"


def make_training_env(workload: str, mode: str, engine: dict[str, Any], max_episode_steps: int) -> gym.Env:
    from stable_baselines3.common.monitor import Monitor

    env = gym.make(ENV_ID, workload=workload, engine=engine, max_episode_steps=max_episode_steps)
    return wrap(Monitor(env), mode)


def _vec_env(cfg: TrainConfig, n: int, seed: int, subprocess: bool):
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    factory = partial(make_training_env, cfg.workload, cfg.resolved_mode, cfg.engine, cfg.max_episode_steps)
    vec = SubprocVecEnv([factory] * n) if subprocess and n > 1 else DummyVecEnv([factory] * n)
    vec.seed(seed)
    return vec


def algorithm_class(name: str) -> type[BaseAlgorithm]:
    if name == "maskable-ppo":
        from sb3_contrib import MaskablePPO

        return MaskablePPO
    import stable_baselines3

    return getattr(stable_baselines3, name.upper())


def train(cfg: TrainConfig, progress: bool = True, subprocess: bool = True) -> Path:
    """Train, evaluating periodically on held-out seeds; return the run directory."""
    from stable_baselines3.common.callbacks import EvalCallback
    from stable_baselines3.common.vec_env import VecNormalize

    run = Path(cfg.out) / cfg.run_name
    run.mkdir(parents=True, exist_ok=True)
    venv = _vec_env(cfg, cfg.n_envs, cfg.seed, subprocess)
    eval_env = _vec_env(cfg, 1, EVAL_SEED_BASE + cfg.seed, subprocess=False)
    if cfg.normalize:
        venv = VecNormalize(venv, norm_obs=True, norm_reward=True, gamma=cfg.hyperparams.get("gamma", 0.99))
        eval_env = VecNormalize(eval_env, norm_obs=True, norm_reward=False, training=False)
    algo = algorithm_class(cfg.algo)
    model = algo("MultiInputPolicy", venv, seed=cfg.seed, verbose=0, tensorboard_log=str(run / "tb"),
                 **cfg.hyperparams)
    if cfg.algo == "maskable-ppo":
        from sb3_contrib.common.maskable.callbacks import MaskableEvalCallback as Eval
    else:
        Eval = EvalCallback
    callback = Eval(eval_env, best_model_save_path=str(run), log_path=str(run / "eval"),
                    eval_freq=max(1, cfg.eval_freq // cfg.n_envs), n_eval_episodes=cfg.eval_episodes,
                    deterministic=True, verbose=0)
    started = time.perf_counter()
    model.learn(total_timesteps=cfg.timesteps, callback=callback, progress_bar=progress, tb_log_name="train")
    wall = time.perf_counter() - started
    model.save(run / "model.zip")
    if cfg.normalize:
        venv.save(str(run / "vecnormalize.pkl"))
    (run / "config.json").write_text(json.dumps({**asdict(cfg), "mode": cfg.resolved_mode, "wall_s": wall,
                                                 "best_mean_reward": float(callback.best_mean_reward)}, indent=2))
    venv.close()
    eval_env.close()
    return run
