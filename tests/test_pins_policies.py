"""Pins of policy rules no other test fixes, each computed by hand on an asymmetric example: TWP's l_min fallback,
per-class flow control's KV check, A_min's estimate boundary, order and running plan, Sarathi's sequence cap, the
vLLM-style first chunk at the token budget and budget left after the running batch, Priority's fit in its own order,
DynamicBatch's ITL threshold and cap, and random admission's seeded coins."""

from __future__ import annotations

import numpy as np
import pytest

from servegym.engine.preemption import amin_estimate
from servegym.envs.observation import ENGINE_INDEX, RUNNING_INDEX, running_matrix
from servegym.policies import make_policy
from servegym.policies.vllm import admit_within_budget, budget_after_running
from tests.test_bite_policies import crafted, reset_obs

CAPACITY_TOKENS = 12_000 * 16
"""flat_profile's KV cache: 12,000 blocks of 16 tokens."""


def free_frac(blocks: int) -> float:
    return blocks * 16 / CAPACITY_TOKENS


def admitted_slots(action: np.ndarray) -> list[int]:
    return np.flatnonzero(action).tolist()


def test_twp_falls_back_to_the_smallest_itl_seen_when_the_profile_has_no_baseline():
    # Rule: sigma = l_hat / l_min, l_hat the EMA (weight 0.3) of measured ITLs; l_min is the profile's baseline
    # step latency when it has one (> 0), else the smallest ITL measured so far; 1.0 before any ITL.
    policy = make_policy("twp")
    _, obs = reset_obs(policy)
    policy.reset()

    def sigma(itl: float, baseline: float = 0.0) -> float:
        return policy._monitor(crafted(obs, itl_last_s=itl, baseline_step_s=baseline))

    assert sigma(0.0) == 1.0
    assert sigma(0.125) == pytest.approx(1.0, rel=1e-12)  # l_hat = l_min = 0.125
    l_hat = 0.125 + 0.3 * (0.0625 - 0.125)
    assert sigma(0.0625) == pytest.approx(l_hat / 0.0625, rel=1e-12)  # the floor falls to 0.0625
    l_hat += 0.3 * (0.25 - l_hat)
    assert sigma(0.25) == pytest.approx(l_hat / 0.0625, rel=1e-12)  # a slower step does not raise the floor
    assert sigma(0.0, baseline=0.5) == pytest.approx(l_hat / 0.5, rel=1e-12)  # a baseline wins over the floor


def test_per_class_flow_control_checks_free_kv_for_the_requests_it_chose():
    # Rule: with known lengths each class admits FIFO within its own budget (classes without one share
    # activation_budget); the chosen requests are then cut at the first whose prompt + 1 does not fit in free KV.
    policy = make_policy("flow-control", activation_budget=0.01, class_budgets=[(10, 1.0), (20, 1.0)])
    _, obs = reset_obs(policy, length_mode="known")
    queue = [{"num_prompt_tokens": 1, "output_lo": 30, "output_hi": 30},   # no class budget; shared one is 0
             {"num_prompt_tokens": 16, "output_lo": 10, "output_hi": 10},  # class 10: 17 tokens = 2 blocks
             {"num_prompt_tokens": 200, "output_lo": 20, "output_hi": 20}]  # class 20: 201 tokens = 13 blocks
    policy.reset()
    assert admitted_slots(policy.act(crafted(obs, queue, kv_free_frac=free_frac(3)))) == [1]  # 2 fit, 2 + 13 not
    policy.reset()
    assert admitted_slots(policy.act(crafted(obs, queue, kv_free_frac=free_frac(15)))) == [1, 2]  # both fit


