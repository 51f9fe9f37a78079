"""Action granularities for learned agents, as Gymnasium wrappers over the serving env.

Each wrapper maps the agent's action plus the current observation to the env's ``MultiDiscrete`` admission
action through a pure function, so a trained agent can later drive the unwrapped env as a policy.

* :class:`AdmitMask` - ``MultiDiscrete([2] * W)``: admit each visible slot or not, in queue order, with
  ``action_masks()`` for MaskablePPO (empty slots may only be 0).
* :class:`TokenWindow` - ``Box(-1, 1, (1,))``: the agent sets the token window ``H_t`` (log scale between
  ``window_min`` and ``window_max``); requests are admitted in queue order while the running token load plus
  theirs fits under it and their prompts fit in free KV (a learned TWP controller).
* :class:`AdmitCount` - ``Discrete(max_admit + 1)``: how many head-of-queue requests to admit this step
  (a learned flow control).
* :class:`RankAdmit` - ``MultiDiscrete([4, 6])``: an order for the queue (arrival, shortest prompt, shortest
  predicted output, shortest predicted total) and a memory target (the longest prefix in that order whose
  projected peak KV use, at the upper-bound output lengths, stays within 0.4-1.0x the cache, or no projection:
  whatever fits now). It spans FCFS (arrival, no projection), shortest-prompt priority and MC-SF (shortest
  output, 1.0x) and everything between, chosen per step (a learned scheduler over interpretable rules).
* :class:`ScoreAdmit` - ``Box(-1, 1, (W + 1,))``: a score per visible queue slot and a memory target; the
  queue is admitted highest score first while the projected peak KV use stays within the target
  (:func:`~servegym.policies.common.admit_by_score`, the parametric scorer's rule). Made for a policy network
  shared across slots, which scores each request from its own features and the engine state; optionally a
  residual on a tuned scorer's decision.
* :class:`ParamsAdmit` - ``Box(-1, 1, (4,))``: a tuned scorer's four parameters, moved each step (a scorer
  whose parameters depend on the state).
* :class:`RouteReplica` - ``Discrete(N)``, the routing env's own action (a routing task's only mode, ``route``):
  the replica that serves the arriving request, seen through the flat observation (:func:`route_observation`),
  with the env's ``action_masks()``.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from servegym.envs.actions import count_action_masks, slot_action_masks
from servegym.envs.observation import (
    QUEUE_INDEX,
    length_mode_of,
    queue_matrix,
    scale_observation,
    scaled_observation_space,
)
from servegym.envs.tasks import TRAIN_SEEDS
from servegym.policies import make_policy
from servegym.policies.base import Observation, admit_first, output_estimate, ranks_action
from servegym.policies.common import (
    admit_by_score,
    fcfs_count,
    remaining_queued,
    remaining_running,
    upper_bound_prefix,
    visible_queue,
)
from servegym.policies.scorer import memory_target as scorer_memory_target
from servegym.policies.scorer import scores as scorer_scores

if TYPE_CHECKING:
    from servegym.policies.scorer import Scorer

MAX_ADMIT = 8
"""Default largest admission count of the ``count`` action mode."""
WINDOW_MIN, WINDOW_MAX = 16.0, 16384.0
"""Default token-window range (tokens) of the ``window`` action mode."""


def window_action(obs: Observation, value: float, window_min: float = WINDOW_MIN, window_max: float = WINDOW_MAX,
                  unknown_output_tokens: float | None = 128.0) -> np.ndarray:
    """Admit in queue order while token load + estimated output stays within the window set by ``value``."""
    frac = (_clip_unit(float(value)) + 1.0) / 2.0
    window = math.exp(math.log(window_min) + frac * (math.log(window_max) - math.log(window_min)))
    # Reductions and searches as ufunc and array methods: numpy's function wrappers cost more than the arithmetic.
    load = float(np.add.reduce(remaining_running(obs, unknown_output_tokens)))
    rows = visible_queue(obs)
    want = remaining_queued(obs, rows, unknown_output_tokens)
    by_window = int((load + want.cumsum()).searchsorted(window, side="right"))
    return admit_first(obs, min(by_window, fcfs_count(obs)))


def count_action(obs: Observation, count: int) -> np.ndarray:
    """Admit the first ``count`` visible requests (all of them when fewer are visible)."""
    if count < 0:
        raise ValueError(f"an admit count must be >= 0, got {count}")
    return admit_first(obs, min(int(count), visible_queue(obs).shape[0]))


RANK_ORDERS = ("arrival", "shortest_prompt", "shortest_output", "shortest_total")
RANK_MEMORY_TARGETS = (0.4, 0.55, 0.7, 0.85, 1.0, math.inf)
"""Fractions of the KV cache the projected peak may reach; ``inf``: no projection, admit what fits now."""


def rank_grid() -> dict[str, list]:
    """The rank mode's action meaning, recorded with a trained run (``inf`` as a string: strict JSON)."""
    targets = [str(t) if math.isinf(t) else t for t in RANK_MEMORY_TARGETS]
    return {"orders": list(RANK_ORDERS), "memory_targets": targets}


