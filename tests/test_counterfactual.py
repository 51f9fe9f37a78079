"""Counterfactual regret of routing decisions (``evaluation/counterfactual.py``, ``servegym run
--counterfactual-k``): every replica rolled out on a copy at each of the first k decisions."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from servegym.cli import main
from servegym.envs import ServingEnv
from servegym.envs.routing import RoutingEnv
from servegym.evaluation.counterfactual import counterfactual_regret, write_counterfactual
from servegym.policies import Policy, make_policy
from servegym.runner import run_episode
from tests.conftest import fixed

PROFILE = "a100-llama3-8b"
"""1,000 + 200 tokens take 75 of its 16-token KV blocks."""


def shared_prefix_env() -> RoutingEnv:
    """Three replicas with prefix caching on the shared-prefix workload (263 arrivals), cut at 5,000 iterations
    (0.1 s an episode)."""
    serving = ServingEnv(workload="shared-prefix", profile=PROFILE, engine={"prefix_caching": True},
                         pool={"num_containers": 3, "router": "agent"}, decision_steps=True, max_steps=5000)
    return RoutingEnv(serving, make_policy("fcfs"))


def two_replicas(workload, **pool) -> RoutingEnv:
    serving = ServingEnv(workload=workload, profile=PROFILE, engine=pool.pop("engine", {}),
                         pool={"num_containers": 2, "router": "agent", **pool}, decision_steps=True)
    return RoutingEnv(serving, make_policy("fcfs"))


class FirstReplica(Policy):
    """Routes every arrival to replica 0."""

    name = "first-replica"
    decision = "route"

    def act(self, obs):
        return np.int64(0)


def test_the_chosen_replica_returns_the_episodes_return_to_the_bit():
    # power-of-two draws from its own generator: its state is copied with the env, or the branches would differ
    decisions = counterfactual_regret(shared_prefix_env(), make_policy("router-power-of-two"), seed=0, k=2)
    episode = run_episode(shared_prefix_env(), make_policy("router-power-of-two"), seed=0).total_reward
    assert [d.decision for d in decisions] == [0, 1]
    assert [d.request for d in decisions] == [0, 1]
    for d in decisions:
        assert len(d.returns) == 3 and d.masked == ()
        assert d.returns[d.chosen] == episode  # exactly: the chosen branch is the episode itself
        assert d.regret >= 0 and d.regret == max(d.returns) - d.returns[d.chosen]
        assert d.returns[d.best] == max(d.returns)
        assert (d.best == d.chosen) == (d.regret == 0)
    assert decisions[0].return_before == 0.0 and decisions[1].return_before < 0  # request 0's wait so far
    assert decisions[0].time_s <= decisions[1].time_s


def test_a_full_replica_shows_the_queueing_it_costs_as_regret():
    # Each request needs 75 of the 80 KV blocks: sent to replica 0 behind request 0, request 1 waits until
    # request 0 finishes; sent to the idle replica 1 it starts at once. Nothing else differs (each runs alone
    # on identical replicas), so the regret is exactly request 1's wait.
    env = two_replicas(fixed([0.0, 0.1], [1000, 1000], [200, 200]), engine={"num_kv_blocks": 80})
    decisions = counterfactual_regret(env, FirstReplica(), seed=0, k=5)
    assert len(decisions) == 2  # two arrivals: two decisions, however large k
    log = env.cluster.log
    assert list(log.container) == [0, 0]
    second = decisions[1]
    assert second.chosen == 0 and second.best == 1
    wait = log.admit_s[1] - second.time_s
    assert wait == pytest.approx(log.finish_s[0] - second.time_s) and wait > 2.0
    assert second.regret == pytest.approx(wait, rel=1e-9)
    assert decisions[0].best == 1 and decisions[0].regret == pytest.approx(wait, rel=1e-9)  # 0 to 1, 1 to 0


def test_a_replica_that_cannot_hold_the_request_is_masked_and_never_the_best():
    # The A40 holds 53k tokens: the 60k-token prompt is rejected there; the mask keeps that replica from being
    # called the better choice whatever its return.
    env = two_replicas(fixed([0.0, 0.05], [60_000, 1000], [10, 50]), profiles=(PROFILE, "a40-llama2-7b"))
    first, second = counterfactual_regret(env, FirstReplica(), seed=0, k=2)
    # Routed to the replica that cannot hold it, the request is rejected and the env charges it as unserved
    # (truncation_penalty_s): dropping it is costlier than serving it, whatever its latency would have been.
    assert first.masked == (1,) and first.returns[1] < first.returns[0]
    assert first.best == 0 and first.regret == 0.0
    assert second.masked == () and second.best == 1 and second.regret > 0  # the small one fits: it waits less


def test_the_csv_has_one_row_per_decision_with_every_replicas_return(tmp_path):
    decisions = counterfactual_regret(two_replicas(fixed([0.0, 0.1, 0.2], [500] * 3, [20] * 3)),
                                      make_policy("router-round-robin"), seed=0, k=2)
    path = write_counterfactual(decisions, tmp_path / "counterfactual.csv", 2)
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["decision", "request", "time_s", "chosen", "return_0", "return_1", "best", "regret",
                             "return_before", "masked"]
    assert len(rows) == 2
    for row, d in zip(rows, decisions, strict=True):
        assert (int(row["decision"]), int(row["chosen"]), int(row["best"])) == (d.decision, d.chosen, d.best)
        assert (float(row["return_0"]), float(row["return_1"])) == d.returns  # repr: read back exactly
        assert float(row["regret"]) == d.regret and row["masked"] == ""


def test_only_a_routing_env_has_routing_decisions():
    with pytest.raises(ValueError, match="routing task's env"):
        counterfactual_regret(ServingEnv(workload=fixed([0.0], [10], [5])), make_policy("fcfs"), seed=0, k=1)
    with pytest.raises(ValueError, match="k must be"):
        counterfactual_regret(shared_prefix_env(), make_policy("router-least-loaded"), seed=0, k=0)


def test_run_writes_counterfactual_csv_beside_summary_json(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "--task", "cluster-routing", "--policy", "router-least-loaded", "--max-steps", "20",
                 "--counterfactual-k", "2", "--quiet", "--out", str(out)]) == 0
    assert "2 decisions:" in capsys.readouterr().out
    with (out / "counterfactual.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 and [f"return_{r}" for r in range(8)] == list(rows[0])[4:12]
    episode = json.loads((out / "summary.json").read_text())["episode_return"]
    assert all(float(row[f"return_{row['chosen']}"]) == episode for row in rows)
    assert all(float(row["regret"]) >= 0 for row in rows)
    run = json.loads((out / "run.json").read_text())
    assert (run["task"], run["split"], run["counterfactual_k"]) == ("cluster-routing", "test", 2)


@pytest.mark.parametrize("argv, message", [
    (["--task", "relaxed", "--counterfactual-k", "2"], "needs a routing task (--task cluster-routing), not task "
                                                       "relaxed"),
    (["--workload", "low", "--counterfactual-k", "2"], "not a run without --task"),
    (["--policy", "router-least-loaded", "--workload", "low"], "run it on a routing task"),
    (["--task", "cluster-routing", "--policy", "fcfs"], "decides routes; fcfs decides admissions"),
])
def test_run_refuses_a_decision_the_env_does_not_ask_for_before_any_episode(argv, message, tmp_path, capsys):
    assert main(["run", *argv, "--quiet", "--out", str(tmp_path / "run")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run" / "summary.json").exists()
