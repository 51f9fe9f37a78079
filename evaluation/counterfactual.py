"""Counterfactual regret of routing decisions: what each replica would have returned (BLIS's
``--counterfactual-k``).

A routing task (:class:`~servegym.envs.routing.RoutingEnv`) stops at each arrival and the policy names the
replica. For each of the first ``k`` of those decisions, :func:`counterfactual_regret` copies the env and the
policy at the decision (the policy has already chosen, so its own state, a random stream or a smoothed signal,
is the one it acts on next), routes the arrival to each replica in turn on a copy, and lets the policy finish
the episode there. Each replica's *return* is the whole episode's return along that branch: the rewards paid up
to the decision, then the branch's, summed term by term in the order the env pays them
(``info["iteration_rewards"]``, as :func:`~servegym.runner.run_episode` sums them). Episodes are deterministic
given the seed and the actions, so the chosen replica's branch is the actual episode and its return equals the
episode's to the last bit (the function checks that and raises when it does not). The *regret* of a decision
is the best replica's return minus the chosen one's: zero when the policy chose a best replica, positive by as
much as the best alternative would have gained, with the policy itself playing every later decision.

The best is taken over the replicas the env's action mask allows (:meth:`RoutingEnv.action_masks`: those whose
KV cache can hold the request), and the chosen one. A masked replica's return is still recorded, but it is no
alternative a router may take: routed there the request is rejected (the env charges it as an unserved request).

Cost: one episode, plus ``k x replicas`` episode tails.
"""

from __future__ import annotations

import copy
import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np

from servegym.benchmark.oracle import add_rewards, play_to_end
from servegym.envs.routing import RoutingEnv
from servegym.policies import Policy
from servegym.validation import positive_int

COLUMNS = ("decision", "request", "time_s", "chosen", "returns", "best", "regret", "return_before", "masked")
"""The fields of a :class:`Decision`; ``returns`` is written as one ``return_<replica>`` column per replica."""


@dataclass(frozen=True)
class Decision:
    """One routing decision and its counterfactuals."""

    decision: int
    """Its index among the episode's routing decisions (0: the first arrival)."""
    request: int
    """The id of the routed request (its row in ``requests.csv``)."""
    time_s: float
    """The cluster clock at the decision."""
    chosen: int
    """The replica the policy chose."""
    returns: tuple[float, ...]
    """Per replica: the episode's return had this arrival gone there (the policy playing on afterwards)."""
    best: int
    """The replica of the highest return among the chosen one and those not :attr:`masked` (the chosen one when
    it ties the best; else the lowest index)."""
    regret: float
    """``returns[best] - returns[chosen]``: >= 0, and 0 when the policy chose a best replica."""
    return_before: float
    """The rewards paid before this decision (the same for every replica): ``returns[r] - return_before`` is
    the return from the decision on."""
    masked: tuple[int, ...] = ()
    """The replicas the action mask rules out (they cannot hold the request): never :attr:`best`."""


def _routing_env(env: gym.Env) -> RoutingEnv:
    inner = env.unwrapped
    if not isinstance(inner, RoutingEnv):
        raise ValueError(f"counterfactual regret needs a routing task's env (RoutingEnv: each step routes an "
                         f"arrival), got {type(inner).__name__}")
    return inner


def counterfactual_regret(env: gym.Env, policy: Policy, seed: int, k: int) -> list[Decision]:
    """Play ``env`` (a routing env, possibly wrapped) with ``policy`` from ``reset(seed=seed)`` to the end; at
    each of the first ``k`` routing decisions (fewer when the episode has fewer arrivals), roll out every replica
    on copies of the env and the policy. Each decision's chosen return is the actual episode's return (the float
    :func:`~servegym.runner.run_episode` returns for the same seed). ``env`` is left at the episode's end and
    ``policy`` as after it.
    """
    positive_int("k", k)
    routing = _routing_env(env)
    cluster = routing.cluster
    obs, _ = env.reset(seed=seed)
    policy.reset()
    decisions: list[Decision] = []
    total, done = 0.0, False
    while not done:
        action = np.array(policy.act(obs), copy=True)
        if len(decisions) < k and cluster.awaiting_route:
            decisions.append(_decision(env, obs, policy, action, total, len(decisions)))
        obs, reward, terminated, truncated, info = env.step(action)
        total = add_rewards(total, reward, info)
        done = terminated or truncated
    for d in decisions:
        if d.returns[d.chosen] != total:
            raise RuntimeError(f"the env is not deterministic under copy: decision {d.decision}'s chosen replica "
                               f"{d.chosen} returned {d.returns[d.chosen]!r} on a copy, the episode {total!r}")
    return decisions


def _decision(env: gym.Env, obs: dict, policy: Policy, action: np.ndarray, total: float, index: int) -> Decision:
    """Every replica's return at the decision ``env`` waits for, where ``policy`` (already moved by its act)
    chose ``action``."""
    routing = _routing_env(env)
    cluster = routing.cluster
    request, time_s = int(cluster.routing_request), float(cluster.time)
    chosen = int(action)
    allowed = routing.action_masks()
    allowed[chosen] = True
    returns = []
    for replica in range(routing.num_replicas):
        branch, player = copy.deepcopy((env, policy))  # one copy: what they share stays shared
        obs_after, reward, terminated, truncated, info = branch.step(np.int64(replica))
        end = add_rewards(total, reward, info)
        if not (terminated or truncated):
            _, end = play_to_end(branch, obs_after, player, end)
        returns.append(end)
    top = max(r for r, ok in zip(returns, allowed, strict=True) if ok)
    best = chosen if returns[chosen] == top else next(i for i, r in enumerate(returns) if allowed[i] and r == top)
    masked = tuple(int(i) for i in np.flatnonzero(~allowed))
    return Decision(index, request, time_s, chosen, tuple(returns), best, top - returns[chosen], total, masked)


def write_counterfactual(decisions: Sequence[Decision], path: str | Path, num_replicas: int) -> Path:
    """Write ``counterfactual.csv``: one row per decision, ``decision, request, time_s, chosen, return_0 ...
    return_<N-1>, best, regret, return_before, masked`` (floats written as ``repr`` would, so they read back
    exactly; ``masked``: the masked replicas, space-separated)."""
    path = Path(path)
    header = ["decision", "request", "time_s", "chosen", *(f"return_{r}" for r in range(num_replicas)), "best",
              "regret", "return_before", "masked"]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for d in decisions:
            writer.writerow([d.decision, d.request, repr(d.time_s), d.chosen, *map(repr, d.returns), d.best,
                             repr(d.regret), repr(d.return_before), " ".join(map(str, d.masked))])
    return path