def rank_action(obs: Observation, order: int, target: int) -> np.ndarray:
    """Admit in ``RANK_ORDERS[order]`` the longest prefix within ``RANK_MEMORY_TARGETS[target]`` (see
    :class:`RankAdmit`)."""
    if not (0 <= order < len(RANK_ORDERS) and 0 <= target < len(RANK_MEMORY_TARGETS)):
        raise ValueError(f"a rank action is (order in [0, {len(RANK_ORDERS) - 1}], memory target in "
                         f"[0, {len(RANK_MEMORY_TARGETS) - 1}]), got ({order}, {target})")
    rows = visible_queue(obs)
    if rows.shape[0] == 0:
        return admit_first(obs, 0)
    prompt = rows[:, QUEUE_INDEX["num_prompt_tokens"]]
    output = output_estimate(rows[:, QUEUE_INDEX["output_lo"]], rows[:, QUEUE_INDEX["output_hi"]],
                             length_mode_of(obs), None)
    key = {"arrival": None, "shortest_prompt": prompt, "shortest_output": output,
           "shortest_total": prompt + output}[RANK_ORDERS[order]]
    ranked = np.arange(rows.shape[0]) if key is None else np.argsort(key, kind="stable")
    scale = RANK_MEMORY_TARGETS[target]
    count = fcfs_count(obs, ranked) if math.isinf(scale) else upper_bound_prefix(obs, ranked, scale)
    return ranks_action(obs, ranked[:count])


SCORE_TARGETS = (0.3, 1.5)
"""The ``score`` mode's memory target range: fractions of the cache the projected peak may reach, for actions
-1 and 1 (linear between)."""
SCORE_SCALE = 1e5
"""A scorer's scores (tokens) enter the ``score`` mode as ``symlog(score) / symlog(SCORE_SCALE)``."""
RESIDUAL_SCALE = 0.2
"""Default reach of a residual ``score`` action (see :class:`ScoreAdmit`)."""


def _symlog(x: np.ndarray | float) -> np.ndarray:
    return np.sign(x) * np.log1p(np.abs(x))


_SYMLOG_SCALE = _symlog(SCORE_SCALE)
"""``symlog(SCORE_SCALE)``, the divisor of the ``score`` mode's mapped scores, computed once. A NumPy float64, not a
Python float: a scorer's float32 scores (predicted lengths) are divided in float64, as ``_symlog(SCORE_SCALE)`` did."""


def _mapped_scores(scorer: Scorer, obs: Observation) -> np.ndarray:
    """The scorer's scores of the visible queue, mapped monotonically (the order, all the rule reads, is kept)."""
    return _symlog(scorer.scores(obs)) / _SYMLOG_SCALE


def scorer_action(scorer: Scorer, obs: Observation) -> np.ndarray:
    """The scorer's decision at ``obs`` as a ``score``-mode action: its mapped scores clipped to the action space
    (which can tie scores past :data:`SCORE_SCALE`), zeros on empty slots, and its memory target."""
    width = queue_matrix(obs).shape[0]
    action = np.zeros(width + 1, dtype=np.float64)
    mapped = _mapped_scores(scorer, obs)
    action[: mapped.size] = np.clip(mapped, -1.0, 1.0)
    action[width] = score_target_value(scorer.memory_target(obs))
    return action


