"""A training run's settings (:class:`TrainConfig`), apart from the trainer so that the command line can build its
flags from the fields without importing stable-baselines3 or torch."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servegym import ENV_ID
from servegym.envs.tasks import TRAIN_SEEDS, VALIDATION_SEEDS, get_task
from servegym.rl.wrappers import OBSERVATIONS, RESIDUAL_SCALE, ROUTE_MODE
from servegym.validation import count, count_arg

VEC_ENVS = ("native", "sharded", "subprocess")
"""How ``servegym train`` steps its envs: in the training process (default) or one worker process each."""

ALGOS = ("ppo", "a2c", "dqn", "sac", "maskable-ppo")
DEFAULT_MODE = {"ppo": "count", "a2c": "count", "dqn": "count", "sac": "window", "maskable-ppo": "admit"}
COMPATIBLE = {"ppo": {"admit", "window", "count", "rank", "score", "params", ROUTE_MODE},
              "a2c": {"admit", "window", "count", "rank", "score", "params", ROUTE_MODE},
              "dqn": {"count", ROUTE_MODE}, "sac": {"window", "score", "params"},
              "maskable-ppo": {"admit", "count", ROUTE_MODE}}
"""The action modes each algorithm can use. On a routing task (``Task.decision == "route"``) the mode is always
``route``, the default there (:meth:`TrainConfig.resolved_mode`), for PPO, A2C, DQN and MaskablePPO."""
COUNTS = {"timesteps": "steps", "n_envs": "envs", "max_episode_steps": "steps", "eval_freq": "steps",
          "eval_episodes": "seeds", "checkpoint_freq": "steps", "imitate_episodes": "seeds", "torch_threads": "workers",
          "update_threads": "workers"}
"""The config's counts and their kind in :data:`servegym.validation.COUNT_LIMITS` (one rule, one message)."""


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the platform tells it, else the machine's count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@dataclass(frozen=True)
class TrainConfig:
    """One training run; every field is recorded in the run's ``config.json``."""

    algo: str = "ppo"
    mode: str | None = None
    """Action mode (see :mod:`servegym.rl.wrappers`); default per algorithm: PPO/A2C/DQN count, SAC window,
    MaskablePPO admit; on a routing task ``route``, its only mode."""
    task: str | None = None
    """A benchmark task (``servegym tasks``); the fields below override its settings."""
    workload: str | None = None
    """Without a task: the workload (default ``burst``); with one: overrides the task's."""
    profile: str | None = None
    engine: dict[str, Any] = field(default_factory=lambda: {"length_mode": "predicted"})
    pool: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)
    """Other ``gym.make`` arguments, e.g. ``{"decision_steps": true, "reward_half_life_s": 30}``."""
    timesteps: int = field(default=100_000, metadata={"help": "environment steps to train for",
                                                      "type": count_arg("steps")})
    seed: int = field(default=0, metadata={"help": "the run's seed: env i's first training episode is seed + i"})
    n_envs: int = field(default=2, metadata={"help": "training envs, stepped together (see --vec-env)",
                                             "type": count_arg("envs")})
    vec_env: str = field(default="native", metadata={
        "help": "how the training envs step: native, all in the training process in one call "
                "(servegym.rl.vec_env.NativeVecEnv, DummyVecEnv's transitions); sharded, the same split over one "
                "process per CPU core (servegym.envs.sharded.ShardedVectorEnv, the same transitions); subprocess, "
                "one worker process each (SB3's SubprocVecEnv)", "choices": VEC_ENVS})
    max_episode_steps: int | None = field(default=None, metadata={
        "help": "the env's own episode limit (max_steps; default: the task's): a truncation there pays the "
                "truncation penalty, so cutting episodes short never looks good", "type": count_arg("steps")})
    eval_freq: int = field(default=20_000, metadata={
        "help": "timesteps between evaluations (summed over the vectorised envs)", "type": count_arg("steps")})
    eval_episodes: int = field(default=len(VALIDATION_SEEDS), metadata={
        "help": f"validation seeds per evaluation (1-{len(VALIDATION_SEEDS)}, the first of VALIDATION_SEEDS)",
        "type": count_arg("seeds")})
    checkpoint_freq: int = field(default=50_000, metadata={"help": "timesteps between checkpoints",
                                                           "type": count_arg("steps")})
    normalize: bool = True
    hyperparams: dict[str, Any] = field(default_factory=dict)
    reward_scale: float = field(default=1.0, metadata={
        "help": "multiply training rewards by this fixed number (validation and test returns stay in task units): "
                "a scale set per task in the recipe, in place of VecNormalize's drifting running estimate"})
    reward_reference: str | None = None
    """A params file (``servegym tune``'s ``best_params.json``): training rewards become relative to that policy's
    episode on the same seed (:mod:`servegym.rl.reference`); validation and test returns are not."""
    imitate: str | None = None
    """A ``scorer`` params file (``servegym tune``'s ``best_params.json``): before reinforcement learning, the
    ``score``-mode policy is fitted to that scorer's decisions (:mod:`servegym.rl.imitation`). In the ``route``
    mode a router instead, by name (``router-kv-aware``) or params file (``servegym tune --policy router-...``):
    the policy's replica choice is fitted to that router's (:func:`~servegym.rl.imitation.imitate_router`)."""
    imitate_episodes: int = 8
    """Training episodes of the scorer (or router) to imitate."""
    score_base: str | None = None
    """A ``scorer`` params file: in the ``score`` mode the agent's action is a residual on that scorer's decision
    (:class:`~servegym.rl.wrappers.ScoreAdmit`; action 0 is the scorer), in the ``params`` mode it moves that
    scorer's parameters. Read once, into ``score_base_params``."""
    score_base_params: dict[str, Any] | None = None
    """The base scorer's parameters, read from ``score_base`` when the config is made and recorded in
    ``config.json``: the run trains, resumes and plays with these, whatever later happens to the file."""
    residual_scale: float = RESIDUAL_SCALE
    """With ``score_base``: how far an action of 1 moves a score (a factor ``exp(scale)``) and the target."""
    observation: str = field(default="raw", metadata={
        "help": "what the agent sees: raw, the env's Dict (the score network scales it itself), or scaled, every "
                "feature on a bounded log scale with the episode's progress (ScaledObservation; for "
                "MultiInputPolicy agents, with --no-normalize)", "choices": OBSERVATIONS})
    discount_half_life_s: float | None = None
    """PPO and A2C: discount each transition by the simulated seconds it took, ``2 ** (-step_s / half_life)``
    (:mod:`servegym.rl.time_discount`), in place of the per-step ``gamma``."""
    torch_threads: int = 1
    """Torch's intra-op threads in the training process while the envs step (rollouts, evaluations): the
    forward passes are small and the envs' Python needs the core, so one thread is fastest (PPO in ``score``
    mode on 2 busy cores: 300 steps/s with 1, 65 with torch's default)."""
    update_threads: int = field(default=1, metadata={
        "help": "torch threads for each gradient update, while the envs wait: 2 on 2 idle cores trains 25%% faster "
                "(score mode, 64 envs: 3,107 against 2,478 steps/s), but 2.3x slower when another process holds a "
                "core (1,226 against 2,858): more than 1 only where the cores are this run's alone",
        "type": count_arg("workers")})
    out: str = field(default="runs", metadata={"help": "folder for run directories"})

    def __post_init__(self) -> None:
        if self.algo not in ALGOS:
            raise ValueError(f"algo must be one of {ALGOS}, got {self.algo!r}")
        if self.task is not None:
            get_task(self.task)
        self._check_decision()
        if self.resolved_mode not in COMPATIBLE[self.algo]:
            raise ValueError(f"{self.algo} cannot use mode {self.resolved_mode!r}; it supports "
                             f"{sorted(COMPATIBLE[self.algo])}")
        for name, kind in COUNTS.items():
            if name != "max_episode_steps" or self.max_episode_steps is not None:
                object.__setattr__(self, name, count(name, getattr(self, name), kind))
        if not 1 <= self.eval_episodes <= len(VALIDATION_SEEDS):
            raise ValueError(f"eval_episodes must be in [1, {len(VALIDATION_SEEDS)}], got {self.eval_episodes}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or \
                not 0 <= self.seed <= len(TRAIN_SEEDS) - self.n_envs:
            # SB3 seeds env i's first episode with seed + i: it must stay a training seed.
            raise ValueError(f"seed must be in [0, {len(TRAIN_SEEDS) - self.n_envs}] (seed + env index must stay "
                             f"in TRAIN_SEEDS), got {self.seed}")
        if isinstance(self.env, dict) and "split" in self.env:
            raise ValueError(f"env split={self.env['split']!r}: training always uses a task's training data (the "
                             "test split is held out for servegym bench)")
        if not (isinstance(self.reward_scale, int | float) and math.isfinite(self.reward_scale)
                and self.reward_scale > 0):
            raise ValueError(f"reward_scale must be a finite number > 0, got {self.reward_scale!r}")
        if self.imitate is not None and self.resolved_mode == ROUTE_MODE:
            if self.algo not in ("ppo", "a2c", "maskable-ppo"):
                raise ValueError(f"imitate warm-starts PPO, A2C or MaskablePPO in the {ROUTE_MODE!r} mode, not "
                                 f"{self.algo}")
            router_expert(self.imitate)
        elif self.imitate is not None and (self.resolved_mode != "score" or self.algo not in ("ppo", "a2c")):
            raise ValueError(f"imitate warm-starts PPO or A2C in the score mode, not {self.algo} in "
                             f"{self.resolved_mode!r}")
        if self.vec_env not in VEC_ENVS:
            raise ValueError(f"vec_env must be one of {VEC_ENVS}, got {self.vec_env!r}")
        if self.observation not in OBSERVATIONS:
            raise ValueError(f"observation must be one of {OBSERVATIONS}, got {self.observation!r}")
        if self.observation == "scaled" and self.resolved_mode == "score" and self.algo in ("ppo", "a2c"):
            raise ValueError(f"{self.algo} in the score mode has its own network over the raw observation (it scales "
                             "the features itself); observation 'scaled' is for MultiInputPolicy agents")
        if self.imitate is not None and self.score_base is not None:
            raise ValueError("imitate and score_base are two warm starts: a residual agent starts at its base "
                             "scorer already (with head_gain 0, exactly); choose one")
        if self.observation == "scaled" and self.normalize:
            raise ValueError("observation 'scaled' is bounded already: train it without normalize "
                             "(--no-normalize)")
        if self.score_base is not None and self.resolved_mode not in ("score", "params"):
            raise ValueError(f"score_base is the base scorer of the score and params modes, not of "
                             f"{self.resolved_mode!r}")
        if self.score_base is None and self.resolved_mode == "params":
            raise ValueError("the params mode moves a base scorer's parameters: give score_base (a scorer params "
                             "file)")
        if self.score_base is not None and self.score_base_params is None:
            object.__setattr__(self, "score_base_params", scorer_params(self.score_base, "score_base"))
        if not (isinstance(self.residual_scale, int | float) and math.isfinite(self.residual_scale)
                and self.residual_scale > 0):
            raise ValueError(f"residual_scale must be a finite number > 0, got {self.residual_scale!r}")
        if self.score_base is None and self.residual_scale != RESIDUAL_SCALE:
            raise ValueError("residual_scale scales a residual on a base scorer: give score_base too")
        if self.discount_half_life_s is not None:
            if self.algo not in ("ppo", "a2c"):
                raise ValueError(f"discount_half_life_s discounts PPO's and A2C's rollouts, not {self.algo}'s")
            if not (isinstance(self.discount_half_life_s, int | float) and math.isfinite(self.discount_half_life_s)
                    and self.discount_half_life_s > 0):
                raise ValueError(f"discount_half_life_s must be a finite number > 0, got "
                                 f"{self.discount_half_life_s!r}")
        for name in ("engine", "pool", "env", "hyperparams"):
            if not isinstance(getattr(self, name), dict):
                raise ValueError(f"{name} must be a mapping, got {getattr(self, name)!r}")
        if not isinstance(self.normalize, bool):
            raise ValueError(f"normalize must be true or false, got {self.normalize!r}")
        clash = {"task", "workload", "profile", "engine", "pool", "max_episode_steps"} & set(self.env)
        if clash:
            raise ValueError(f"env must not hold {sorted(clash)}: they have their own fields")
        legacy = {"version", "id_task", "unlocked"} & set(self.env)
        if legacy:
            raise ValueError(f"env must not hold {sorted(legacy)}: training runs on the current env version's "
                             "task (another version's windows overlap this one's test data)")

    @property
    def decision(self) -> str:
        """What the task's policies decide: ``"route"`` on a routing task, else ``"admission"``."""
        return get_task(self.task).decision if self.task is not None else "admission"

    @property
    def resolved_mode(self) -> str:
        if self.mode is not None:
            return self.mode
        return ROUTE_MODE if self.decision == "route" else DEFAULT_MODE[self.algo]

    def _check_decision(self) -> None:
        """The route mode on routing tasks only, and only the route mode there; and what it cannot combine with."""
        mode = self.resolved_mode
        if self.decision == "route":
            if mode != ROUTE_MODE:
                raise ValueError(f"task {self.task!r} decides which replica serves each arrival: its only action "
                                 f"mode is {ROUTE_MODE!r} (the default there), not {mode!r}")
            if self.algo not in {a for a, modes in COMPATIBLE.items() if ROUTE_MODE in modes}:
                raise ValueError(f"{self.algo} cannot route: task {self.task!r} (mode {ROUTE_MODE!r}, a Discrete "
                                 "replica action) trains with ppo, maskable-ppo, a2c or dqn")
            unsupported = {"reward_reference": "it replays an admission policy on a single engine",
                           "score_base": "it is an admission scorer",
                           "discount_half_life_s": "a routing step spans many engine iterations and the env "
                                                   "reports no step_s"}
            for name, why in unsupported.items():
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} is not for the {ROUTE_MODE!r} mode: {why}")
            if self.observation != "raw":
                raise ValueError(f"observation {self.observation!r} scales the serving env's admission "
                                 f"observation; the {ROUTE_MODE!r} mode sees the routing env's counts, flattened "
                                 "(normalised by VecNormalize): use observation 'raw'")
        elif mode == ROUTE_MODE:
            where = f"task {self.task!r}" if self.task is not None else \
                f"workload {self.workload or 'burst'!r} (no routing task)"
            raise ValueError(f"the {ROUTE_MODE!r} mode routes arrivals on a routing task (cluster-routing); "
                             f"{where} decides admission: use one of its modes "
                             f"({', '.join(sorted(m for m in COMPATIBLE[self.algo] if m != ROUTE_MODE))})")

    @property
    def run_name(self) -> str:
        env = ENV_ID.split("/")[1]
        mode = f"{self.resolved_mode}-residual" if self.score_base and self.resolved_mode == "score" else \
            self.resolved_mode
        return f"{env}__{self.algo}__{mode}__{self.task or self.workload or 'burst'}__s{self.seed}"

    def env_kwargs(self) -> dict[str, Any]:
        """``gym.make`` arguments: the task's settings with this run's overrides on top."""
        kwargs: dict[str, Any] = {**self.env, "engine": dict(self.engine), "pool": dict(self.pool)}
        if self.task is not None:
            kwargs["task"] = self.task
        if self.workload is not None or self.task is None:
            kwargs["workload"] = self.workload or "burst"
        if self.profile is not None:
            kwargs["profile"] = self.profile
        return kwargs

    def mode_kwargs(self) -> dict[str, Any]:
        """The action mode's wrapper arguments: a residual's base scorer (and the score mode's scale), else none."""
        if self.score_base_params is None:
            return {}
        base = dict(self.score_base_params)
        return {"base": base} if self.resolved_mode == "params" else {"base": base,
                                                                       "residual_scale": self.residual_scale}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrainConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})



def scorer_params(path: str, field_name: str) -> dict[str, Any]:
    """A scorer's parameters from a params file (``servegym tune --policy scorer``'s ``best_params.json``)."""
    from servegym.tuning.study import read_params

    name, params = read_params(path)
    if name != "scorer":
        raise ValueError(f"{field_name}: {path} holds {name!r} parameters; it needs a scorer's (servegym tune "
                         "--policy scorer)")
    return params


def router_expert(spec: str) -> tuple[str, dict[str, Any]]:
    """The router a ``route``-mode agent imitates: a router policy's name (``router-kv-aware``) or a params file of
    one (``servegym tune --policy router-...``'s ``best_params.json``), as ``(name, params)``."""
    from servegym.policies import make_policy

    if Path(spec).is_file():
        from servegym.tuning.study import read_params

        name, params = read_params(spec)
    else:
        name, params = spec, {}
    try:
        decision = make_policy(name, **params).decision
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"imitate: {spec!r} is neither a router policy nor a params file of one ({err})") from None
    if decision != "route":
        raise ValueError(f"imitate: {spec!r} is {name!r}, an admission policy; the {ROUTE_MODE!r} mode imitates a "
                         "router (router-kv-aware, router-least-loaded, ...)")
    return name, params
