"""A task that samples among other tasks per episode, and the env factory behind ``servegym/Serving-v2`` and the
legacy ``-v1`` and ``-v0``."""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from servegym.backends.calibrated import CalibratedBackend
from servegym.engine import Engine, EngineConfig, LengthMode
from servegym.envs.routing import RoutingEnv
from servegym.envs.serving import ServingEnv
from servegym.envs.tasks import SPLITS, Task, get_task
from servegym.pool import Cluster, PoolConfig


class MixtureEnv(gym.Env):
    """
    ## Description

    Several serving envs with the same spaces behind one interface: each `reset` draws one of them uniformly
    with `np_random` and resets it with the same seed (or, without one, a seed drawn from the same
    generator), so one seed fixes both the component and its episode, and the seed splits carry over.
    `info["task"]` names the component; `current` is its `ServingEnv`.

    Spaces, rewards and episode ends are the components' (they must agree on the queue window, the running
    slots, the pool size and the reward).
    """

    metadata: ClassVar[dict[str, Any]] = ServingEnv.metadata

    def __init__(self, components: dict[str, ServingEnv]) -> None:
        if len(components) < 2:
            raise ValueError("a mixture needs at least two components")
        envs = list(components.values())
        first = envs[0]
        for name, env in components.items():
            if env.observation_space != first.observation_space or env.action_space != first.action_space:
                raise ValueError(f"mixture component {name!r} has other spaces than {next(iter(components))!r}")
            if env.reward_name != first.reward_name:
                raise ValueError(f"mixture components disagree on the reward: {env.reward_name!r} vs "
                                 f"{first.reward_name!r}")
        self.components = dict(components)
        self.names = tuple(components)
        self.current = first
        self.current_name = self.names[0]
        self.observation_space = first.observation_space
        self.action_space = first.action_space

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        super().reset(seed=seed)
        self.current_name = self.names[int(self.np_random.integers(len(self.names)))]
        self.current = self.components[self.current_name]
        # The component replays the mixture's own seed, so a training seed never yields a test episode of a
        # component; without one, it draws from the mixture's generator.
        inner = seed if seed is not None else int(self.np_random.integers(2**31 - 1))
        obs, info = self.current.reset(seed=inner, options=options)
        return obs, {**info, "task": self.current_name}

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.current.step(action)
        return obs, reward, terminated, truncated, {**info, "task": self.current_name}

    def render(self) -> str | None:
        return self.current.render()

    def action_masks(self) -> np.ndarray:
        return self.current.action_masks()

    @property
    def num_visible(self) -> int:
        return self.current.num_visible

    @property
    def queue_window(self) -> int:
        return self.current.queue_window

    @property
    def cluster(self) -> Cluster:
        return self.current.cluster

    @property
    def engine(self) -> Engine:
        return self.current.engine


def _check_locked(id_task: str, task: str | Task | None, kwargs: dict[str, Any]) -> None:
    from servegym import ENV_ID, VERSION, task_id

    if kwargs.get("version", VERSION) != VERSION:  # another version's windows overlap this one's test data
        raise ValueError(f"{task_id(id_task)} is version {VERSION} of its task; version={kwargs['version']!r} needs "
                         f"unlocked=True, or use servegym/Serving-v{kwargs['version']} with task={id_task!r}")
    name = task.name if isinstance(task, Task) else task
    if name != id_task:
        raise ValueError(f"{task_id(id_task)} is the task {id_task!r}; it cannot build task={name!r} (use "
                         f"{ENV_ID} with task={name!r})")
    changed = sorted(set(kwargs) & set(LOCKED))
    if changed:
        raise ValueError(f"{task_id(id_task)} fixes {', '.join(changed)}; to change them anyway, pass unlocked=True "
                         f"(recorded in env.spec.kwargs, and such an env is no longer the task), or use "
                         f"gym.make('{ENV_ID}', task={id_task!r}, ...)")


def _merged(base: dict[str, Any], override: EngineConfig | PoolConfig | dict[str, Any] | None) -> Any:
    """A task's engine or pool settings with the caller's on top (a config object replaces them)."""
    if override is None:
        return base
    if isinstance(override, dict):
        return {**base, **override}
    return override


VERSIONS = (0, 1, 2)
"""``servegym/Serving-v{N}``: 2 is current; 1 and 0 are legacy (see :data:`servegym.ENV_CHANGES`)."""
V1_TRUNCATION_PENALTY_S = 600.0
"""Serving-v1's charge per unserved request when the env truncates: ten times v0's 60 s, so that stalling until the
idle guard ends an episode never pays (v0's charge let "never admit" tie FCFS on a heavy long-context window)."""