def score_action(obs: Observation, action: np.ndarray, base: Scorer | None = None,
                 residual_scale: float = RESIDUAL_SCALE) -> np.ndarray:
    """The ``score`` mode: ``action[:W]`` scores the queue slots, ``action[W]`` in [-1, 1] sets the memory target
    in :data:`SCORE_TARGETS`; with a ``base`` scorer the action is a residual on its decision (see
    :class:`ScoreAdmit`)."""
    values = np.asarray(action, dtype=np.float64).reshape(-1)
    width = queue_matrix(obs).shape[0]
    if values.size != width + 1:
        raise ValueError(f"a score action has {width + 1} values ({width} slot scores and a memory target), got "
                         f"{values.size}")
    low, high = SCORE_TARGETS
    if base is not None:
        residual = _clip_unit(values) * residual_scale
        # A slot's score moves by a factor exp(residual_scale) at most; the target from the scorer's own (not
        # clipped to SCORE_TARGETS) by what residual_scale moves an action value.
        scores = residual[:width] / _SYMLOG_SCALE
        mapped = _mapped_scores(base, obs)  # not clipped: past SCORE_SCALE the scorer's order still holds
        scores[: mapped.size] += mapped
        target = max(0.05, base.memory_target(obs) + residual[width] * (high - low) / 2.0)
        return admit_by_score(obs, scores, target)
    target = low + (_clip_unit(float(values[width])) + 1.0) / 2.0 * (high - low)
    return admit_by_score(obs, values[:width], target)


def score_target_value(fraction: float) -> float:
    """The action value in [-1, 1] that sets the ``score`` mode's memory target nearest to ``fraction``."""
    low, high = SCORE_TARGETS
    return float(np.clip(2.0 * (fraction - low) / (high - low) - 1.0, -1.0, 1.0))


def score_base(params: dict[str, Any] | None) -> Scorer | None:
    """The base of a residual agent (``score`` or ``params`` mode): a scorer with these parameters, or None."""
    return None if params is None else make_policy("scorer", **params)


PARAMS_REACH = (0.7, 0.7, 0.2, 0.2)
"""The ``params`` mode's reach per action value: ``output_weight`` and ``wait_weight`` scale as ``(1 + w) x
exp(0.7 a) - 1`` (an action of 1 roughly doubles ``1 + w``), ``target_base`` and ``target_slope`` move by
``0.2 a``."""


def state_params(base: Scorer, action: np.ndarray) -> tuple[float, float, float, float]:
    """The scorer's parameters this step: ``base``'s moved by ``action`` (four values in [-1, 1], clipped)."""
    values = np.asarray(action, dtype=np.float64).reshape(-1).tolist()  # per step: floats, not numpy calls
    if len(values) != len(PARAMS_REACH) or not all(math.isfinite(v) for v in values):
        raise ValueError(f"a params action is {len(PARAMS_REACH)} finite values, got {values}")
    a = [_clip_unit(v) * reach for v, reach in zip(values, PARAMS_REACH, strict=True)]
    p = base.params
    return (max(0.0, (1.0 + p.output_weight) * math.exp(a[0]) - 1.0),
            max(0.0, (1.0 + p.wait_weight) * math.exp(a[1]) - 1.0),
            max(0.05, p.target_base + a[2]), _clip_unit(p.target_slope + a[3]))


def _clip_unit(values: Any) -> Any:
    """``np.clip(values, -1.0, 1.0)`` (NaN stays NaN), without its Python wrappers: a float for a float, else
    an array (the per-step path of the ``score`` mode, where ``np.clip`` cost more than the action's decoding)."""
    if isinstance(values, float):
        return values if values != values else min(1.0, max(-1.0, values))
    return np.minimum(np.maximum(values, -1.0), 1.0)


def params_action(obs: Observation, action: np.ndarray, base: Scorer) -> np.ndarray:
    """The ``params`` mode: the scorer's rule with this step's parameters (see :class:`ParamsAdmit`)."""
    output_weight, wait_weight, target_base, target_slope = state_params(base, action)
    return admit_by_score(obs, scorer_scores(obs, output_weight, wait_weight),
                          scorer_memory_target(obs, target_base, target_slope))


