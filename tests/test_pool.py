"""The serverless pool: cold starts, keep-alive, routing, the event clock, conservation across containers."""

from __future__ import annotations

import numpy as np
import pytest

from servegym.envs import POOL_INDEX
from servegym.pool import PoolConfig
from tests.conftest import admit_all, fixed, make


def run_to_end(env, limit=200_000):
    total = 0.0
    for _ in range(limit):
        _, reward, terminated, truncated, _ = env.step(admit_all(env))
        total += reward
        if terminated or truncated:
            return total
    raise AssertionError("episode did not end")


def test_cold_container_adds_exactly_cold_start_to_first_ttft():
    workload = fixed([2.0], [100], [5])
    warm = make(workload)
    warm.reset(seed=0)
    run_to_end(warm)
    cold = make(workload, pool={"start_cold": True, "cold_start_s": 7.5})
    cold.reset(seed=0)
    run_to_end(cold)
    ttft_warm = warm.unwrapped.cluster.log.first_token_s[0] - 2.0
    log = cold.unwrapped.cluster.log
    assert log.first_token_s[0] - 2.0 == pytest.approx(ttft_warm + 7.5, abs=1e-12)
    assert log.cold_start[0] and log.load_wait_s[0] == pytest.approx(7.5)


def test_profile_cold_start_and_scale():
    env = make(fixed([0.0], [10], [2]), pool={"start_cold": True, "cold_start_scale": 0.1})
    env.reset(seed=0)
    run_to_end(env)
    assert env.unwrapped.cluster.log.load_wait_s[0] == pytest.approx(0.8)  # profile's 8 s at a 10x faster load


def test_keep_alive_expiry_makes_the_container_cold_again():
    workload = fixed([0.0, 5.0, 100.0], [10, 10, 10], [3, 3, 3])
    env = make(workload, pool={"keep_alive_s": 30.0, "cold_start_s": 2.0})
    env.reset(seed=0)
    run_to_end(env)
    log = env.unwrapped.cluster.log
    assert log.cold_start.tolist() == [False, False, True]
    assert log.load_wait_s[2] == pytest.approx(2.0)


def test_loading_container_admits_nothing_until_ready():
    env = make(fixed([0.0], [10], [3]), pool={"start_cold": True, "cold_start_s": 3.0})
    obs, _ = env.reset(seed=0)
    assert obs["pool"][POOL_INDEX["warmth"]] == pytest.approx(-3.0)
    _, _, _, _, info = env.step(admit_all(env))
    assert info["num_admitted"] == 0 and info["num_refused"] == 1 and info["clock_s"] == pytest.approx(3.0)
    _, _, _, _, info = env.step(admit_all(env))
    assert info["num_admitted"] == 1


def three_containers(**pool):
    n = 300
    workload = fixed(np.linspace(0, 20, n), np.full(n, 100), np.full(n, 60))
    return make(workload, pool={"num_containers": 3, **pool})


def test_round_robin_router_cycles():
    env = three_containers(router="round_robin")
    env.reset(seed=0)
    run_to_end(env)
    containers = env.unwrapped.cluster.log.container
    assert containers[:9].tolist() == [0, 1, 2] * 3
    assert np.all(np.diff(containers.astype(int)) % 3 == 1)


def test_event_clock_steps_the_earliest_container_and_pool_obs_says_which():
    env = three_containers()
    obs, _ = env.reset(seed=0)
    cluster = env.unwrapped.cluster
    for _ in range(300):
        busy = [e for e in cluster.engines if e.waiting.size or e.num_running]
        if busy:
            assert cluster.engine.clock == min(e.clock for e in busy)
        deciding = obs["pool"].reshape(3, -1)[:, POOL_INDEX["deciding"]]
        assert deciding.tolist() == [float(i == cluster.deciding) for i in range(3)]
        obs, *_ = env.step(admit_all(env))
    assert len({c for c in cluster.log.container if c >= 0}) == 3


@pytest.mark.parametrize("router", ["least_loaded", "round_robin", "warm_first"])
def test_conservation_and_latency_reward_across_containers(router):
    env = make(three_containers().unwrapped.workload, pool={"num_containers": 3, "router": router, "keep_alive_s": 1.0,
                                              "cold_start_s": 0.5}, engine={"check_invariants": True})
    env.reset(seed=0)
    total = run_to_end(env)
    log = env.unwrapped.cluster.log
    assert log.counts()["num_finished"] == log.num_requests
    assert total == pytest.approx(-np.sum(log.finish_s - log.arrival_s), rel=1e-9)


@pytest.mark.parametrize(("router", "containers", "cold"), [
    ("warm_first", [0, 0], [True, False]),   # B joins the busy warm container 0
    ("least_loaded", [0, 1], [True, True]),  # B goes to idle, cold container 1 and pays a cold start
])
def test_warm_first_prefers_a_busy_warm_container_over_a_cold_idle_one(router, containers, cold):
    workload = fixed([0.0, 3.0], [10, 10], [200, 3])  # A keeps container 0 busy well past t = 3 s
    env = make(workload, pool={"num_containers": 2, "router": router, "start_cold": True,
                               "keep_alive_s": 60.0, "cold_start_s": 1.0})
    env.reset(seed=0)
    run_to_end(env)
    log = env.unwrapped.cluster.log
    assert log.container.tolist() == containers
    assert log.cold_start.tolist() == cold


