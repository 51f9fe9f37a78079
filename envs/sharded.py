"""The native vector env split over processes: each shard of sub-envs is a :class:`ServingVectorEnv` stepping its
episodes in one call, and every shard writes its observations into one batch in shared memory."""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import pickle
import signal
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from servegym.envs.vector import BatchedVectorEnv, ServingVectorEnv, batch_actions, require_started

CLOSE_TIMEOUT_S = 10.0
"""How long ``close`` waits for a worker to finish before terminating it."""


@dataclass
class _Shard:
    start: int
    stop: int
    process: Any
    conn: Connection
    owed: int = 1
    """Answers the worker still owes: its start-up answer first, then one per command sent (a call interrupted
    before it read them leaves them to the next call, which reads them first)."""


class ShardedVectorEnv(BatchedVectorEnv):
    """
    ## Description

    `ServingVectorEnv`'s episodes, stepped by `shards` processes at once: the sub-envs are split into `shards`
    contiguous groups of near-equal size; the first group is stepped in this process and each other one by a
    worker process, each group natively (one call, its own compiled engines), every group writing its rows of one
    observation batch in shared memory. A step writes the actions to shared memory and wakes each worker, steps the
    first group meanwhile, then waits for the workers: their rewards and flags are in shared memory, their infos
    come pickled. Use it where the machine has cores to spare: on 2 cores, 2 shards (docs/RL.md measures it).

    Sub-env `i` plays the episode it plays in `ServingVectorEnv(env_fns)`, and the batch, flags and infos are the
    same (tested seed by seed), in each autoreset mode.

    ## Arguments

    | parameter | default | description |
    |-----------|---------|-------------|
    | `env_fns` | | one callable per sub-env (pickled by `cloudpickle` to the workers) |
    | `shards` | `2` | processes stepping sub-envs, this one included (1: none started, all here) |
    | `autoreset_mode` | `NextStep` | as `ServingVectorEnv` |
    | `copy` | `True` | as `ServingVectorEnv` |
    | `context` | `"spawn"` | the `multiprocessing` start method of the workers |

    ## Failures

    An exception in a worker (a bad action, a sub-env's error, an answer that does not pickle) is raised here,
    with the worker's traceback as a note, after every shard has answered, so the vector env stays usable: as in
    one process, the sub-envs stepped before the failing one keep their step (and their flags). A call interrupted
    before it read every answer (Ctrl-C mid-step) leaves them to the next call, which reads them first. A worker
    that dies (killed, out of memory) makes the next call raise `RuntimeError` saying which, and every later one;
    `close()` then ends the rest. Workers ignore `SIGINT` (the caller's Ctrl-C closes them) and exit when this
    process's end of their pipe closes, so none outlives its parent; a failed build or a sub-env's failing
    `close()` still ends every worker.
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], shards: int = 2,
                 autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP, copy: bool = True,
                 context: str = "spawn") -> None:
        super().__init__()
        env_fns = list(env_fns)
        if not env_fns:
            raise ValueError("a vector env needs at least one sub-env (env_fns is empty)")
        if isinstance(shards, bool) or not isinstance(shards, int | np.integer) or not 1 <= shards <= len(env_fns):
            raise ValueError(f"shards must be an integer from 1 to the number of sub-envs ({len(env_fns)}), "
                             f"got {shards!r}")
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.copy = bool(copy)
        self.num_envs = len(env_fns)
        bounds = np.linspace(0, self.num_envs, int(shards) + 1).round().astype(int).tolist()
        self.local = ServingVectorEnv(env_fns[: bounds[1]], self.autoreset_mode, copy=False)
        self.shards: list[_Shard] = []
        self._failure: str | None = None
        self._finalizer = weakref.finalize(self, _stop, self.shards)
        try:
            self._start(env_fns, bounds, multiprocessing.get_context(context))
        except BaseException:  # a half-built env ends what it started
            self._finalizer()
            self.local.close()
            raise
        self.metadata = {**self.local.metadata, "autoreset_mode": self.autoreset_mode}
        self.render_mode = self.local.render_mode
        self.single_observation_space = self.local.single_observation_space
        self.single_action_space = self.local.single_action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._started = np.zeros(self.num_envs, dtype=np.bool_)
        self._ended = np.zeros(self.num_envs, dtype=np.bool_)
        self.env_infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]

    def _start(self, env_fns: list[Callable[[], gym.Env]], bounds: list[int], ctx: Any) -> None:
        """Lay out the shared arrays, point the first group at its rows, start a worker for each other group and
        wait until each has built its sub-envs."""
        action_space = self.local.single_action_space
        tree = _shared_tree(self.local.single_observation_space, self.num_envs, ctx)
        steps = {"rewards": _shared_leaf((self.num_envs,), np.float64, ctx),
                 "terminations": _shared_leaf((self.num_envs,), np.bool_, ctx),
                 "truncations": _shared_leaf((self.num_envs,), np.bool_, ctx)}
        if isinstance(batch_space(action_space, 1), spaces.Box | spaces.MultiDiscrete | spaces.MultiBinary):
            steps["actions"] = _shared_leaf((self.num_envs, *action_space.shape), action_space.dtype, ctx)
        self._obs, self._step = _attach(tree, 0, self.num_envs), _attach(steps, 0, self.num_envs)
        self._rewards, self._terminations = self._step["rewards"], self._step["terminations"]
        self._truncations = self._step["truncations"]
        k = bounds[1]
        self.local.use_buffer(_attach(tree, 0, k), self._rewards[:k], self._terminations[:k], self._truncations[:k])
        expected = (self.local.single_observation_space, action_space)
        for start, stop in itertools.pairwise(bounds[1:]):
            parent, child = ctx.Pipe()
            process = ctx.Process(target=_serve, args=(child, cloudpickle.dumps(env_fns[start:stop]), expected, tree,
                                                       steps, start, stop, self.autoreset_mode.value), daemon=True)
            process.start()
            child.close()
            self.shards.append(_Shard(start, stop, process, parent))
        self._gather([(shard, None) for shard in self.shards])

    def reset_env(self, i: int, seed: int | None = None, options: dict[str, Any] | None = None) -> dict[str, Any]:
        """Reset sub-env ``i`` alone; its observation goes into row ``i`` of the batch; return its info."""
        info = self._on(i, "reset_env", seed, options)
        self._started[i], self._ended[i] = True, False
        self.env_infos[i] = info
        return info

    def step_raw(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        """As :meth:`ServingVectorEnv.step_raw`: the batch, rewards and flags (buffers the next call overwrites)
        and each sub-env's own info."""
        require_started(self._started, self._ended)
        rows = batch_actions(self.action_space, actions)
        k = self.local.num_envs
        # in shared memory when they fit it as they are (no cast: a sub-env sees the very action passed)
        shared = isinstance(rows, np.ndarray) and "actions" in self._step and rows.dtype == self._step["actions"].dtype
        if shared:
            self._step["actions"][...] = rows
        try:
            sent, error = self._send_all([(shard, ("step", None if shared else (rows[shard.start: shard.stop],)))
                                          for shard in self.shards])
            if error is None:
                try:
                    self.local.step_rows(rows[:k])
                except Exception as caught:  # raised once the workers have answered
                    error = caught
            self._gather([(shard, self._store_infos) for shard in sent], error)
        finally:  # each sub-env's flags are written as it steps, so these hold whatever was raised
            self.env_infos[:k] = self.local.env_infos
            if self.autoreset_mode == AutoresetMode.DISABLED:
                self._ended |= self._terminations | self._truncations
        return self._obs, self._rewards, self._terminations, self._truncations, self.env_infos

    def apply(self, i: int, fn: Callable[[gym.Env], Any]) -> Any:
        """``fn(sub-env i)``, run in the process that holds it (``fn`` pickled by ``cloudpickle``)."""
        return self._on(i, "apply", cloudpickle.dumps(fn))

    def close_extras(self, **kwargs: Any) -> None:
        try:
            self.local.close()
        finally:
            self._finalizer()

    def _store_infos(self, start: int, infos: list[dict[str, Any]]) -> None:
        self.env_infos[start: start + len(infos)] = infos

    def _on(self, i: int, command: str, *args: Any) -> Any:
        """Run ``command`` on sub-env ``i`` where it lives."""
        if not 0 <= i < self.num_envs:
            raise IndexError(f"sub-env index {i} out of range for {self.num_envs} sub-envs")
        if i < self.local.num_envs:
            self._check_usable()
            return _local_command(self.local, command, i, *args)
        shard = next(s for s in self.shards if s.start <= i < s.stop)
        sent, error = self._send_all([(shard, (command, (i - shard.start, *args)))])
        results: list[Any] = []
        self._gather([(s, lambda _, value: results.append(value)) for s in sent], error)
        return results[0]

    def _check_usable(self) -> None:
        if self.closed:
            raise RuntimeError("this vector env is closed")
        if self._failure is not None:
            raise RuntimeError(self._failure)

    def _send_all(self, messages: Sequence[tuple[_Shard, tuple[str, tuple[Any, ...] | None]]]
                  ) -> tuple[list[_Shard], BaseException | None]:
        """Send each shard its message (every one pickled before any is sent), first reading any answer a shard
        still owes; the shards reached and the first failure (a dead worker)."""
        self._check_usable()
        payloads = [(shard, _dumps(message)) for shard, message in messages]
        sent: list[_Shard] = []
        error: BaseException | None = None
        for shard, payload in payloads:
            try:
                while shard.owed:
                    _wait(shard.conn)
                    shard.conn.recv_bytes()
                    shard.owed -= 1
                shard.conn.send_bytes(payload)
                shard.owed += 1
                sent.append(shard)
            except (BrokenPipeError, EOFError, OSError) as lost:
                error = error or self._dead(shard, lost)
        return sent, error

    def _gather(self, awaited: Sequence[tuple[_Shard, Callable[[int, Any], None] | None]],
                error: BaseException | None = None) -> None:
        """Receive one answer from each awaited shard, handing its value to the handler (with the shard's first
        sub-env index); then raise the first error (``error``, if given, first)."""
        for shard, handler in awaited:
            try:
                _wait(shard.conn)
                status, value = shard.conn.recv()
            except (EOFError, OSError) as lost:
                error = error or self._dead(shard, lost)
                continue
            shard.owed -= 1
            if status == "error":
                exception, trace = value
                exception.add_note(f"in the worker process of sub-envs {shard.start}-{shard.stop - 1}:\n{trace}")
                error = error or exception
            elif handler is not None:
                handler(shard.start, value)
        if error is not None:
            raise error

    def _dead(self, shard: _Shard, cause: BaseException) -> RuntimeError:
        """Record a worker's death (every later call but ``close`` refuses) and the error saying so."""
        shard.process.join(timeout=1.0)
        self._failure = (f"the worker process of sub-envs {shard.start}-{shard.stop - 1} exited (exit code "
                         f"{shard.process.exitcode}); close() this vector env and build another")
        error = RuntimeError(self._failure)
        error.__cause__ = cause
        return error


