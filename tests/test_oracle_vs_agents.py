"""benchmarks/oracle_vs_agents.py's pure measures on hand-computed cases, each asymmetric enough that one slip
(a flipped sign, a tie counted as a win, a pair contested in one episode only) changes the answer."""

from __future__ import annotations

import numpy as np
import pytest

from servegym.engine.log import EpisodeLog, State
from servegym.metrics import censored_latency
from tests.conftest import load_benchmark


@pytest.fixture(scope="module")
def ova():
    return load_benchmark("oracle_vs_agents")


def returns(ova) -> dict[str, dict[int, float]]:
    # Seed 1: agent a best and above the oracle; seed 2: agent b best and above it; seed 3: b ties the oracle.
    return {ova.ORACLE: {1: 10.0, 2: 10.0, 3: 10.0}, ova.SCORER: {1: 10.0, 2: 8.0, 3: 4.0},
            "rl:x__a": {1: 12.0, 2: 5.0, 3: 7.0}, "rl:x__b": {1: 9.0, 2: 11.0, 3: 10.0}}


def test_seed_rows_take_each_seeds_best_agent_and_only_strictly_better_agents_beat_the_oracle(ova):
    rows = ova.seed_rows(returns(ova), ["rl:x__a", "rl:x__b"])
    assert [(r.seed, r.best_agent) for r in rows] == [(1, "rl:x__a"), (2, "rl:x__b"), (3, "rl:x__b")]
    assert [r.agents_above_oracle for r in rows] == [["rl:x__a"], ["rl:x__b"], []]
    assert [r.scorer for r in rows] == [10.0, 8.0, 4.0]


def test_win_tie_loss_counts_exact_ties_apart_and_keeps_the_sides_order(ova):
    oracle, other = {1: 5.0, 2: 3.0, 3: 2.0, 4: 9.0}, {1: 4.0, 2: 3.0, 3: 7.0, 4: 1.0}
    assert ova.win_tie_loss(oracle, other) == (2, 1, 1)
    assert ova.win_tie_loss(other, oracle) == (1, 1, 2)


def test_paired_lines_compare_with_each_seeds_best_agent_not_the_best_on_average(ova):
    lines = ova.paired_lines(returns(ova), ova.seed_rows(returns(ova), ["rl:x__a", "rl:x__b"]), ["rl:x__a", "rl:x__b"])
    best = next(line for line in lines if line.startswith("| best agent"))
    # Per-seed best: 12, 11, 10 -> oracle minus it: -2, -1, 0 (agent b alone: +1, -1, 0, mean 0).
    assert "| -1.0 |" in best and "| 0 / 1 / 2 |" in best
    agent_b = next(line for line in lines if line.startswith("| agent b"))
    assert agent_b.split("|")[2].strip() == "+0.0" and agent_b.endswith("| 1 / 1 / 1 |")
    scorer = next(line for line in lines if line.startswith("| scorer"))  # oracle minus it: 0, +2, +6
    assert scorer.split("|")[2].strip() == "+2.7" and scorer.endswith("| 2 / 1 / 0 |")


def test_followed_steps_give_a_step_to_the_last_switch_there_and_add_up_repeats(ova):
    switches = ["fcfs@0", "twp@10", "mc-sf (frozen tuned)@10", "fcfs@30"]
    assert ova.parse_switches(switches)[2] == ("mc-sf (frozen tuned)", 10)
    assert ova.followed_steps(switches, 50) == {"fcfs": 30, "twp": 0, "mc-sf (frozen tuned)": 20}
    assert ova.followed_steps(["scorer@0"], 7) == {"scorer": 7}


def test_newly_admitted_counts_re_admitted_preempted_requests_but_not_arrivals_preemptions_or_running_ones(ova):
    before = np.array([State.WAITING, State.PREEMPTED, State.WAITING, State.PENDING, State.DECODING,
                       State.PREFILLING, State.FINISHED, State.PENDING])
    after = np.array([State.PREFILLING, State.DECODING, State.WAITING, State.WAITING, State.PREEMPTED,
                      State.DECODING, State.FINISHED, State.REJECTED])
    assert ova.newly_admitted(before, after) == frozenset({0, 1})


def test_compare_admissions_says_more_fewer_or_other(ova):
    oracle = frozenset({3, 4})
    assert ova.compare_admissions(frozenset({4, 3}), oracle) == "same"
    assert ova.compare_admissions(frozenset({3, 4, 5}), oracle) == "more"
    assert ova.compare_admissions(frozenset({3}), oracle) == "fewer"
    assert ova.compare_admissions(frozenset({3, 5}), oracle) == "other"


def test_order_agreement_counts_pairs_contested_in_both_episodes_in_arrival_order(ova):
    # Requests given out of arrival order (request 0 arrives third). Contested in both: (1,2), (2,0), (2,3), (0,3);
    # (1,0) only in episode a (request 1 admitted at 2.1 there, 1.5 in b). Same order: (1,2) (1 first in both)
    # and (0,3) (admitted together in both); (2,0) and (2,3) flip.
    arrival = np.array([2.0, 0.0, 1.0, 2.2])
    admit_a = np.array([2.5, 2.1, 3.0, 2.5])
    admit_b = np.array([3.0, 1.5, 2.5, 3.0])
    assert ova.order_agreement(arrival, admit_a, admit_b) == (4, 0.5)
    assert ova.order_agreement(arrival, admit_a, admit_a) == (5, 1.0)


