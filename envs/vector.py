"""A Gymnasium vector env that steps N serving episodes in one call, in this process."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, create_empty_array, iterate

from servegym.validation import COUNT_LIMITS


class BatchedVectorEnv(VectorEnv):
    """What the native vector envs share: Gymnasium's ``reset``, ``step``, ``call``, ``get_attr``, ``set_attr`` and
    ``render`` over three methods a subclass provides (``reset_env``, ``step_raw`` and ``apply``) and its buffers:
    the observation batch ``_obs``, ``_rewards``, ``_terminations``, ``_truncations``, ``env_infos`` and ``copy``."""

    copy: bool
    env_infos: list[dict[str, Any]]

    def reset(self, *, seed: int | Sequence[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset every sub-env, or with ``options={"reset_mask": mask}`` (a boolean array, one per sub-env) those
        the mask selects, as Gymnasium's ``SyncVectorEnv`` does (the infos then cover those alone)."""
        options = dict(options) if options is not None else None
        mask = checked_reset_mask(options.pop("reset_mask"), self.num_envs) if options and "reset_mask" in options \
            else np.ones(self.num_envs, dtype=np.bool_)
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        for i, s in enumerate(sub_env_seeds(seed, self.num_envs)):
            if mask[i]:
                infos[i] = self.reset_env(i, s, options or None)
        return self._observations(), vector_info(infos)

    def reset_env(self, i: int, seed: int | None = None, options: dict[str, Any] | None = None) -> dict[str, Any]:
        raise NotImplementedError

    @property
    def observations(self) -> Any:
        """The observation batch buffer itself (the next step or reset overwrites it)."""
        return self._obs

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        self.step_raw(actions)
        infos = vector_info(self.env_infos)
        return (self._observations(), self._rewards.copy(), self._terminations.copy(), self._truncations.copy(),
                infos)

    def step_raw(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        raise NotImplementedError

    def apply(self, i: int, fn: Callable[[gym.Env], Any]) -> Any:
        """``fn(sub-env i)``, run where the sub-env lives."""
        raise NotImplementedError

    def _observations(self) -> Any:
        if not self.copy:
            return self._obs
        if isinstance(self._obs, dict):
            return {k: v.copy() for k, v in self._obs.items()}
        return self._obs.copy()

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call ``name`` on every sub-env (an attribute's value when it is not callable), e.g.
        ``call("action_masks")``."""
        return tuple(self.apply(i, EnvCall(name, args, kwargs)) for i in range(self.num_envs))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        return tuple(self.apply(i, EnvCall(name)) for i in range(self.num_envs))

    def set_attr(self, name: str, values: Any) -> None:
        values = values if isinstance(values, list | tuple) else [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(f"set_attr needs one value per sub-env ({self.num_envs}), got {len(values)}")
        for i, value in enumerate(values):
            self.apply(i, EnvSet(name, value))

    def render(self) -> tuple[Any, ...] | None:
        return tuple(self.apply(i, _render) for i in range(self.num_envs))


class ServingVectorEnv(BatchedVectorEnv):
    """
    ## Description

    `num_envs` serving episodes stepped in one call, in one process: each sub-env keeps its own compiled engine,
    and each step writes every sub-env's observation into one preallocated batch (no worker processes, no
    pickling, no pipes). The sub-envs are built by `env_fns`, as for Gymnasium's `SyncVectorEnv`, so an action
    mode's wrappers (`servegym.rl.wrappers`) vectorise unchanged; `gym.make_vec(id, num_envs=N,
    vectorization_mode="vector_entry_point")` and `servegym.make_vec` build the plain env's.

    Episode i is the episode a single env would play: `reset(seed=s)` resets sub-env `i` with seed `s + i` (a
    list gives each its own), and later resets draw from the sub-env's own `np_random`, as a single env's
    unseeded `reset()` does.

    ## Spaces

    `observation_space` and `action_space` are the sub-env's batched by `gymnasium.vector.utils.batch_space`: a
    flat `Box` (with `flat_obs=True`) becomes `(num_envs, n)`, a `Dict` a `Dict` of batched keys, the
    `MultiDiscrete` action `(num_envs, W)`.

    ## Autoreset

    `autoreset_mode="NextStep"` (Gymnasium's default): the step after an episode ends resets that sub-env,
    ignores its action and returns the first observation, reward 0, and neither terminated nor truncated.
    `"SameStep"`: the ending step resets at once and returns the new episode's first observation, the final one in
    `infos["final_obs"]` and the final info in `infos["final_info"]`. `"Disabled"`: an ended sub-env is not stepped
    again until the caller resets it, `reset(options={"reset_mask": mask})` resetting the masked ones. Infos are
    Gymnasium's vector infos: an array per key over the sub-envs and a boolean mask `"_key"` saying which sub-envs
    set it.

    ## Arguments

    | parameter | default | description |
    |-----------|---------|-------------|
    | `env_fns` | | one callable per sub-env, each returning an env with the same spaces |
    | `autoreset_mode` | `NextStep` | `"NextStep"`, `"SameStep"` or `"Disabled"` (the caller resets) |
    | `copy` | `True` | return a copy of the observation batch (False: the buffer the next step overwrites) |
    | `spaces_of` | `None` | the (observation, action) spaces every sub-env must have; `None`: sub-env 0's |
    | `first_index` | `0` | the first sub-env's index in error messages (a shard of a larger vector env) |

    `servegym.envs.sharded.ShardedVectorEnv` splits the sub-envs over worker processes, one such env each.
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]],
                 autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP, copy: bool = True,
                 spaces_of: tuple[spaces.Space, spaces.Space] | None = None, first_index: int = 0) -> None:
        super().__init__()
        if not env_fns:
            raise ValueError("a vector env needs at least one sub-env (env_fns is empty)")
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.copy = bool(copy)
        self.envs = [fn() for fn in env_fns]
        self.num_envs = len(self.envs)
        if len({id(env.unwrapped) for env in self.envs}) != self.num_envs:
            raise ValueError("two env_fns returned the same env instance: each sub-env must be its own env (a "
                             "factory such as lambda: env shares one; build the env inside the callable)")
        first = self.envs[0]
        expected = spaces_of or (first.observation_space, first.action_space)
        for i, env in enumerate(self.envs):
            if (env.observation_space, env.action_space) != expected:
                raise ValueError(f"sub-env {first_index + i}'s spaces differ from sub-env 0's: every sub-env must "
                                 "have the same observation and action spaces (same queue window, slots, "
                                 "containers, mode)")
        self.metadata = {**first.metadata, "autoreset_mode": self.autoreset_mode}
        self.render_mode = first.render_mode
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._obs = create_empty_array(self.single_observation_space, self.num_envs, fn=np.zeros)
        self._write = _row_writer(self.single_observation_space, self._obs)
        self._rewards = np.zeros(self.num_envs, dtype=np.float64)
        self._terminations = np.zeros(self.num_envs, dtype=np.bool_)
        self._truncations = np.zeros(self.num_envs, dtype=np.bool_)
        self._autoreset = np.zeros(self.num_envs, dtype=np.bool_)
        self._started = np.zeros(self.num_envs, dtype=np.bool_)
        self._ended = np.zeros(self.num_envs, dtype=np.bool_)
        """With ``Disabled`` autoreset: sub-envs whose episode ended and that the caller has not reset yet."""
        self.env_infos: list[dict[str, Any]] = [{} for _ in self.envs]
        """Each sub-env's own info from the last step or reset (its final info when it just ended in
        ``SameStep`` mode, under ``"final_info"``, with ``"final_obs"``)."""

    def reset_env(self, i: int, seed: int | None = None, options: dict[str, Any] | None = None) -> dict[str, Any]:
        """Reset sub-env ``i`` alone (``reset`` resets them all): its observation goes into row ``i`` of the batch;
        return its info. For adapters that reset each sub-env with its own seed and options."""
        obs, self.env_infos[i] = self.envs[i].reset(seed=seed, options=options)
        self._write(i, obs)
        self._terminations[i] = self._truncations[i] = self._autoreset[i] = self._ended[i] = False
        self._started[i] = True
        return self.env_infos[i]

    def use_buffer(self, buffer: Any, rewards: np.ndarray | None = None, terminations: np.ndarray | None = None,
                   truncations: np.ndarray | None = None) -> None:
        """Write observations into ``buffer`` (laid out as the batch is: same keys, shapes and dtypes) from now on,
        and the rewards and flags into the given arrays (``(num_envs,)``, float64 and bool); the current values
        are copied into them. Each sub-env's row is written as it steps."""
        _check_buffer(self._obs, buffer)
        _copy_into(buffer, self._obs)
        self._obs = buffer
        self._write = _row_writer(self.single_observation_space, self._obs)
        for name, array in (("_rewards", rewards), ("_terminations", terminations), ("_truncations", truncations)):
            if array is not None:
                _check_buffer(getattr(self, name), array)
                array[...] = getattr(self, name)
                setattr(self, name, array)

    def step_raw(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        """One step of every sub-env, returned without copies or vector infos: the observation batch, rewards,
        terminations and truncations (buffers the next call overwrites) and each sub-env's own info dict (for
        adapters such as SB3's ``VecEnv`` that want per-env infos)."""
        return self.step_rows(batch_actions(self.action_space, actions))

    def step_rows(self, rows: Sequence[Any]) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        """:meth:`step_raw` with the actions already split, one per sub-env (an array's rows or a list). Each
        sub-env's flags are kept as it steps, so a sub-env's exception leaves those stepped before it right (one
        that ended is reset at the next step)."""
        require_started(self._started, self._ended)
        if len(rows) != self.num_envs:
            raise ValueError(f"step_rows needs one action per sub-env ({self.num_envs}), got {len(rows)}")
        next_step, disabled = (self.autoreset_mode == AutoresetMode.NEXT_STEP,
                               self.autoreset_mode == AutoresetMode.DISABLED)
        for i, action in enumerate(rows):
            env, infos = self.envs[i], self.env_infos
            if self._autoreset[i]:  # NextStep: the step after an end resets and ignores the action
                obs, infos[i] = env.reset()
                self._rewards[i], self._terminations[i], self._truncations[i] = 0.0, False, False
                self._autoreset[i] = False
                self._write(i, obs)
                continue
            obs, reward, terminated, truncated, info = env.step(action)
            self._rewards[i], self._terminations[i], self._truncations[i] = reward, terminated, truncated
            if terminated or truncated:
                if next_step:
                    self._autoreset[i] = True
                elif disabled:  # the caller resets what ended
                    self._ended[i] = True
                else:  # SameStep
                    final_obs, final_info = obs, info
                    obs, info = env.reset()
                    info = {**info, "final_obs": final_obs, "final_info": final_info}
            infos[i] = info
            self._write(i, obs)
        return self._obs, self._rewards, self._terminations, self._truncations, self.env_infos

    def apply(self, i: int, fn: Callable[[gym.Env], Any]) -> Any:
        """``fn(sub-env i)``, run where the sub-env lives (here; a worker process in ``ShardedVectorEnv``)."""
        return fn(self.envs[i])

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()


@dataclass(frozen=True)
class EnvCall:
    """A sub-env's ``get_wrapper_attr(name)``, called with ``args`` and ``kwargs`` when ``args`` is given and it is
    callable: a function for :meth:`ServingVectorEnv.apply` that pickles (for sub-envs in worker processes)."""

    name: str
    args: tuple[Any, ...] | None = None
    kwargs: dict[str, Any] | None = None

    def __call__(self, env: gym.Env) -> Any:
        value = env.get_wrapper_attr(self.name)
        return value(*self.args, **(self.kwargs or {})) if self.args is not None and callable(value) else value


@dataclass(frozen=True)
class EnvSet:
    """A sub-env's ``set_wrapper_attr(name, value)``, for :meth:`ServingVectorEnv.apply` (it pickles)."""

    name: str
    value: Any

    def __call__(self, env: gym.Env) -> None:
        env.set_wrapper_attr(self.name, self.value)


def _render(env: gym.Env) -> Any:
    return env.render()


def require_started(started: np.ndarray, ended: np.ndarray) -> None:
    """Refuse a step while a sub-env has not been reset, or (``Disabled`` autoreset) has ended unreset."""
    if not started.all() or ended.any():
        waiting = np.flatnonzero(~started | ended).tolist()
        raise RuntimeError(f"sub-env(s) {waiting} must be reset before step(): call reset() (with "
                           "options={'reset_mask': mask} for some; autoreset_mode='Disabled' leaves an ended "
                           "episode to the caller)")


def batch_actions(action_space: spaces.Space, actions: Any) -> np.ndarray | list[Any]:
    """The batch of actions as rows to index (an array of ``action_space.shape`` for Box, Discrete, MultiDiscrete
    and MultiBinary sub-env actions, checked; a list of the sub-envs' actions otherwise)."""
    if isinstance(action_space, spaces.Box | spaces.MultiDiscrete | spaces.Discrete | spaces.MultiBinary):
        batch = np.asarray(actions)
        if batch.shape != action_space.shape:
            raise ValueError(f"actions must have shape {action_space.shape} (num_envs={action_space.shape[0]} "
                             f"rows of the sub-env's action), got {batch.shape}")
        return batch
    return list(iterate(action_space, actions))


def _check_buffer(expected: Any, buffer: Any) -> None:
    if isinstance(expected, dict):
        if not isinstance(buffer, dict) or buffer.keys() != expected.keys():
            raise ValueError(f"buffer must be a dict with the observation's keys {sorted(expected)}")
        for key in expected:
            _check_buffer(expected[key], buffer[key])
    elif not isinstance(buffer, np.ndarray) or buffer.shape != expected.shape or buffer.dtype != expected.dtype:
        raise ValueError(f"buffer must be an array of shape {expected.shape} and dtype {expected.dtype}, got "
                         f"{getattr(buffer, 'shape', type(buffer).__name__)} {getattr(buffer, 'dtype', '')}")


def _copy_into(target: Any, source: Any) -> None:
    if isinstance(source, dict):
        for key in source:
            _copy_into(target[key], source[key])
    else:
        target[...] = source


def vector_info(infos: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Gymnasium's vector infos from per-env info dicts, laid out as ``SyncVectorEnv`` lays them out: each key's
    values in an array over the sub-envs, typed by the first sub-env that set it (a Python or numpy scalar: that
    dtype; an array: stacked; a dict: recursively; ``final_obs`` and anything else: an object array), and a mask
    ``"_key"`` of the sub-envs that set it."""
    n, out = len(infos), {}
    for key in dict.fromkeys(k for info in infos for k in info):
        present = np.array([key in info for info in infos], dtype=np.bool_)
        rows = np.flatnonzero(present)
        first = infos[rows[0]][key]
        if key != "final_obs" and isinstance(first, dict):
            out[key] = vector_info([info.get(key, {}) for info in infos])
        else:
            column = _empty_column(key, first, n)
            for i in rows:
                column[i] = infos[i][key]
            out[key] = column
        out[f"_{key}"] = present
    return out


def _empty_column(key: str, first: Any, n: int) -> np.ndarray:
    if key != "final_obs" and (type(first) in (int, float, bool) or isinstance(first, np.number)):
        return np.zeros(n, dtype=type(first))
    if key != "final_obs" and isinstance(first, np.ndarray):
        return np.zeros((n, *first.shape), dtype=first.dtype)
    return np.full(n, None, dtype=object)


def checked_reset_mask(mask: Any, n: int) -> np.ndarray:
    """``reset(options={"reset_mask": ...})``'s mask, checked as Gymnasium checks it."""
    if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_:
        raise TypeError(f"options['reset_mask'] must be a numpy bool array, got {mask!r}")
    if mask.shape != (n,):
        raise ValueError(f"options['reset_mask'] must have shape ({n},), got {mask.shape}")
    if not mask.any():
        raise ValueError("options['reset_mask'] selects no sub-env: at least one must be True")
    return mask


def sub_env_seeds(seed: int | Sequence[int | None] | None, n: int) -> list[int | None]:
    if seed is None:
        return [None] * n
    if isinstance(seed, int | np.integer):
        return [int(seed) + i for i in range(n)]
    seeds = list(seed)
    if len(seeds) != n:
        raise ValueError(f"reset(seed=...) as a list needs one seed per sub-env ({n}), got {len(seeds)}")
    return seeds


def _row_writer(space: spaces.Space, batch: Any) -> Callable[[int, Any], None]:
    """A function writing one sub-env's observation into row ``i`` of the preallocated ``batch``."""
    if isinstance(space, spaces.Dict):
        writers = {key: _row_writer(sub, batch[key]) for key, sub in space.spaces.items()}

        def write_dict(i: int, obs: dict[str, Any]) -> None:
            for key, write in writers.items():
                write(i, obs[key])

        return write_dict
    if isinstance(space, spaces.Box | spaces.MultiDiscrete | spaces.MultiBinary | spaces.Discrete):

        def write_row(i: int, obs: Any) -> None:
            batch[i] = obs

        return write_row
    raise TypeError(f"ServingVectorEnv batches Box, Discrete, MultiDiscrete, MultiBinary and Dict observations, "
                    f"not {type(space).__name__}")


def make_serving_vector_env(num_envs: int = 1, max_episode_steps: int | None = None,
                            autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP, copy: bool = True,
                            shards: int = 1, **kwargs: Any) -> VectorEnv:
    """The registered ids' ``vector_entry_point``: ``num_envs`` envs as ``gym.make(id, **kwargs)`` builds them
    (the same episodes; ``max_episode_steps`` truncates as ``gym.make``'s ``TimeLimit`` does, -1 or None: no
    limit), stepped by one :class:`ServingVectorEnv`, or with ``shards`` > 1 by a
    :class:`~servegym.envs.sharded.ShardedVectorEnv` of that many processes."""
    limit, why = COUNT_LIMITS["envs"]
    if isinstance(num_envs, bool) or not isinstance(num_envs, int | np.integer) or not 1 <= num_envs <= limit:
        raise ValueError(f"num_envs must be a positive integer of at most {limit:,} ({why}), got {num_envs!r}")
    env_fns = [partial(_single_env, max_episode_steps, kwargs)] * int(num_envs)
    if shards != 1:
        from servegym.envs.sharded import ShardedVectorEnv

        return ShardedVectorEnv(env_fns, shards, autoreset_mode=autoreset_mode, copy=copy)
    return ServingVectorEnv(env_fns, autoreset_mode=autoreset_mode, copy=copy)


def _single_env(max_episode_steps: int | None, kwargs: dict[str, Any]) -> gym.Env:
    from servegym.envs.mixture import make_serving_env

    env = make_serving_env(**kwargs)
    if max_episode_steps is not None and max_episode_steps > 0:
        env = gym.wrappers.TimeLimit(env, max_episode_steps)
    return env