class _ObservingWrapper(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Keeps the latest observation so the action mapping can read it."""

    def reset(self, **kwargs: Any) -> tuple[Observation, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self._obs = obs
        return obs, info

    def step(self, action: Any) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(self.to_env_action(self._obs, action))
        self._obs = obs
        return obs, reward, terminated, truncated, info

    def to_env_action(self, obs: Observation, action: Any) -> np.ndarray:
        raise NotImplementedError


class AdmitMask(_ObservingWrapper):
    """``MultiDiscrete([2] * W)``: 1 admits the slot; admitted slots go in queue order."""

    def __init__(self, env: gym.Env) -> None:
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)
        self.width = env.unwrapped.queue_window
        self.action_space = spaces.MultiDiscrete(np.full(self.width, 2, dtype=np.int64))

    def to_env_action(self, obs: Observation, action: Any) -> np.ndarray:
        return np.asarray(action, dtype=np.int64)

    def action_masks(self) -> np.ndarray:
        """Flat ``(W * 2,)`` booleans: value 0 always allowed, value 1 only on occupied slots."""
        return slot_action_masks(self.width, self.env.unwrapped.num_visible, 2)


class TokenWindow(_ObservingWrapper):
    """``Box(-1, 1, (1,))``: the token window on a log scale between ``window_min`` and ``window_max`` tokens."""

    def __init__(self, env: gym.Env, window_min: float = WINDOW_MIN, window_max: float = WINDOW_MAX,
                 unknown_output_tokens: float | None = 128.0) -> None:
        gym.utils.RecordConstructorArgs.__init__(self, window_min=window_min, window_max=window_max,
                                                 unknown_output_tokens=unknown_output_tokens)
        gym.Wrapper.__init__(self, env)
        if not 0 < window_min < window_max:
            raise ValueError(f"need 0 < window_min < window_max, got {window_min}, {window_max}")
        self.window_min, self.window_max, self.unknown_output_tokens = window_min, window_max, unknown_output_tokens
        self.action_space = spaces.Box(-1.0, 1.0, (1,), dtype=np.float32)

    def to_env_action(self, obs: Observation, action: Any) -> np.ndarray:
        value = float(np.asarray(action, dtype=np.float64).reshape(-1)[0])
        if not math.isfinite(value):
            raise ValueError(f"window action must be finite, got {value}")
        return window_action(obs, value, self.window_min, self.window_max, self.unknown_output_tokens)


class AdmitCount(_ObservingWrapper):
    """``Discrete(max_admit + 1)``: admit that many requests from the queue head this step."""

    def __init__(self, env: gym.Env, max_admit: int = MAX_ADMIT) -> None:
        gym.utils.RecordConstructorArgs.__init__(self, max_admit=max_admit)
        gym.Wrapper.__init__(self, env)
        if max_admit < 1:
            raise ValueError(f"max_admit must be >= 1, got {max_admit}")
        self.action_space = spaces.Discrete(max_admit + 1)

    def to_env_action(self, obs: Observation, action: Any) -> np.ndarray:
        count = int(np.asarray(action).reshape(-1)[0])
        if not 0 <= count < self.action_space.n:
            raise ValueError(f"an admit count must be in [0, {self.action_space.n - 1}] (the action space), "
                             f"got {count}")
        return count_action(obs, count)

    def action_masks(self) -> np.ndarray:
        """Counts up to the number of visible waiting requests."""
        return count_action_masks(self.action_space.n, self.env.unwrapped.num_visible)


class TrainSeeds(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Resets without a seed take the next seed of the stream ``start, start + stride, ...`` folded into
    :data:`~servegym.envs.tasks.TRAIN_SEEDS`, so training never sees a validation or test episode and every
    training episode is reproducible from its seed (``last_seed``)."""

    def __init__(self, env: gym.Env, start: int, stride: int = 1) -> None:
        gym.utils.RecordConstructorArgs.__init__(self, start=start, stride=stride)
        gym.Wrapper.__init__(self, env)
        if stride < 1:
            raise ValueError(f"stride must be >= 1, got {stride}")
        self.start, self.stride, self.count = start, stride, 0
        self.last_seed: int | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Observation,
                                                                                              dict[str, Any]]:
        if seed is None:
            seed = TRAIN_SEEDS[(self.start + self.count * self.stride) % len(TRAIN_SEEDS)]
            self.count += 1
        elif seed not in TRAIN_SEEDS:
            raise ValueError(f"training seed {seed} is outside TRAIN_SEEDS {TRAIN_SEEDS}")
        self.last_seed = int(seed)
        return self.env.reset(seed=self.last_seed, options=options)