def small_log() -> EpisodeLog:
    """Request 0 served (0 -> 0.5 -> 3), 1 admitted at 2 and still decoding, 2 waiting, 3 not yet arrived,
    4 rejected; iterations end at 1.0 and 4.0, so the episode ends at 4."""
    n = 5
    log = EpisodeLog(np.array([0.0, 1.0, 2.0, 5.0, 1.5]), np.array([100, 200, 300, 50, 9000]), np.full(n, 10),
                     np.full(n, 10), np.full(n, 10), np.zeros(n, dtype=bool), num_kv_blocks=10, block_size=16)
    log.state[:] = [State.FINISHED, State.DECODING, State.WAITING, State.PENDING, State.REJECTED]
    log.admit_s[:2] = [0.5, 2.0]
    log.finish_s[0] = 3.0
    log.cached_gpu_tokens[1] = 50
    # (end_s, dt_s, decode, prefill seqs, prefill tokens, running, waiting, used blocks, admitted, preempted, done)
    log.step_rows[0] += [(1.0, 1.0, 1, 1, 100, 1, 0, 7, 1, 0, 0), (4.0, 3.0, 5, 1, 350, 1, 1, 9, 1, 0, 1)]
    return log


def test_request_times_split_the_charged_request_seconds_into_wait_and_service(ova):
    log = small_log()
    admit, wait, service = ova.request_times(log)
    np.testing.assert_array_equal(admit[:3], [0.5, 2.0, 4.0])
    np.testing.assert_array_equal(wait, [0.5, 1.0, 2.0, 0.0, 0.0])
    np.testing.assert_array_equal(service, [2.5, 2.0, 0.0, 0.0, 0.0])
    assert (wait + service).sum() == censored_latency(log).sum() == 8.0


def test_recomputed_tokens_are_prefill_beyond_admitted_prompts_less_their_cached_tokens(ova):
    # 450 prefilled; first prefills: 100 (request 0) + 200 - 50 cached (request 1); request 2 never admitted.
    assert ova.recomputed_tokens(small_log()) == 200


def test_bucket_sums_put_an_edge_in_the_lower_bucket(ova):
    sums = ova.bucket_sums(np.array([1.0, 2.0, 3.0, 4.0, 5.0]), np.array([5, 10, 15, 25, 20]), [10.0, 20.0])
    np.testing.assert_array_equal(sums, [3.0, 8.0, 4.0])


def test_decision_shares_bucket_as_bucket_sums_and_give_each_outcomes_share(ova):
    """Bugs: an edge value put in the upper bucket; shares in another order than OUTCOMES; an empty bucket's shares
    0 rather than NaN (a table would read it as "never")."""
    def decision(kv: float, outcome: str):
        return ova.Decision(kv, 1, {"p": outcome})

    decisions = [decision(0.2, "same"), decision(0.5, "more"), decision(0.6, "fewer"), decision(0.95, "other"),
                 decision(0.95, "more")]
    rows = ova.decision_shares(decisions, "p", [d.kv_used for d in decisions], [0.5, 0.9, 0.99])
    assert [steps for steps, _ in rows] == [2, 1, 2, 0]
    assert rows[0][1] == [0.5, 0.5, 0.0, 0.0]  # <= 0.5: same, more (0.5 is the edge: the lower bucket)
    assert rows[1][1] == [0.0, 0.0, 1.0, 0.0]  # (0.5, 0.9]: fewer
    assert rows[2][1] == [0.0, 0.5, 0.0, 0.5]  # (0.9, 0.99]: other, more
    assert all(np.isnan(rows[3][1]))


def test_replay_decisions_record_the_state_before_each_decision_and_each_policys_admissions_beside_it(ova,
                                                                                                   monkeypatch):
    """Bugs: the state read after the step (KV in use counting the step's own admissions); steps where nothing
    can be admitted counted as decisions; the outcome's sides swapped (the replayed action as the policy).

    Three requests at t = 0 (prompts 100, 200 and 50; 4 output tokens each), 30 KV blocks of 16 tokens. The
    replayed actions admit the first waiting request at each step; FCFS would admit every one that fits. Decision
    1: nothing in use, 3 waiting, FCFS admits 3 where the replay admits 1 ("more"). Decision 2: request 0 holds
    ceil((100 + 1) / 16) = 7 blocks, 2 waiting, FCFS admits both ("more"). Decision 3: 7 + ceil((200 + 1) / 16) =
    20 blocks, 1 waiting, both admit it ("same"). Then 3 more steps decode to the end with nothing to admit."""
    from servegym.benchmark.oracle import add_rewards
    from servegym.policies import make_policy
    from servegym.policies.base import admit_first
    from servegym.runner import make_env, serving_env
    from tests.conftest import fixed

    def small(**_):
        return make_env(workload=fixed([0.0, 0.0, 0.0], [100, 200, 50], [4, 4, 4]), profile="a100-llama2-7b",
                        engine={"num_kv_blocks": 30, "block_size": 16})

    monkeypatch.setattr(ova, "make_env", small)
    env = small()
    obs, _ = env.reset(seed=0)
    actions, total, done = [], 0.0, False
    while not done:
        actions.append(admit_first(obs, 1 if serving_env(env).cluster.engine.waiting.size else 0))
        obs, reward, terminated, truncated, info = env.step(actions[-1])
        total, done = add_rewards(total, reward, info), terminated or truncated
    assert len(actions) == 6
    decisions = ova.replay_decisions("any", 0, actions, {"fcfs": make_policy("fcfs")}, total)
    assert [(d.kv_used * 30, d.waiting, d.outcomes["fcfs"]) for d in decisions] == [
        (0.0, 3, "more"), (7.0, 2, "more"), (20.0, 1, "same")]
    with pytest.raises(RuntimeError, match="returned"):
        ova.replay_decisions("any", 0, actions, {"fcfs": make_policy("fcfs")}, total + 1.0)