def test_amin_estimate_doubles_only_once_the_request_has_generated_it():
    # Rule: lo * 2**k for the smallest k with lo * 2**k > generated, capped at hi while hi > generated; lo below 1
    # counts as 1. A request that outgrew hi (a real predictor's miss) keeps doubling: 10 -> 20 -> 40 > 20, not 15.
    lo = np.array([10.0, 10.0, 10.0, 10.0, 3.0, 0.0, 10.0, 10.0])
    hi = np.array([100.0, 100.0, 100.0, 15.0, 100.0, 100.0, 15.0, 15.0])
    generated = np.array([0.0, 9.0, 10.0, 12.0, 3.0, 1.0, 20.0, 15.0])
    np.testing.assert_array_equal(amin_estimate(lo, hi, generated), [10.0, 10.0, 20.0, 15.0, 6.0, 2.0, 40.0, 20.0])


@pytest.mark.parametrize(("budget", "seqs"), [(64, 64), (512, 128)])
def test_sarathi_caps_running_sequences_at_its_token_budget(budget, seqs):
    # Rule: every running request decodes each iteration inside the fixed budget, so at most min(128, budget) run.
    overrides = make_policy("sarathi", token_budget=budget).engine_overrides()
    assert overrides == {"max_num_batched_tokens": budget, "prefill_chunk_tokens": budget, "max_num_seqs": seqs}


@pytest.mark.parametrize(("prompt", "free_blocks", "expected"), [
    (100, 1, 1),  # a 16-token first chunk (the budget left) needs 1 block, no sampled token yet: admitted
    (16, 1, 0),   # a first chunk that completes the prompt also holds its first token: 17 tokens, 2 blocks
    (16, 2, 1),
])
def test_vllm_first_chunk_is_cut_at_the_token_budget_left(prompt, free_blocks, expected):
    # Rule: an admission's first chunk is min(prefill chunk, prompt + recompute, budget left); it needs blocks for
    # that chunk, plus one token when the chunk completes the prompt; admission stops at the first that misfits.
    policy = make_policy("vllm")
    _, obs = reset_obs(policy)
    queue = [{"num_prompt_tokens": prompt, "output_lo": 1, "output_hi": 100},
             {"num_prompt_tokens": 1, "output_lo": 1, "output_hi": 100}]
    obs = crafted(obs, queue, kv_free_frac=free_frac(free_blocks), prefill_chunk_tokens=512)
    assert admit_within_budget(obs, 16) == expected


@pytest.mark.parametrize(("budget", "expected"), [
    (1000, 701),  # 1000 - 3 decodes - (min(300, 256) + min(40, 256)) ongoing chunks
    (200, 0),     # the running batch alone overruns the budget: nothing is left, not a negative budget
])
def test_vllm_budget_left_after_decodes_and_ongoing_chunks(budget, expected):
    # Rule: every decoding row takes one token; every prefilling row takes its next chunk, min(prefill left,
    # prefill chunk); the admissions get what is left, at least 0. Five rows run, three decoding; the table's
    # unused rows (zeros, which read as decoding) do not count.
    _, obs = reset_obs(make_policy("vllm"))
    obs = crafted(obs, prefill_chunk_tokens=256, num_running=5)
    run = running_matrix(obs)
    assert run.shape[0] > 5
    run[:] = 0.0
    run[:5, RUNNING_INDEX["num_prefill_left"]] = [0, 300, 0, 40, 0]
    assert obs["engine"][ENGINE_INDEX["num_running"]] == 5
    assert budget_after_running(obs, budget) == expected


def test_vllm_admits_nothing_once_the_token_budget_is_spent():
    # A zero first chunk would need no block; admission must stop at a spent budget, not admit for free.
    _, obs = reset_obs(make_policy("vllm"))
    obs = crafted(obs, [{"num_prompt_tokens": 100, "output_lo": 1, "output_hi": 100}],
                  kv_free_frac=free_frac(50), prefill_chunk_tokens=512)
    assert admit_within_budget(obs, 0) == 0
    assert admit_within_budget(obs, 1) == 1