class RankAdmit(_ObservingWrapper):
    """``MultiDiscrete([4, 6])``: a queue order and a memory target (see :func:`rank_action`)."""

    def __init__(self, env: gym.Env) -> None:
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)
        self.action_space = spaces.MultiDiscrete([len(RANK_ORDERS), len(RANK_MEMORY_TARGETS)])

    def to_env_action(self, obs: Observation, action: Any) -> np.ndarray:
        order, target = (int(v) for v in np.asarray(action).reshape(-1)[:2])
        return rank_action(obs, order, target)


class ScoreAdmit(_ObservingWrapper):
    """``Box(-1, 1, (W + 1,))``: W slot scores, then the memory target (see :func:`score_action`).

    With ``base`` (a ``scorer``'s parameters) the action is a residual on that scorer's decision (residual
    reinforcement learning): action 0 admits exactly what the scorer admits, and action ``a`` multiplies slot
    ``i``'s score by up to ``exp(a_i x residual_scale)`` and moves the scorer's memory target by ``a_W x
    residual_scale x 0.6`` of the cache (what ``residual_scale`` moves an action value, over
    :data:`SCORE_TARGETS`), floored at 0.05 like the scorer's. An agent starts at the tuned scorer and learns
    only what the formula misses.
    """

    def __init__(self, env: gym.Env, base: dict[str, Any] | None = None,
                 residual_scale: float = RESIDUAL_SCALE) -> None:
        gym.utils.RecordConstructorArgs.__init__(self, base=base, residual_scale=residual_scale)
        gym.Wrapper.__init__(self, env)
        if not (math.isfinite(residual_scale) and residual_scale > 0):
            raise ValueError(f"residual_scale must be finite and > 0, got {residual_scale!r}")
        self.width = env.unwrapped.queue_window
        self.base, self.residual_scale = score_base(base), residual_scale
        self.action_space = spaces.Box(-1.0, 1.0, (self.width + 1,), dtype=np.float32)

    def to_env_action(self, obs: Observation, action: Any) -> np.ndarray:
        return score_action(obs, action, self.base, self.residual_scale)


class ParamsAdmit(_ObservingWrapper):
    """``Box(-1, 1, (4,))``: the four parameters of a ``base`` scorer, moved per step (see :data:`PARAMS_REACH`).

    A scorer whose parameters depend on the state: action 0 is the base scorer exactly, and an agent can, say,
    weigh output lengths more when the cache is small or loosen the memory target late in an episode. Four
    numbers per step instead of a score per slot: a low-dimensional residual for any SB3 algorithm.
    """

    def __init__(self, env: gym.Env, base: dict[str, Any] | None = None) -> None:
        gym.utils.RecordConstructorArgs.__init__(self, base=base)
        gym.Wrapper.__init__(self, env)
        if base is None:
            raise ValueError("the params mode needs a base scorer's parameters (TrainConfig.score_base)")
        self.base = score_base(base)
        self.action_space = spaces.Box(-1.0, 1.0, (len(PARAMS_REACH),), dtype=np.float32)

    def to_env_action(self, obs: Observation, action: Any) -> np.ndarray:
        return params_action(obs, action, self.base)


class ScaledObservation(gym.ObservationWrapper, gym.utils.RecordConstructorArgs):
    """The agent's view: every feature on a symmetric log scale, bounded
    (:func:`~servegym.envs.observation.scale_observation`). Outermost, so the action mode still maps from the raw
    observation."""

    def __init__(self, env: gym.Env) -> None:
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.ObservationWrapper.__init__(self, env)
        if not isinstance(env.observation_space, spaces.Dict):
            raise ValueError("ScaledObservation scales the Dict observation (make the env without flat_obs)")
        self.observation_space = scaled_observation_space(env.observation_space)

    def observation(self, observation: Observation) -> Observation:
        return scale_observation(observation)