def _stop(shards: list[_Shard]) -> None:
    """End every worker: ask it to close its sub-envs, wait, terminate what is left; close the pipes."""
    for shard in shards:
        with contextlib.suppress(BrokenPipeError, EOFError, OSError):
            shard.conn.send(("close", ()))
    for shard in shards:
        shard.process.join(timeout=CLOSE_TIMEOUT_S)
        if shard.process.is_alive():
            shard.process.terminate()
            shard.process.join(timeout=CLOSE_TIMEOUT_S)
        if shard.process.is_alive():
            shard.process.kill()
            shard.process.join()
        shard.conn.close()
    shards.clear()


def _local_command(vector: ServingVectorEnv, command: str, i: int, *args: Any) -> Any:
    """``reset_env`` or ``apply`` on sub-env ``i`` of ``vector``."""
    if command == "reset_env":
        return vector.reset_env(i, *args)
    if command == "apply":
        return vector.apply(i, cloudpickle.loads(args[0]))
    raise ValueError(f"unknown worker command {command!r}")


def _serve(conn: Connection, payload: bytes, expected: tuple[spaces.Space, spaces.Space], tree: Any,
           steps: dict[str, Any], start: int, stop: int, autoreset_mode: str) -> None:
    """A worker: build the shard's sub-envs over its rows of the shared batch, then answer commands until
    ``close`` or until the parent's end of the pipe closes. A step reads the shard's actions from shared memory
    (or the message) and writes its rewards and flags there; its infos go back through the pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        vector = ServingVectorEnv(cloudpickle.loads(payload), autoreset_mode, copy=False, spaces_of=expected,
                                  first_index=start)
        shared = _attach(steps, start, stop)
        vector.use_buffer(_attach(tree, start, stop), shared["rewards"], shared["terminations"],
                          shared["truncations"])
    except Exception as error:
        conn.send(("error", _portable(error)))
        return
    conn.send(("ok", None))
    while True:
        try:
            _wait(conn)
            command, args = conn.recv()
        except (EOFError, OSError):
            break
        if command == "close":
            vector.close()
            break
        try:
            if command == "step":  # a copy of the shared actions: a sub-env may keep its action
                result = ("ok", vector.step_rows(shared["actions"].copy() if args is None else args[0])[4])
            else:
                result = ("ok", _local_command(vector, command, *args))
        except Exception as error:
            result = ("error", _portable(error))
        try:
            conn.send_bytes(_dumps(result))
        except (BrokenPipeError, OSError):
            break
        except Exception as error:  # the answer does not pickle (an info, apply's result): say so instead
            conn.send(("error", _portable(error)))
    conn.close()


def _dumps(message: Any) -> bytes:
    """``message`` pickled for the pipe by the C pickler: ``Connection.send`` uses multiprocessing's
    ``ForkingPickler``, whose reducer table makes a step's infos cost 3x as much, and only sockets, pipes and file
    descriptors need its reducers (no message holds one)."""
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def _portable(error: Exception) -> tuple[Exception, str]:
    """The exception and its traceback's text, the exception replaced by a ``RuntimeError`` of its text where it
    does not pickle."""
    trace = "".join(traceback.format_exception(error))
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        error = RuntimeError(f"{type(error).__name__}: {error}")
    return error, trace


def _shared_tree(space: spaces.Space, n: int, ctx: Any) -> Any:
    """The observation batch's layout in shared memory: ``{key: subtree}`` for a ``Dict``, else a leaf of one row
    per sub-env."""
    if isinstance(space, spaces.Dict):
        return {key: _shared_tree(sub, n, ctx) for key, sub in space.spaces.items()}
    return _shared_leaf((n, *space.shape), space.dtype, ctx)


def _shared_leaf(shape: tuple[int, ...], dtype: Any, ctx: Any) -> tuple[Any, tuple[int, ...], str]:
    """An array of ``shape`` and ``dtype`` in shared memory, as (raw array, shape, dtype) for :func:`_attach`."""
    dtype = np.dtype(dtype)
    return ctx.RawArray("b", max(1, int(np.prod(shape)) * dtype.itemsize)), shape, dtype.str


def _attach(tree: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of the shared arrays as numpy views (writes land in shared memory)."""
    if isinstance(tree, dict):
        return {key: _attach(sub, start, stop) for key, sub in tree.items()}
    raw, shape, dtype = tree
    return np.frombuffer(raw, dtype=dtype, count=int(np.prod(shape))).reshape(shape)[start:stop]


SPIN_S = 0.001
"""How long a process waiting on a pipe polls it before it blocks: a blocked process's wake-up costs tens of
microseconds (more on a virtual machine), a step a few hundred."""


def _wait(conn: Connection) -> None:
    """Return once ``conn`` has a message (or is closed): poll it for up to :data:`SPIN_S`, then block."""
    deadline = time.perf_counter() + SPIN_S
    while not conn.poll(0):
        if time.perf_counter() > deadline:
            conn.poll(None)
            return