@pytest.mark.parametrize(("free_blocks", "budget", "expected"), [
    (1, 100, 0),  # A's whole recompute (16 tokens) completes its prefill: 17 tokens, 2 blocks, 1 free
    (2, 12, 1),   # A's first chunk is cut at the budget (12 of 16): 1 block, and the budget is spent before B
])
def test_vllm_first_chunk_counts_a_preempted_requests_generated_tokens(free_blocks, budget, expected):
    # Rule: a preempted request recomputes prompt + generated tokens, so that sum is its prefill target. A: a
    # 10-token prompt with 6 generated before preemption (target 16); B: a 1-token prompt. Reading the prompt
    # alone (target 10) would take A's first chunk as the whole prefill (11 tokens, 1 block) and admit B after it.
    _, obs = reset_obs(make_policy("vllm"))
    queue = [{"num_prompt_tokens": 10, "num_generated": 6, "output_lo": 1, "output_hi": 100},
             {"num_prompt_tokens": 1, "output_lo": 1, "output_hi": 100}]
    obs = crafted(obs, queue, kv_free_frac=free_frac(free_blocks), prefill_chunk_tokens=512)
    assert admit_within_budget(obs, budget) == expected


def test_vllm_admissions_spend_free_blocks_and_stop_at_free_slots():
    # Rule: each admission takes its first chunk's blocks from those free; at most the free sequence slots are
    # admitted. A (20-token prompt: 21 tokens, 2 blocks) then B (30: 31 tokens, 2 blocks) with 3 blocks free: A
    # only. With 50 blocks free all three (C: 6 tokens, 1 block); with one slot left (the table holds max_num_seqs
    # rows), A only again.
    _, obs = reset_obs(make_policy("vllm"))
    queue = [{"num_prompt_tokens": 20, "output_lo": 1, "output_hi": 100},
             {"num_prompt_tokens": 30, "output_lo": 1, "output_hi": 100},
             {"num_prompt_tokens": 5, "output_lo": 1, "output_hi": 100}]
    assert admit_within_budget(crafted(obs, queue, kv_free_frac=free_frac(3), prefill_chunk_tokens=512), 100) == 1
    assert admit_within_budget(crafted(obs, queue, kv_free_frac=free_frac(50), prefill_chunk_tokens=512), 100) == 3
    slots = running_matrix(obs).shape[0]
    assert slots > 3
    one_slot = crafted(obs, queue, kv_free_frac=free_frac(50), prefill_chunk_tokens=512, num_running=slots - 1)
    assert admit_within_budget(one_slot, 100) == 1


def amin_obs(num_kv_blocks: int, queue, running=()):
    """A crafted predicted-mode observation for A_min: ``queue`` and ``running`` rows (dicts of features)."""
    _, obs = reset_obs(make_policy("amin"), num_kv_blocks=num_kv_blocks, block_size=16, length_mode="predicted")
    obs = crafted(obs, queue, num_running=len(running))
    run = running_matrix(obs)
    run[:] = 0.0
    for i, row in enumerate(running):
        for name, value in row.items():
            run[i, RUNNING_INDEX[name]] = value
    return obs


def test_amin_ranks_by_the_lower_end_shortest_first():
    # Rule: each waiting request's estimate is its interval's lower end (doubled once outgrown; nothing generated
    # here), admitted shortest estimate first while the future-memory check holds (tokens, 15 of slack each).
    # 10 blocks of 16 = 160 tokens, 10-token prompts. A shows [100, 110], B [5, 300]: estimates 100 and 5, so B
    # is ranked first. B alone peaks at 10 + 5 + 15 = 30; with A the peak is A's 10 + 100 at t = 100, + 30 = 140
    # <= 160: both are admitted, B first (ranks [2, 1]; FCFS would give [1, 2]).
    # (Ranking by the upper ends, 110 and 300, puts A first and then B peaks at 310 + 30 > 160: [1, 0].)
    a = {"num_prompt_tokens": 10, "output_lo": 100, "output_hi": 110}
    b = {"num_prompt_tokens": 10, "output_lo": 5, "output_hi": 300}
    assert make_policy("amin").act(amin_obs(10, [a, b]))[:2].tolist() == [2, 1]