def route_observation(obs: Observation | np.ndarray) -> np.ndarray:
    """A routing observation as the ``route`` mode's agent sees it: ``spaces.flatten`` of the routing env's Dict
    (``replicas`` row by row, then ``request``; what ``flat_obs=True`` gives), float32. A flat one is kept."""
    if not isinstance(obs, dict):
        return np.asarray(obs, dtype=np.float32).reshape(-1)
    return spaces.flatten(_route_space(obs["replicas"].shape, obs["request"].shape), obs).astype(np.float32, copy=False)


@functools.lru_cache(maxsize=8)
def _route_space(replicas: tuple[int, ...], request: tuple[int, ...]) -> spaces.Dict:
    from servegym.envs.routing import MAX_FEATURE

    return spaces.Dict({"replicas": spaces.Box(0.0, MAX_FEATURE, replicas, np.float32),
                        "request": spaces.Box(0.0, MAX_FEATURE, request, np.float32)})


def route_masks(obs: Observation | np.ndarray, num_replicas: int) -> np.ndarray:
    """The replicas a request may be routed to, read from a routing observation (Dict or flat) as the env's
    ``action_masks()`` gives them: those that can hold it, every replica when none can (or none is arriving)."""
    from servegym.envs.routing import REPLICA_FEATURES

    column = REPLICA_FEATURES.index("fits")
    flat = route_observation(obs)
    fits = flat[: num_replicas * len(REPLICA_FEATURES)].reshape(num_replicas, -1)[:, column] > 0
    return fits if fits.any() else np.ones(num_replicas, dtype=bool)


class RouteReplica(gym.ObservationWrapper, gym.utils.RecordConstructorArgs):
    """The ``route`` mode over a routing env (:class:`~servegym.envs.routing.RoutingEnv`): its ``Discrete(N)``
    action unchanged (a replica index, passed on as ``np.int64``), its observation flattened
    (:func:`route_observation`) for an MLP, and its ``action_masks()`` for MaskablePPO."""

    def __init__(self, env: gym.Env) -> None:
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.ObservationWrapper.__init__(self, env)
        space = env.observation_space
        routing = isinstance(space, spaces.Dict) and set(space.spaces) == {"replicas", "request"}
        flat = isinstance(space, spaces.Box) and len(space.shape) == 1
        if not isinstance(env.action_space, spaces.Discrete) or not (routing or flat):
            raise ValueError("the route mode acts on a routing task's env (RoutingEnv: a Discrete replica action "
                             f"and the replicas/request observation), got {space} and {env.action_space}")
        self.num_replicas = int(env.action_space.n)
        self.observation_space = spaces.flatten_space(space) if isinstance(space, spaces.Dict) else space

    def observation(self, observation: Observation | np.ndarray) -> np.ndarray:
        return route_observation(observation)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        chosen = np.asarray(action)
        if chosen.size == 1 and chosen.dtype.kind in "iu":  # a vectorised env's or predict()'s int array
            action = np.int64(chosen.reshape(-1)[0])
        return super().step(action)

    def action_masks(self) -> np.ndarray:
        """The routing env's mask: replicas that can hold the arriving request."""
        return self.env.get_wrapper_attr("action_masks")()


OBSERVATIONS = ("raw", "scaled")
"""What a learning agent observes: the env's Dict (``raw``) or :class:`ScaledObservation` (``scaled``)."""


MODES = {"admit": AdmitMask, "window": TokenWindow, "count": AdmitCount, "rank": RankAdmit, "score": ScoreAdmit,
         "params": ParamsAdmit, "route": RouteReplica}
"""Action modes: ``admit`` (per-slot mask), ``window`` (continuous token window), ``count`` (discrete),
``rank`` (an order and a memory target), ``score`` (slot scores and a memory target), ``params`` (a base
scorer's parameters, per step); on a routing task ``route`` (the replica of each arrival)."""
ROUTE_MODE = "route"
"""The action mode of a routing task (``Task.decision == "route"``), and its only one."""


def wrap(env: gym.Env, mode: str, **mode_kwargs: Any) -> gym.Env:
    """``env`` in action mode ``mode`` (``raw``: unwrapped), the mode's wrapper built with ``mode_kwargs``."""
    if mode == "raw":
        return env
    if mode not in MODES:
        raise ValueError(f"unknown action mode {mode!r}; choose from {['raw', *MODES]}")
    return MODES[mode](env, **mode_kwargs)
