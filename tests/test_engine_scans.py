"""The engine's helpers on the env's per-step path (``Engine.admit_order``, ``Engine.observe_pool``,
``Engine.is_cold``), checked by hand on asymmetric cases, compiled and interpreted."""

from __future__ import annotations

import numpy as np
import pytest

from servegym.engine.compiled import interpreted_engine
from servegym.pool import Cluster
from tests.conftest import fixed, make

ENGINE_CLASSES = pytest.mark.parametrize("interpreted", [False, True], ids=["as-built", "interpreted"])


def _impl(engine, interpreted: bool):
    """The engine's own class, or the interpreted one's functions (which accept any engine)."""
    return interpreted_engine() if interpreted else type(engine)


def three_waiting():
    env = make(fixed([0.0, 0.0, 0.0], [10, 10, 10], [3, 3, 3]))
    env.reset(seed=0)
    engine = env.unwrapped.engine
    assert len(engine.waiting) == 3
    return engine


@ENGINE_CLASSES
@pytest.mark.parametrize(("action", "expected"), [
    ([2, 0, 2, 1, 0, 4], (2, 2, [0, 2])),  # visible 0 and 2 tie at 2: slot order; 3 and 5 are past the queue
    ([3, 1, 2, 0, 0, 0], (3, 0, [1, 2, 0])),  # lowest value first
    ([0, 6, 5, 0, 0, 0], (2, 0, [2, 1])),  # the width itself is a valid value
    ([1, 0, 0, 0, 0, 7], (-1, 0, None)),  # out of range past the visible slots is still an error
    ([0, -1, 0, 0, 0, 0], (-1, 0, None)),
    ([0, 0, 0, 0, 0, 0], (0, 0, [])),
])
def test_admit_order_ranks_the_visible_slots_and_counts_the_rest(interpreted, action, expected):
    engine = three_waiting()
    order = np.full(6, -9, dtype=np.int64)
    count, beyond = _impl(engine, interpreted).admit_order(engine, np.array(action, dtype=np.int64), 6, order)
    assert (count, beyond) == expected[:2]
    if expected[2] is not None:
        assert order[:count].tolist() == expected[2]


@ENGINE_CLASSES
def test_admit_order_sees_only_the_window(interpreted):
    engine = three_waiting()  # 3 waiting, but a window of 2 shows 2
    order = np.zeros(3, dtype=np.int64)
    assert _impl(engine, interpreted).admit_order(engine, np.array([1, 2, 3], dtype=np.int64), 2, order) == (2, 1)
    assert order[:2].tolist() == [0, 1]


def three_containers() -> Cluster:
    env = make(fixed([50.0], [10], [3]), pool={"num_containers": 3, "keep_alive_s": 2.0})
    env.reset(seed=0)
    return env.unwrapped.cluster


@ENGINE_CLASSES
def test_observe_pool_by_hand(interpreted):
    cluster = three_containers()
    e0, e1, e2 = cluster.engines
    assert (len(e0.waiting), cluster.time) == (1, 50.0)
    e0.ready_at, e0.idle_since = 51.25, 49.0  # loading, with a request waiting: busy, so not idle
    e1.idle_since = 48.0  # idle exactly the keep-alive: still warm
    e2.idle_since = 47.5  # idle past it: cold
    e1.num_finished, e2.num_finished = 4, 3
    out = np.full(20, -7.0, dtype=np.float32)
    finished = _impl(e0, interpreted).observe_pool(cluster.engines, 2, 50.0, 2.0, out)
    assert finished == 7
    np.testing.assert_array_equal(out[:18].reshape(3, 6), np.array([
        [0.0, -1.25, 0.0, 1.0, 0.0, 1.0],
        [0.0, 1.0, 2.0, 0.0, 0.0, 1.0],
        [1.0, 0.0, 2.5, 0.0, 0.0, 1.0],
    ], dtype=np.float32))
    assert out[18:].tolist() == [-7.0, -7.0]  # nothing past the rows
    with pytest.raises(ValueError, match="18 needed"):
        _impl(e0, interpreted).observe_pool(cluster.engines, 2, 50.0, 2.0, np.zeros(17, dtype=np.float32))


@ENGINE_CLASSES
def test_is_cold(interpreted):
    cluster = three_containers()
    e0, e1, _ = cluster.engines
    cold = _impl(e0, interpreted).is_cold
    e1.idle_since = 48.0
    assert not cold(e1, 50.0, 2.0) and cold(e1, 50.0 + 1e-9, 2.0)
    assert not cold(e1, 1e12, np.inf)  # no keep-alive: warm for ever
    e0.idle_since = 0.0
    assert not cold(e0, 50.0, 2.0)  # a request waits: never cold while it has work
    e1.ready_at = np.inf
    assert cold(e1, 50.0, np.inf)  # never loaded


def test_the_pool_observation_uses_the_pools_keep_alive():
    cluster = three_containers()
    cluster.engines[1].idle_since = 47.5
    assert cluster.keep_alive_s == 2.0 and cluster.is_cold(cluster.engines[1], 50.0)
    out = np.zeros(18, dtype=np.float32)
    cluster.observe_pool(out)
    assert out[6 + 1] == 0.0 and out[12 + 1] == 1.0  # container 1 cold, container 2 warm
    endless = make(fixed([50.0], [10], [3]), pool={"num_containers": 3})
    endless.reset(seed=0)
    assert endless.unwrapped.cluster.keep_alive_s == np.inf
