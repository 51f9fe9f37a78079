"""The sharded vector env (``servegym.envs.sharded``): the native vector env's episodes, batch, flags and infos
with its sub-envs split over worker processes, in every autoreset mode; SB3's ``VecEnv`` over it; and failures
that are raised here, leave nothing running and never hang."""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
from functools import partial

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import servegym
from servegym import ENV_ID, task_id
from servegym.envs.sharded import ShardedVectorEnv
from servegym.envs.vector import ServingVectorEnv

N = 5
LIMIT = 30
"""Short episodes, so every sub-env ends and autoresets within a test's steps."""


def _equal(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray) and a.dtype == object:
        return all(_equal(x, y) if x is not None else y is None for x, y in zip(a, b, strict=True))
    return np.array_equal(np.asarray(a), np.asarray(b)) and np.asarray(a).dtype == np.asarray(b).dtype


@pytest.fixture
def closing():
    """Vector envs a test builds, closed at its end whatever happens."""
    built = []
    yield built.append
    for env in built:
        env.close()


def _pair(closing, factories, shards, mode=AutoresetMode.NEXT_STEP):
    ours = ShardedVectorEnv(factories, shards, autoreset_mode=mode)
    closing(ours)
    return ours, ServingVectorEnv(factories, autoreset_mode=mode)


@pytest.mark.parametrize(("shards", "mode", "env_id", "kwargs"), [
    (2, AutoresetMode.NEXT_STEP, task_id("memory-tight"), {"flat_obs": True}),  # shards of 2 and 3 sub-envs
    (3, AutoresetMode.SAME_STEP, task_id("serverless-burst"), {}),  # the Dict observation, final_obs in infos
    (5, AutoresetMode.NEXT_STEP, ENV_ID, {"workload": "burst", "decision_steps": True}),  # one sub-env a shard
], ids=["2-shards-flat-next-step", "3-shards-dict-same-step", "5-shards-decision-steps"])
def test_every_step_equals_the_native_vector_envs_seed_by_seed(closing, shards, mode, env_id, kwargs):
    # Rule: splitting the sub-envs over processes changes nothing a caller sees: the batch, rewards, flags and
    # vector infos (final_obs / final_info included) equal the in-process vector env's at every step.
    factories = [partial(gym.make, env_id, max_episode_steps=LIMIT + 7 * i, **kwargs) for i in range(N)]
    ours, theirs = _pair(closing, factories, shards, mode)
    sizes = [ours.local.num_envs] + [shard.stop - shard.start for shard in ours.shards]
    assert sizes == {2: [2, 3], 3: [2, 1, 2], 5: [1] * 5}[shards]  # near-equal contiguous groups
    assert _equal(ours.reset(seed=21), theirs.reset(seed=21))
    space = ours.action_space
    space.seed(8)
    ends = 0
    for _ in range(3 * LIMIT):
        action = space.sample()
        a, b = ours.step(action), theirs.step(action)
        for x, y in zip(a, b, strict=True):
            assert _equal(x, y)
        ends += int((a[2] | a[3]).sum())
    assert ends >= N  # every sub-env ended, so each shard's autoreset was compared
    assert ours.observation_space == theirs.observation_space and ours.action_space == theirs.action_space
    assert ours.metadata["autoreset_mode"] == mode


def test_disabled_autoreset_and_a_masked_reset_reach_sub_envs_in_workers(closing):
    # Rule: with autoreset "Disabled", an ended sub-env in a worker is refused until the caller resets it, and a
    # masked reset resets that one alone, as in one process (limits 2 and 40: sub-envs 0 and 3 end first).
    factories = [partial(gym.make, task_id("memory-tight"), flat_obs=True, max_episode_steps=k) for k in (2, 40, 40, 2)]
    ours, theirs = _pair(closing, factories, 2, "Disabled")
    ours.reset(seed=0)
    theirs.reset(seed=0)
    action = np.ones((4, 32), dtype=np.int64)
    for _ in range(2):
        a, b = ours.step(action), theirs.step(action)
    assert a[3].tolist() == b[3].tolist() == [True, False, False, True]
    with pytest.raises(RuntimeError, match=r"sub-env\(s\) \[0, 3\] must be reset"):
        ours.step(action)
    mask = np.array([False, False, False, True])
    a, b = ours.reset(seed=7, options={"reset_mask": mask}), theirs.reset(seed=7, options={"reset_mask": mask})
    assert _equal(a, b) and a[1]["_num_waiting"].tolist() == mask.tolist()
    with pytest.raises(RuntimeError, match=r"sub-env\(s\) \[0\] must be reset"):
        ours.step(action)
    ours.reset(options={"reset_mask": ~mask})
    theirs.reset(options={"reset_mask": ~mask})
    for x, y in zip(ours.step(action), theirs.step(action), strict=True):
        assert _equal(x, y)