LOCKED = ("workload", "profile", "engine", "pool", "reward", "max_steps", "idle_guard_steps", "truncation_penalty_s")
"""What a task's own id (``servegym/MemoryTight-v2``) fixes: ``gym.make`` may not change it there (unless
``unlocked=True``)."""


def _legacy_lengths(engine: EngineConfig | dict[str, Any] | None, version: int) -> EngineConfig | dict[str, Any] | None:
    """Engine settings as ``version`` means them: in Serving-v0 and -v1 ``length_mode="predicted"`` was the interval
    that contains the truth (``truth_interval`` now), so their episodes reproduce; v2's ``predicted`` follows a
    published predictor (:mod:`servegym.engine.prediction`). A config object is taken as given."""
    if version < 2 and isinstance(engine, dict) and engine.get("length_mode") == LengthMode.PREDICTED:
        return {**engine, "length_mode": LengthMode.TRUTH_INTERVAL.value}
    return engine


def make_serving_env(task: str | Task | None = None, split: str | None = None, version: int = VERSIONS[-1],
                     id_task: str | None = None, unlocked: bool = False, **kwargs: Any) -> ServingEnv | MixtureEnv:
    """The entry point of ``servegym/Serving-v2`` (and the legacy ``-v1``, ``-v0``): a :class:`ServingEnv` from
    ``kwargs``, or, with ``task``, from the task's settings with ``kwargs`` on top (``engine`` and ``pool`` dicts
    merge key by key). ``split`` (with a task only; default ``"train"``) picks a trace task's training or held-out
    test data; v0 ignores it and charges 60 s per unserved request at truncation, v1 and v2 600 s.

    ``id_task`` is set by a task's own id: that id builds exactly its task, so another ``task`` or any of the
    :data:`LOCKED` settings is refused unless ``unlocked=True``, which ``env.spec.kwargs`` then records
    (``servegym/Serving-v2`` with ``task=`` takes overrides)."""
    if version not in VERSIONS:
        raise ValueError(f"version must be one of {VERSIONS}, got {version!r}")
    if not isinstance(unlocked, bool):
        raise ValueError(f"unlocked must be True or False, got {unlocked!r}")
    if id_task is not None and not unlocked:
        _check_locked(id_task, task, {**kwargs, "version": version})
    if split is not None and task is None:
        raise ValueError(f"split={split!r} picks a task's data; give task=... (or use a task's id, "
                         "servegym/LongContext-v2)")
    split = "train" if split is None else split
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if version >= 1:
        kwargs.setdefault("truncation_penalty_s", V1_TRUNCATION_PENALTY_S)
    if task is None:
        return ServingEnv(**{**kwargs, "engine": _legacy_lengths(kwargs.get("engine"), version)})
    spec = get_task(task)
    if spec.is_mixture:
        return MixtureEnv({name: make_serving_env(name, split, version, **kwargs) for name in spec.components})
    settings = spec.env_kwargs(split, version)
    engine = _legacy_lengths(_merged(settings.pop("engine"), kwargs.pop("engine", None)), version)
    pool = _merged(settings.pop("pool"), kwargs.pop("pool", None))
    if spec.decision == "route":
        return _routing_env(spec, {**settings, **kwargs, "engine": engine, "pool": pool})
    return ServingEnv(**{**settings, **kwargs, "engine": engine, "pool": pool})


def _routing_env(spec: Task, kwargs: dict[str, Any]) -> RoutingEnv:
    """A routing task's env: its serving env with ``Router.AGENT`` and the task's (or ``admission=``) policy
    admitting inside the replicas; ``flat_obs`` flattens the routing observation. The serving env skips the
    iterations with no admission to decide when the admission policy is stateless (the same episode)."""
    from servegym.policies import make_policy

    admission = make_policy(kwargs.pop("admission", spec.admission))
    if admission.decision != "admission":
        raise ValueError(f"admission must be an admission policy, got the {admission.decision} policy "
                         f"{admission.name!r}")
    flat = kwargs.pop("flat_obs", False)
    kwargs.pop("decision_steps", None)
    serving = ServingEnv(**{**kwargs, "pool": {**kwargs["pool"], "router": "agent"},
                            "engine": {**kwargs["engine"], **admission.engine_overrides()},
                            "decision_steps": admission.stateless})
    backend = serving.cluster.engines[0].backend
    admission.bind_profile(backend.profile if isinstance(backend, CalibratedBackend) else None)
    return RoutingEnv(serving, admission, flat_obs=flat)
