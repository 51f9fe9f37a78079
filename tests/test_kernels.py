"""The admission kernels (``policies/kernels.py``): hand-computed cases, the fused score-rule count against the two
rules it fuses, and the compiled build against the same source run as Python."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from servegym.envs import ENGINE_INDEX, QUEUE_FEATURES, queue_matrix, running_matrix
from servegym.envs.observation import QUEUE_INDEX, RUNNING_INDEX, queue_prefix_matrix
from servegym.policies import common, kernels, make_policy
from servegym.policies.common import (
    fcfs_count,
    longest_feasible_prefix,
    upper_bound_prefix,
    upper_remaining_queue,
    upper_remaining_running,
    visible_queue,
)
from servegym.runner import make_env
from tests.conftest import fixed, flat_profile


def interpreted() -> SimpleNamespace:
    """``policies/kernels.py`` executed as Python, beside whatever build the package imported."""
    path = Path(common.__file__).with_name("kernels.py")
    namespace: dict = {"__name__": "kernels_interpreted"}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    assert namespace["COMPILED"] is False
    return SimpleNamespace(**namespace)


BUILDS = [pytest.param(kernels, id="as-imported"), pytest.param(interpreted(), id="interpreted")]


def _doubles(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float64)


@pytest.mark.parametrize("k", BUILDS)
def test_feasible_count_by_hand(k):
    # One running request: 100 tokens held, 3 left. Candidates in order: A (50 held, 1 left), B (20 held, 10 left).
    # Completion times 3, 1, 10. Running alone: 103 at t=3, 101 at t=1, 0 at t=10 (done by then).
    # + A (alive only while t <= 1): 103, 152, 0 -> peak 152. + B (alive at all three): 126, 173, 30 -> peak 173.
    def count(slack, capacity):
        return k.feasible_count(_doubles(100), _doubles(3), _doubles(50, 20), _doubles(1, 10), np.empty(3),
                                np.empty(3), slack, capacity)

    assert count(0.0, 173.0) == 2  # both fit exactly: the bound is <=
    assert count(0.0, 172.0) == 1  # B's prefix peaks at 173
    assert count(4.0, 160.0) == 1  # A: 152 + 2 x 4 slack = 160 <= 160; B: 173 + 12 > 160
    assert count(4.0, 159.0) == 0
    assert count(0.0, 151.0) == 0  # A alive at t=1 (1 >= 1): 101 + 51; a strict > would see 103 only
    assert count(0.0, 150.0) == 0


@pytest.mark.parametrize("k", BUILDS)
def test_feasible_count_counts_the_running_batch_at_each_time(k):
    # Nothing queued but one candidate of 10 tokens and 5 left; the running request (200 held, 8 left) dominates.
    # Peak of the pair: t=5 -> 205 + 15 = 220, t=8 -> 208. Without the running batch it would be 15.
    args = (_doubles(200), _doubles(8), _doubles(10), _doubles(5), np.empty(2), np.empty(2), 0.0)
    assert k.feasible_count(*args, 220.0) == 1
    assert k.feasible_count(*args, 219.0) == 0


@pytest.mark.parametrize("k", BUILDS)
def test_fitting_count_by_hand(k):
    # Block 16. Slot 0: 30 prompt -> 31 tokens -> 2 blocks. Slot 1: 15 prompt -> 16 tokens -> 1 block. Slot 2:
    # 40 prompt + 8 to recompute -> 49 tokens -> 4 blocks, 32 tokens cached on the GPU -> 2 whole blocks -> 2.
    queue = np.zeros(3 * len(QUEUE_FEATURES), dtype=np.float32)
    for slot, (prompt, generated) in enumerate([(30, 0), (15, 0), (40, 8)]):
        queue[slot * len(QUEUE_FEATURES) + QUEUE_INDEX["num_prompt_tokens"]] = prompt
        queue[slot * len(QUEUE_FEATURES) + QUEUE_INDEX["num_generated"]] = generated
    order = np.array([2, 1, 0], dtype=np.int64)
    hits = _doubles(32, 0, 0)  # in order: slot 2's

    def count(budget, slots=8, hits=hits):
        return k.fitting_count(queue, order, hits, 16, budget, slots)

    assert [count(b) for b in (1, 2, 3, 4, 5, 6)] == [0, 1, 2, 2, 3, 3]  # cumulative 2, 3, 5: within is <=
    assert count(5, slots=2) == 2
    assert count(5, hits=_doubles(31, 0, 0)) == 2  # 31 cached tokens are one whole block: 3, 4, 6
    assert k.fitting_count(queue, np.array([0, 1, 2], dtype=np.int64), _doubles(0, 0, 32), 16, 3, 8) == 2  # 2, 3


@pytest.mark.parametrize("k", BUILDS)
def test_a_slot_past_the_queue_is_an_index_error_not_a_stray_read(k):
    queue = np.zeros(2 * len(QUEUE_FEATURES), dtype=np.float32)
    with pytest.raises(IndexError):
        k.fitting_count(queue, np.array([0, 2], dtype=np.int64), _doubles(0, 0), 16, 100.0, 8)


# --------------------------------------------------------------------------- the fused count on real observations
def _observation(prefix_caching: bool) -> dict:
    env = make_env(make_policy("fcfs"), workload=fixed([0.0], [10], [5]), profile=flat_profile(), queue_window=8,
                   engine={"prefix_caching": prefix_caching})
    obs, _ = env.reset(seed=0)
    env.close()
    return obs


def _random_case(rng: np.random.Generator, base: dict) -> dict:
    obs = {key: value.copy() for key, value in base.items()}
    queue, running = queue_matrix(obs), running_matrix(obs)
    queue[:], running[:] = 0.0, 0.0
    waiting, num_running = int(rng.integers(1, queue.shape[0] + 1)), int(rng.integers(0, 6))
    queue[:waiting, QUEUE_INDEX["num_prompt_tokens"]] = rng.integers(1, 300, waiting)
    queue[:waiting, QUEUE_INDEX["num_generated"]] = rng.choice([0, 0, 13], waiting)
    queue[:waiting, QUEUE_INDEX["output_hi"]] = rng.integers(1, 60, waiting) + queue[:waiting, QUEUE_INDEX[
        "num_generated"]] * rng.integers(0, 2, waiting)  # some already past their bound: 1 token left
    running[:num_running, RUNNING_INDEX["num_prompt_tokens"]] = rng.integers(1, 200, num_running)
    running[:num_running, RUNNING_INDEX["num_generated"]] = rng.integers(0, 40, num_running)
    running[:num_running, RUNNING_INDEX["output_hi"]] = rng.integers(1, 80, num_running)
    if "queue_prefix" in obs:
        queue_prefix_matrix(obs)[:waiting, 0] = rng.integers(0, 3, waiting) * rng.integers(0, 120, waiting)
    engine = obs["engine"]
    engine[ENGINE_INDEX["num_waiting"]] = waiting
    engine[ENGINE_INDEX["num_running"]] = num_running
    engine[ENGINE_INDEX["kv_capacity_tokens"]] = float(rng.integers(200, 2000))
    engine[ENGINE_INDEX["kv_free_frac"]] = float(rng.uniform(0.0, 1.0))
    return obs


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_the_fused_count_is_the_prefix_that_fits_now_and_stays_feasible(prefix_caching):
    # upper_bound_prefix (one compiled pass) against the two rules it fuses, each computed on its own: the requests
    # that fit now in this order (fcfs_count) and the longest prefix whose projected peak at the upper-bound
    # lengths fits (longest_feasible_prefix on the reordered rows). Random orders, so that reading a candidate's
    # tokens left by position instead of by slot shows.
    rng = np.random.default_rng(7)
    base = _observation(prefix_caching)
    outcomes = set()
    for _ in range(300):
        obs = _random_case(rng, base)
        rows = visible_queue(obs)
        order = rng.permutation(rows.shape[0])
        target = float(rng.choice([0.3, 0.8, 1.0, 1.5]))
        ordered = rows[order]
        fits_now = fcfs_count(obs, order)
        feasible = longest_feasible_prefix(obs, upper_remaining_running(obs), ordered,
                                           upper_remaining_queue(ordered), target)
        expected = min(fits_now, feasible)
        assert upper_bound_prefix(obs, order, target) == expected
        outcomes.add((expected == fits_now, expected == feasible, expected == 0))
    assert {(True, False, False), (False, True, False), (True, True, False)} <= outcomes  # each rule binds


def _score_admit(k, obs: dict, scores: np.ndarray, target: float) -> tuple[int, np.ndarray]:
    """``k.score_admit`` on ``obs`` with the arguments :func:`common.admit_by_score` passes."""
    engine = common.engine_values(obs)
    visible, num_run = common.visible_count(obs, engine), int(engine[ENGINE_INDEX["num_running"]])
    hits = queue_prefix_matrix(obs)[:visible, 0].astype(np.float64)
    action = np.full(queue_matrix(obs).shape[0], -7, dtype=np.int64)  # every entry must be written
    count = k.score_admit(obs["queue"], obs["running"], hits, scores, visible, num_run,
                          int(engine[ENGINE_INDEX["kv_block_size"]]), common.free_blocks(obs, engine),
                          common.free_slots(obs, engine), target * engine[ENGINE_INDEX["kv_capacity_tokens"]],
                          np.empty(visible, dtype=np.int64), action, np.empty((8, num_run + visible)))
    return count, action


@pytest.mark.parametrize("k", BUILDS)
@pytest.mark.parametrize("prefix_caching", [False, True])
def test_the_score_rule_in_one_pass_is_a_stable_ranking_cut_at_the_fused_count(k, prefix_caching):
    # score_admit (what admit_by_score runs) against the rule spelled out with numpy: a stable argsort of -scores
    # over the visible slots (ties keep queue order: scores drawn from 4 values tie often), cut at
    # upper_bound_prefix in that order, ranks 1.. written to those slots and 0 elsewhere.
    rng = np.random.default_rng(11)
    base = _observation(prefix_caching)
    counts = set()
    for _ in range(300):
        obs = _random_case(rng, base)
        width = queue_matrix(obs).shape[0]
        scores = rng.choice([-1.0, -0.0, 0.0, 0.5], width) if rng.random() < 0.5 else rng.normal(size=width)
        target = float(rng.choice([0.3, 0.8, 1.0, 1.5]))
        visible = common.visible_count(obs)
        ranked = np.argsort(-scores[:visible], kind="stable")
        expected = ranked[: upper_bound_prefix(obs, ranked, target)]
        want = np.zeros(width, dtype=np.int64)
        want[expected] = np.arange(1, expected.size + 1)
        count, action = _score_admit(k, obs, scores, target)
        assert count == expected.size and np.array_equal(action, want)
        if k is kernels:
            assert np.array_equal(common.admit_by_score(obs, scores, target), want)
        counts.add(min(count, 2))
    assert counts == {0, 1, 2}  # none, one and several admitted


@pytest.mark.parametrize("k", BUILDS)
def test_the_score_rule_refuses_a_visible_score_that_is_not_finite_and_ignores_the_rest(k):
    obs = _random_case(np.random.default_rng(5), _observation(False))
    visible, width = common.visible_count(obs), queue_matrix(obs).shape[0]
    assert visible < width
    for bad in (np.nan, np.inf, -np.inf):
        scores = np.zeros(width)
        scores[visible - 1] = bad
        count, action = _score_admit(k, obs, scores, 1.0)
        assert count == -1 and np.all(action == -7)
        with pytest.raises(ValueError, match="scores must be finite"):
            common.admit_by_score(obs, scores, 1.0)
        scores[visible - 1], scores[visible] = 0.0, bad  # past the visible queue: not read
        assert _score_admit(k, obs, scores, 1.0)[0] >= 0


def test_ci_builds_the_admission_kernels():
    # .ci/run sets SERVEGYM_REQUIRE_COMPILED=1: there a missing build fails instead of falling back silently.
    if os.environ.get("SERVEGYM_REQUIRE_COMPILED") == "1":
        assert kernels.COMPILED


def test_the_compiled_kernels_count_as_the_source_run_as_python():
    if not kernels.COMPILED:
        pytest.skip("the admission kernels are not compiled here")
    python = interpreted()
    rng = np.random.default_rng(3)
    for _ in range(200):
        num_run, num_cand = int(rng.integers(0, 8)), int(rng.integers(1, 12))
        args = [rng.integers(0, 500, n).astype(np.float64) for n in (num_run, num_run)]
        args += [rng.integers(0, 500, num_cand).astype(np.float64), rng.integers(1, 60, num_cand).astype(np.float64)]
        args[1] = np.maximum(args[1] % 60, 1.0)
        total = num_run + num_cand
        slack, capacity = float(rng.integers(0, 16)), float(rng.integers(0, 3000))
        fast = kernels.feasible_count(*args, np.empty(total), np.empty(total), slack, capacity)
        assert fast == python.feasible_count(*args, np.empty(total), np.empty(total), slack, capacity)