def test_sb3_vec_env_over_shards_gives_dummy_vec_envs_transitions_and_reaches_remote_sub_envs(closing):
    # Rule: NativeVecEnv(shards=2) trains on DummyVecEnv's transitions (terminal_observation, Monitor's episode,
    # TimeLimit.truncated), and get_attr / set_attr / env_method / env_is_wrapped act on the sub-env in its worker.
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    from servegym.rl.train import make_training_env
    from servegym.rl.vec_env import NativeVecEnv

    kwargs = {"task": "memory-tight", "decision_steps": True}
    factories = [partial(make_training_env, kwargs, "score", LIMIT, (3 + i, 4)) for i in range(4)]
    ours, theirs = NativeVecEnv(factories, shards=2), DummyVecEnv(factories)
    closing(ours)
    ours.seed(5)
    theirs.seed(5)
    assert _equal(ours.reset(), theirs.reset())
    ends = 0
    for action in [ours.action_space.sample() for _ in range(2 * LIMIT)]:
        action = np.stack([action] * 4)
        a, b = ours.step(action), theirs.step(action)
        assert _equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and np.array_equal(a[2], b[2])
        for x, y in zip(a[3], b[3], strict=True):
            assert x.keys() == y.keys() and x["TimeLimit.truncated"] == y["TimeLimit.truncated"]
            if "terminal_observation" in x:
                ends += 1
                assert _equal(x["terminal_observation"], y["terminal_observation"])
                assert x["episode"]["r"] == y["episode"]["r"]
    assert ends >= 4
    assert ours.env_is_wrapped(Monitor) == theirs.env_is_wrapped(Monitor) == [True] * 4
    ours.set_attr("tag", "remote", indices=[3])  # sub-env 3 lives in the worker
    assert ours.get_attr("tag", indices=[3]) == ["remote"]
    assert ours.env_method("get_wrapper_attr", "tag", indices=3) == ["remote"]
    with pytest.raises(AttributeError):
        ours.get_attr("tag", indices=[0])


def test_make_vec_with_shards_plays_the_same_episodes(closing):
    one = servegym.make_vec(task_id("memory-tight"), num_envs=3, max_episode_steps=LIMIT, flat_obs=True)
    two = servegym.make_vec(task_id("memory-tight"), num_envs=3, max_episode_steps=LIMIT, flat_obs=True, shards=2)
    closing(two)
    assert isinstance(two.unwrapped, ShardedVectorEnv) and len(two.unwrapped.shards) == 1
    assert _equal(one.reset(seed=4)[0], two.reset(seed=4)[0])
    for action in [one.action_space.sample() for _ in range(LIMIT + 3)]:
        assert _equal(one.step(action)[:4], two.step(action)[:4])


def test_bad_shard_counts_and_env_fns_are_refused_before_any_worker_starts():
    make = partial(gym.make, task_id("memory-tight"))
    before = multiprocessing.active_children()
    for bad in (0, 4, True, 1.5, -1):
        with pytest.raises(ValueError, match=r"shards must be an integer from 1 to the number of sub-envs \(3\)"):
            ShardedVectorEnv([make] * 3, bad)
    with pytest.raises(ValueError, match="at least one sub-env"):
        ShardedVectorEnv([], 1)
    assert multiprocessing.active_children() == before


def test_a_workers_error_is_raised_here_with_its_traceback_and_the_env_stays_usable(closing):
    # Rule: an exception in a worker (here a bad action for the worker's sub-envs only) arrives as itself, with a
    # note naming the worker's sub-envs and its traceback, once every shard has answered; the next call works.
    vec = ShardedVectorEnv([partial(gym.make, task_id("memory-tight"), flat_obs=True)] * 4, 2)
    closing(vec)
    vec.reset(seed=0)
    action = np.zeros((4, 32), dtype=np.int64)
    action[3, 0] = 10**6  # out of the admit mode's range
    with pytest.raises(ValueError, match="action values must be in") as caught:
        vec.step(action)
    assert any("worker process of sub-envs 2-3" in note and "Traceback" in note for note in caught.value.__notes__)
    vec.reset(seed=1)
    assert vec.step(np.zeros((4, 32), dtype=np.int64))[1].shape == (4,)
    with pytest.raises(ValueError, match="sub-env 2's spaces differ"):  # a worker's own build error, raised here
        ShardedVectorEnv([partial(gym.make, ENV_ID, queue_window=8)] * 2 + [partial(gym.make, ENV_ID, queue_window=16)]
                         + [partial(gym.make, ENV_ID, queue_window=8)], 2)
    with pytest.raises(ValueError, match="sub-env 2's spaces differ from sub-env 0's"):  # the worker's whole group
        ShardedVectorEnv([partial(gym.make, ENV_ID, queue_window=8)] * 2 + [partial(gym.make, ENV_ID, queue_window=16)]
                         * 2, 2)