def test_amin_plans_a_running_request_for_what_is_left_of_its_estimate():
    # Rule: a running request is planned to hold prompt + generated + t tokens for its remaining estimate: estimate
    # minus generated. R (10-token prompt, 40 generated, [30, 1000]) has outgrown lo = 30, so its estimate is 60
    # and 20 tokens are left. C (10-token prompt, [50, 50]) has 50 left. 10 blocks = 160 tokens.
    # At t = 20: R holds 50 + 20 = 70, C holds 10 + 20 = 30: 100; at t = 50 C alone holds 60. Peak 100, + 2 x 15
    # of slack = 130 <= 160: C is admitted. (Planning R for its whole estimate, 60 more tokens, peaks at t = 50:
    # 100 + 60 = 160, + 30 = 190 > 160: refused.)
    r = {"num_prompt_tokens": 10, "num_kv_tokens": 50, "num_generated": 40, "output_lo": 30, "output_hi": 1000}
    c = {"num_prompt_tokens": 10, "output_lo": 50, "output_hi": 50}
    policy = make_policy("amin")
    policy.reset()
    assert policy.act(amin_obs(10, [c], running=[r]))[:1].tolist() == [1]
    assert policy.running_estimates.tolist() == [60.0]


def test_priority_counts_what_fits_in_its_own_order():
    # Rule: ascending prompt length, admitted while the prompts (+ first token) fit in free KV, counted in that
    # order. 10 free blocks of 16. A (200 tokens) needs ceil(201/16) = 13, B (20) 2, C (100) ceil(101/16) = 7.
    # Sorted B, C, A: 2, 9, 22 blocks, so B and C are admitted (ranks [0, 1, 2]). FCFS stops at A and admits
    # nothing; counting the fit in queue order would too.
    policy = make_policy("priority")
    _, obs = reset_obs(policy)
    queue = [{"num_prompt_tokens": 200}, {"num_prompt_tokens": 20}, {"num_prompt_tokens": 100}]
    assert policy.act(crafted(obs, queue, kv_free_frac=free_frac(10)))[:3].tolist() == [0, 1, 2]


@pytest.mark.parametrize(("itl", "expected"), [
    (0.0625, [1, 1, 0, 0]),  # at the target (exact in float32): not above it, the batch may grow to max_batch
    (0.0626, [0, 0, 0, 0]),  # above it: the batch may not grow
])
def test_dynamic_batch_grows_to_its_cap_unless_itl_exceeds_the_target(itl, expected):
    # Rule: while smoothed ITL is strictly above itl_target_s, admit nothing; else admit FCFS up to max_batch
    # running. One runs and max_batch = 3, so 3 - 1 = 2 of the 4 small waiting requests are admitted.
    policy = make_policy("dynamic-batch", itl_target_s=0.0625, max_batch=3)
    _, obs = reset_obs(policy)
    queue = [{"num_prompt_tokens": 10}] * 4
    assert policy.act(crafted(obs, queue, itl_smoothed_s=itl, num_running=1))[:4].tolist() == expected


@pytest.mark.parametrize(("p", "expected"), [
    (0.5, [0, 1, 1]),  # seed 0's first draws: 0.637, 0.270, 0.041
    (0.0, [0, 0, 0]),
    (1.0, [1, 1, 1]),
])
def test_random_admits_each_visible_request_on_a_seeded_coin(p, expected):
    # Rule: one draw of the policy's generator (seeded, restarted by reset) per visible waiting request; admitted
    # when the draw is below p. Three of the 8 queue slots are visible; the rest are never admitted.
    assert np.random.default_rng(0).random(3).round(3).tolist() == [0.637, 0.270, 0.041]
    policy = make_policy("random", admit_probability=p, seed=0)
    _, obs = reset_obs(policy)
    policy.reset()
    action = policy.act(crafted(obs, [{"num_prompt_tokens": 10}] * 3))
    assert action.tolist() == expected + [0] * 5