def test_pool_config_validation():
    with pytest.raises(ValueError, match="num_containers"):
        PoolConfig(num_containers=0)
    with pytest.raises(ValueError, match="keep_alive_s"):
        PoolConfig(keep_alive_s=-1.0)
    with pytest.raises(ValueError, match="cold_start_scale"):
        PoolConfig(cold_start_scale=0.0)
    with pytest.raises(ValueError, match="router"):
        PoolConfig(router="dice")


def test_the_pools_old_import_path_warns_and_gives_the_same_objects():
    # servegym.engine held the pool's names before servegym.pool: old imports keep working, with a warning.
    import servegym.engine
    import servegym.pool

    for name in ("Cluster", "ClusterStep", "PoolConfig", "Router", "length_intervals"):
        with pytest.warns(DeprecationWarning, match=f"servegym.engine.{name} moved to servegym.pool.{name}"):
            assert getattr(servegym.engine, name) is getattr(servegym.pool, name)
    with pytest.raises(AttributeError, match="no attribute 'Engines'"):
        servegym.engine.Engines  # noqa: B018


def test_warm_first_picks_the_least_loaded_of_the_warm_containers():
    # Rule: among the containers holding the model, the least loaded (queued + running). Both start warm; A (t = 0)
    # goes to container 0 (a tie) and keeps it busy past t = 3 s, so B (t = 3) goes to the idle warm container 1.
    workload = fixed([0.0, 3.0], [10, 10], [200, 3])
    env = make(workload, pool={"num_containers": 2, "router": "warm_first", "keep_alive_s": 60.0})
    env.reset(seed=0)
    run_to_end(env)
    log = env.unwrapped.cluster.log
    assert log.container.tolist() == [0, 1]
    assert log.cold_start.tolist() == [False, False]


def deciding_by_hand(cluster) -> int:
    """The container that should decide next: the earliest clock among those with work, else among all, the
    lowest index on ties."""
    busy = [e for e in cluster.engines if e.waiting.size or e.num_running]
    pool = busy or cluster.engines
    return min(pool, key=lambda e: (e.clock, e.container)).container


def test_an_arrival_delivered_to_an_idle_container_makes_it_decide_next():
    # A (short) goes to container 0, B (long) to container 1; C arrives at t = 1 s, when container 0 is idle, and is
    # delivered there at the pool's clock, which ties with container 1's: the lower index, container 0, decides
    # next (the containers with work changed with the delivery: not the scan made before routing).
    workload = fixed([0.0, 0.0, 1.0], [10, 10, 10], [3, 400, 3])
    env = make(workload, pool={"num_containers": 2, "router": "round_robin"})
    env.reset(seed=0)
    cluster = env.unwrapped.cluster
    switched = False
    for _ in range(1_000):
        _, _, terminated, truncated, info = env.step(admit_all(env))
        if terminated or truncated:
            break
        assert cluster.deciding == deciding_by_hand(cluster)
        switched |= info["num_arrived"] == 1 and info["container"] == 1 and cluster.deciding == 0
    assert switched and terminated
    assert cluster.log.container.tolist() == [0, 1, 0]


def test_a_pool_idle_between_arrivals_is_not_done():
    # Both containers empty after A; B arrives 50 s later: the episode goes on until B is served.
    env = make(fixed([0.0, 50.0], [10, 10], [3, 3]), pool={"num_containers": 2})
    env.reset(seed=0)
    run_to_end(env)
    log = env.unwrapped.cluster.log
    assert log.counts()["num_finished"] == 2 and log.finish_s[1] > 50.0


def test_requests_waiting_beside_a_running_or_loading_container_are_not_a_stall():
    # Container 1's queue waits (the policy admits nothing there) while container 0 runs: not a stall.
    workload = fixed([0.0, 0.0], [10, 10], [50, 50])
    env = make(workload, pool={"num_containers": 2, "router": "round_robin"})
    env.reset(seed=0)
    cluster = env.unwrapped.cluster
    for _ in range(40):
        action = admit_all(env) if cluster.deciding == 0 else np.zeros_like(admit_all(env))
        _, _, _, _, info = env.step(action)
        assert cluster.engines[1].waiting.size == 1 and info["num_stalled_steps"] == 0
    # Both containers loading their model (cold start) with requests waiting: not a stall either.
    env = make(workload, pool={"num_containers": 2, "router": "round_robin", "start_cold": True, "cold_start_s": 3.0})
    env.reset(seed=0)
    _, _, _, _, info = env.step(admit_all(env))
    assert info["num_admitted"] == 0 and info["num_stalled_steps"] == 0