def test_a_killed_worker_is_reported_not_waited_for_and_close_ends_everything():
    # Rule: a worker that dies makes the next call raise (saying which and its exit code) instead of hanging, every
    # later call raises the same, and close() ends the rest: no process is left.
    vec = ShardedVectorEnv([partial(gym.make, task_id("memory-tight"), flat_obs=True)] * 6, 3)
    try:
        vec.reset(seed=0)
        victim = vec.shards[0].process
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(timeout=30)
        action = np.zeros((6, 32), dtype=np.int64)
        with pytest.raises(RuntimeError, match=r"worker process of sub-envs 2-3 exited \(exit code -9\)"):
            vec.step(action)
        with pytest.raises(RuntimeError, match="sub-envs 2-3 exited"):
            vec.reset(seed=0)
        with pytest.raises(RuntimeError, match="sub-envs 2-3 exited"):  # sub-env 0 lives here: refused all the same
            vec.reset_env(0, seed=0)
        processes = [shard.process for shard in vec.shards]
    finally:
        vec.close()
    assert not any(p.is_alive() for p in processes) and vec.shards == []
    with pytest.raises(RuntimeError, match="closed"):
        vec.step(np.zeros((6, 32), dtype=np.int64))


def test_ctrl_c_is_left_to_the_caller_close_ends_every_worker_and_a_dropped_env_does_too():
    # Rule: a worker ignores SIGINT (a terminal's Ctrl-C reaches the whole process group; the caller decides and
    # closes), close() ends every worker, and an env dropped without close() ends its workers when collected.
    vec = ShardedVectorEnv([partial(gym.make, task_id("memory-tight"), flat_obs=True)] * 3, 3)
    processes = [shard.process for shard in vec.shards]
    try:
        vec.reset(seed=0)
        os.kill(processes[0].pid, signal.SIGINT)
        processes[0].join(timeout=0.5)
        assert processes[0].is_alive() and vec.step(np.zeros((3, 32), dtype=np.int64))[1].shape == (3,)
    finally:
        vec.close()
    assert not any(p.is_alive() for p in processes)
    dropped = ShardedVectorEnv([partial(gym.make, task_id("memory-tight"))] * 2, 2)
    process = dropped.shards[0].process
    del dropped  # never closed: the finalizer ends the worker when the env is collected
    gc.collect()
    process.join(timeout=30)
    try:
        assert not process.is_alive()
    finally:
        process.kill()  # a no-op when the finalizer did its work


class _Toy(gym.Env):
    """A small env for the failure cases: observation ``[t, the action kept from the last step, this action]``
    (first components), reward ``t``; it ends at ``end_at`` and raises at ``fail_at`` (``ValueError``) or
    ``interrupt_at`` (``KeyboardInterrupt``, as Ctrl-C would) steps; ``tuple_actions`` gives it a ``Tuple`` action
    space (pickled to workers, not shared)."""

    def __init__(self, end_at: int = 10**6, fail_at: int = -1, interrupt_at: int = -1, close_raises: bool = False,
                 tuple_actions: bool = False) -> None:
        self.observation_space = gym.spaces.Box(-1e9, 1e9, (3,), np.float64)
        self.action_space = (gym.spaces.Tuple((gym.spaces.Discrete(4), gym.spaces.Discrete(3))) if tuple_actions
                             else gym.spaces.MultiDiscrete([4, 3]))
        self.end_at, self.fail_at, self.interrupt_at, self.close_raises = end_at, fail_at, interrupt_at, close_raises
        self.t, self.kept = 0, None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.kept = 0, None
        return np.array([0.0, -1.0, -1.0]), {"t": 0}

    def step(self, action):
        self.t += 1
        if self.t == self.fail_at:
            raise ValueError(f"toy failure at step {self.t}")
        if self.t == self.interrupt_at:
            raise KeyboardInterrupt
        kept = -1.0 if self.kept is None else float(self.kept[0])
        self.kept = action  # kept by reference, as an env may
        return np.array([self.t, kept, float(action[0])]), float(self.t), self.t >= self.end_at, False, {"t": self.t}

    def close(self):
        if self.close_raises:
            raise RuntimeError("toy close failure")


@pytest.mark.parametrize("case", ["kept-actions", "tuple-actions", "int32-actions"])
def test_actions_reach_workers_as_they_reach_sub_envs_in_one_process(closing, case):
    # Rule: a sub-env in a worker sees the action it would see in one process: its own copy (one an env keeps is
    # not overwritten by the next step's), Tuple actions split per sub-env, another dtype not cast (pickled).
    factory = partial(_Toy, end_at=7, tuple_actions=case == "tuple-actions")
    ours, theirs = _pair(closing, [factory] * 4, 2)
    ours.reset(seed=0)
    theirs.reset(seed=0)
    space = theirs.action_space
    space.seed(3)
    for _ in range(20):
        action = space.sample()
        if case == "int32-actions":
            action = action.astype(np.int32)
        for x, y in zip(ours.step(action), theirs.step(action), strict=True):
            assert _equal(x, y)


def test_an_interrupted_step_leaves_the_pipes_in_step_for_the_next_call(closing):
    # Rule: Ctrl-C in the middle of a step (here raised by sub-env 0, in this process, while the worker steps sub-envs
    # 2-3) leaves answers unread; the next call reads them first, so every later answer is its own call's.
    vec = ShardedVectorEnv([partial(_Toy, interrupt_at=2)] + [_Toy] * 3, 2)
    closing(vec)
    vec.reset(seed=0)
    action = np.zeros((4, 2), dtype=np.int64)
    vec.step(action)
    with pytest.raises(KeyboardInterrupt):
        vec.step(action)
    assert vec.get_attr("t") == (2, 1, 2, 2)  # sub-env 0 counted its step before it raised; 1 was not stepped
    obs, rewards, *_ = vec.step(action)
    assert rewards.tolist() == [3.0, 2.0, 3.0, 3.0] and obs[:, 0].tolist() == [3.0, 2.0, 3.0, 3.0]


def test_an_answer_that_does_not_pickle_is_an_error_not_a_dead_worker(closing):
    import threading

    vec = ShardedVectorEnv([_Toy] * 4, 2)
    closing(vec)
    vec.reset(seed=0)
    with pytest.raises(TypeError, match="pickle"):
        vec.apply(3, lambda env: threading.Lock())
    assert vec.apply(3, lambda env: env.t) == 0 and vec.step(np.zeros((4, 2), dtype=np.int64))[1].tolist() == [1.0] * 4
    with pytest.raises(TypeError, match="pickle"):  # a message that does not pickle is refused before any is sent
        vec.set_attr("lock", [0, 0, threading.Lock(), 0])
    assert vec.step(np.zeros((4, 2), dtype=np.int64))[1].tolist() == [2.0] * 4


def test_an_error_mid_step_keeps_the_flags_of_the_sub_envs_stepped_before_it():
    # Rule: sub-env 0 ends in the step where sub-env 1 raises; the next step resets sub-env 0 (NextStep), as it
    # would had sub-env 1 not raised, instead of stepping an ended episode.
    vec = ServingVectorEnv([partial(_Toy, end_at=1), partial(_Toy, fail_at=1)])
    vec.reset(seed=0)
    with pytest.raises(ValueError, match="toy failure"):
        vec.step(np.zeros((2, 2), dtype=np.int64))
    obs, rewards, terminations, *_ = vec.step(np.zeros((2, 2), dtype=np.int64))
    assert obs[0].tolist() == [0.0, -1.0, -1.0] and rewards[0] == 0.0 and not terminations[0]


def test_a_failed_build_or_close_still_ends_every_worker():
    import threading

    before = set(multiprocessing.active_children())
    unpicklable = partial(_Toy, end_at=threading.Lock())  # cloudpickle refuses it: the third group's workers fail
    with pytest.raises(TypeError, match="pickle") as caught:
        ShardedVectorEnv([_Toy, _Toy, unpicklable], 3)
    # ended at once, not when the half-built env is collected (the traceback held here keeps it alive)
    assert set(multiprocessing.active_children()) == before and caught.traceback
    vec = ShardedVectorEnv([partial(_Toy, close_raises=True), _Toy], 2)
    process = vec.shards[0].process
    with pytest.raises(RuntimeError, match="toy close failure"):
        vec.close()
    process.join(timeout=30)
    assert not process.is_alive()
