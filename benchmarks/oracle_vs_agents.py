"""The oracle against trained agents, seed by seed: who wins, by how much, and what the oracle does differently.

Usage: python benchmarks/oracle_vs_agents.py --task memory-tight
    [--board docs/bench/10x/leaderboard.csv] [--runs RUN ...] [--tuned docs/tuning] [--max-seeds N]

Returns come from the board's CSV (``servegym bench`` with ``oracle`` among its policies): every agent (default:
``docs/rl/10x/*__<task>__s*``), the tuned scorer (the agents' residual base) and the oracle on the task's test
seeds, paired per seed (mean and 95% Student-t CI of the differences). On the seeds where the oracle beats every
agent, and only there (the rest costs nothing), the oracle is planned again with ``plan_episode`` exactly as the
board plays it, for its sweep winner and ``switches``, and the scorer and the agents are played again as the board
plays them; every return is checked against the board to the bit. On those seeds the report compares the episodes:

* *preemptions* and *recomputed tokens*: prefill tokens beyond each admitted request's first prefill;
* *time in system*: the latency reward sums to minus the request-seconds in the system, so a return gap is the
  sum, over requests, of the extra wait (arrival to first admission) and service (first admission to finish),
  shown per prompt-length quartile;
* *order agreement*: over the request pairs whose later arrival came while the earlier one still waited, in both
  episodes, the share that the two admitted in the same order (earlier first, later first, or together);
* *same admissions on the oracle's states*: the oracle's episode is replayed; at each of its decision steps (an
  admission could succeed) the policy acts on the oracle's observation, and the step is counted when the
  requests its action admits, on a copy of the env, are the ones the oracle's admitted.

The decision measures cover only the seeds where the oracle won, a selection: they say what it did there.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from servegym.benchmark.bench import BenchJob, Entry, make_entries, make_jobs, oracle_bases, play, read_leaderboard
from servegym.benchmark.oracle import ORACLE, Budget, OracleEpisode, add_rewards, plan_episode
from servegym.engine.log import EpisodeLog, State
from servegym.evaluation.stats import paired_difference
from servegym.metrics import makespan
from servegym.policies import Policy, make_policy
from servegym.runner import EpisodeResult, env_profile, make_env, serving_env
from servegym.validation import count_arg

SCORER = "scorer (tuned)"
WAITING = (State.WAITING, State.PREEMPTED)


# ----------------------------------------------------------------------------- pure measures
@dataclass(frozen=True)
class SeedRow:
    """One seed's returns: the oracle's, the scorer's, and the best agent's (by return, on that seed)."""

    seed: int
    oracle: float
    scorer: float
    agents: dict[str, float]
    best_agent: str

    @property
    def agents_above_oracle(self) -> list[str]:
        return [label for label, value in self.agents.items() if value > self.oracle]


def seed_rows(returns: Mapping[str, Mapping[int, float]], agents: Sequence[str]) -> list[SeedRow]:
    """Per seed of the oracle's, its returns and every agent's; the best agent is the first of the highest."""
    rows = []
    for seed in sorted(returns[ORACLE]):
        values = {label: returns[label][seed] for label in agents}
        best = max(values, key=lambda label: values[label])
        rows.append(SeedRow(seed, returns[ORACLE][seed], returns[SCORER][seed], values, best))
    return rows


def win_tie_loss(a: Mapping[int, float], b: Mapping[int, float]) -> tuple[int, int, int]:
    """Seeds where ``a`` is above ``b``, equal to the bit, and below."""
    diffs = [a[s] - b[s] for s in a]
    return sum(d > 0 for d in diffs), sum(d == 0 for d in diffs), sum(d < 0 for d in diffs)


def parse_switches(switches: Sequence[str]) -> list[tuple[str, int]]:
    """``OracleEpisode.switches`` (``<base>@<step>``) as (base, step) pairs, in order."""
    pairs = []
    for text in switches:
        label, _, step = text.rpartition("@")
        pairs.append((label, int(step)))
    return pairs


def followed_steps(switches: Sequence[str], horizon: int) -> dict[str, int]:
    """Steps of the oracle's ``horizon``-step episode on which each base's actions were followed: from a switch to
    the next one (of several at one step, the last holds)."""
    pairs = parse_switches(switches)
    counts: dict[str, int] = {}
    for (label, start), (_, end) in zip(pairs, [*pairs[1:], ("", horizon)], strict=True):
        counts[label] = counts.get(label, 0) + end - start
    return counts


def newly_admitted(before: np.ndarray, after: np.ndarray) -> frozenset[int]:
    """Requests waiting (or preempted) in ``before``'s states and not in ``after``'s: admitted by the step between.
    (One admitted and preempted within the same iteration is missed.)"""
    waiting_before = np.isin(before, WAITING)
    return frozenset(np.flatnonzero(waiting_before & ~np.isin(after, WAITING)).tolist())


def order_agreement(arrival: np.ndarray, admit_a: np.ndarray, admit_b: np.ndarray) -> tuple[int, float]:
    """Over pairs ``i < j`` (by arrival) whose ``j`` arrived before ``i``'s admission in both episodes: how many,
    and the share admitted in the same order in both (``i`` first, ``j`` first, or at the same time)."""
    order = np.argsort(arrival, kind="stable")
    arrival, admit_a, admit_b = arrival[order], admit_a[order], admit_b[order]
    later = np.triu(np.ones((arrival.size, arrival.size), dtype=bool), k=1)
    contested = later & (arrival[None, :] < admit_a[:, None]) & (arrival[None, :] < admit_b[:, None])
    same = np.sign(admit_a[None, :] - admit_a[:, None]) == np.sign(admit_b[None, :] - admit_b[:, None])
    pairs = int(contested.sum())
    return pairs, float((same & contested).sum() / pairs) if pairs else float("nan")


def request_times(log: EpisodeLog) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per request: first admission (the episode's end if never), wait (arrival to it) and service (it to the
    finish, or the end); both zero for a request that never arrived or was rejected. Their sum over requests is
    the request-seconds the latency reward charges."""
    end = log.arrival_s[0] + makespan(log) if log.num_requests else 0.0
    admit = np.where(np.isnan(log.admit_s), end, log.admit_s)
    finish = np.where(log.state == State.FINISHED, log.finish_s, end)
    counted = (log.state != State.PENDING) & (log.state != State.REJECTED)
    return admit, np.where(counted, admit - log.arrival_s, 0.0), np.where(counted, finish - admit, 0.0)


def recomputed_tokens(log: EpisodeLog) -> int:
    """Prefill tokens run beyond each admitted request's first prefill (its prompt less what it found cached)."""
    admitted = ~np.isnan(log.admit_s)
    first = log.num_prompt_tokens - log.cached_gpu_tokens - log.cached_host_tokens
    prefilled = log.steps()[:, 4].sum() if log.num_requests else 0.0  # num_prefill_tokens
    return int(prefilled - first[admitted].sum())


def bucket_sums(values: np.ndarray, prompt: np.ndarray, edges: Sequence[float]) -> np.ndarray:
    """``values`` summed per prompt-length bucket: ``<= edges[0]``, ``(edges[0], edges[1]]``, ..., ``> edges[-1]``."""
    return np.bincount(np.searchsorted(edges, prompt, side="left"), weights=values, minlength=len(edges) + 1)


# ----------------------------------------------------------------------------- episodes
class ActionRecorder(gym.Wrapper):
    """Keeps the actions this env is stepped with. The oracle's sweeps and tails step deep copies, so the original
    holds the actions of the plan it followed."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.actions: list[np.ndarray] = []

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self.actions = []
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self.actions.append(np.array(action, copy=True))
        return self.env.step(action)


def plan_oracle(job: BenchJob) -> tuple[OracleEpisode, list[np.ndarray]]:
    """The board's oracle episode (``bench.play_oracle``, same env, bases and budget) and the actions it took."""
    env = ActionRecorder(make_env(task=job.task, split="test", apply_overrides=False))
    try:
        return plan_episode(env, oracle_bases(job, env), job.seed, Budget(**job.entry.params)), env.actions
    finally:
        env.close()


def compare_admissions(policy: frozenset[int], oracle: frozenset[int]) -> str:
    """What a policy's admissions are beside the oracle's on one state: ``same``, ``more`` or ``fewer`` requests,
    or ``other`` (as many, not the same)."""
    if policy == oracle:
        return "same"
    return "more" if len(policy) > len(oracle) else "fewer" if len(policy) < len(oracle) else "other"


@dataclass(frozen=True)
class Decision:
    """A decision step of a replayed episode (an admission could succeed): the deciding container's state before
    it, and each policy's admissions there beside the replayed action's (:func:`compare_admissions`)."""

    kv_used: float
    """The share of the container's KV blocks in use."""
    waiting: int
    """Requests waiting at the container."""
    outcomes: dict[str, str]


def replay_decisions(task: str, seed: int, actions: Sequence[np.ndarray], policies: Mapping[str, Policy],
                     expected_return: float) -> list[Decision]:
    """Replay ``actions`` (an episode's, from ``reset(seed)``); at each decision step each policy acts on the
    replayed episode's observation and its admissions (on a copy of the env) are compared with the replayed
    action's. The replay's return must be ``expected_return``, to the bit."""
    env = make_env(task=task, split="test", apply_overrides=False)
    for policy in policies.values():
        policy.bind_profile(env_profile(env))
        policy.reset()
    obs, _ = env.reset(seed=seed)
    decisions, total = [], 0.0
    for action in actions:
        inner = serving_env(env)
        engine = inner.cluster.engine
        deciding = engine.can_admit()
        state = (engine.num_used_blocks / engine.num_kv_blocks, int(engine.waiting.size))
        before = inner.cluster.log.state.copy()
        tried = {label: np.asarray(policy.act(obs)) for label, policy in policies.items()} if deciding else {}
        alternatives = {label: _admitted_by(env, a, before) for label, a in tried.items()
                        if not np.array_equal(a, action)}
        obs, reward, _, _, info = env.step(action)
        total = add_rewards(total, reward, info)
        if deciding:
            chosen = newly_admitted(before, serving_env(env).cluster.log.state)
            decisions.append(Decision(*state, {label: compare_admissions(alternatives.get(label, chosen), chosen)
                                               for label in policies}))
    env.close()
    if total != expected_return:
        raise RuntimeError(f"the replay on seed {seed} returned {total!r}, the episode {expected_return!r}")
    return decisions


def same_admissions(task: str, seed: int, actions: Sequence[np.ndarray], policies: Mapping[str, Policy],
                    expected_return: float) -> tuple[int, dict[str, Counter[str]]]:
    """Replay the oracle's ``actions`` (:func:`replay_decisions`). Returns its decision steps and, per policy, the
    count of each outcome."""
    decisions = replay_decisions(task, seed, actions, policies, expected_return)
    return len(decisions), {label: Counter(d.outcomes[label] for d in decisions) for label in policies}


OUTCOMES = ("same", "more", "fewer", "other")
""":func:`compare_admissions`' outcomes, in the order tables show them."""


def decision_shares(decisions: Sequence[Decision], label: str, values: Sequence[float], edges: Sequence[float]
                    ) -> list[tuple[int, list[float]]]:
    """Per bucket of ``values`` (one per decision; buckets as :func:`bucket_sums`'): its decision steps and the
    share of each of :data:`OUTCOMES` for policy ``label`` (NaN in an empty bucket)."""
    buckets = np.searchsorted(edges, values, side="left")
    rows = []
    for b in range(len(edges) + 1):
        found = [d.outcomes[label] for d, k in zip(decisions, buckets, strict=True) if k == b]
        rows.append((len(found), [found.count(o) / len(found) if found else float("nan") for o in OUTCOMES]))
    return rows


def _admitted_by(env: gym.Env, action: np.ndarray, before: np.ndarray) -> frozenset[int]:
    trial = copy.deepcopy(env)
    trial.step(action)
    return newly_admitted(before, serving_env(trial).cluster.log.state)


@dataclass
class Episodes:
    """One seed's episodes, by label (the oracle, the scorer, the agents)."""

    seed: int
    oracle: OracleEpisode
    results: dict[str, EpisodeResult]
    decisions: int
    """The oracle's decision steps (an admission could succeed)."""
    outcomes: dict[str, Counter[str]]
    """Per policy, :func:`compare_admissions`' outcomes on those steps."""


def play_seed(task: str, seed: int, oracle_job: BenchJob, entries: Sequence[Entry],
              board: Mapping[str, Mapping[int, float]]) -> Episodes:
    """The oracle, the scorer and the agents on one seed, each checked against the board's return to the bit."""
    planned, actions = plan_oracle(oracle_job)
    results = {ORACLE: planned.result} | {e.label: play(BenchJob(task, e, seed)) for e in entries}
    for label, result in results.items():
        if result.total_reward != board[label][seed]:
            raise RuntimeError(f"{label} on seed {seed}: {result.total_reward!r} here, {board[label][seed]!r} on "
                               "the board (another env or code version?)")
    policies = {e.label: make_policy(e.policy, **e.params) for e in entries}
    decisions, outcomes = same_admissions(task, seed, actions, policies, planned.result.total_reward)
    return Episodes(seed, planned, results, decisions, outcomes)


# ----------------------------------------------------------------------------- report
def short(label: str) -> str:
    """``rl:...__memory-tight__s3`` -> ``agent s3``; other labels as they are."""
    return f"agent {label.rpartition('__')[2]}" if label.startswith("rl:") else label


def fmt(value: float, digits: int = 1) -> str:
    return f"{value:+,.{digits}f}"


def paired_lines(returns: Mapping[str, Mapping[int, float]], rows: Sequence[SeedRow], agents: Sequence[str]
                 ) -> list[str]:
    """The oracle minus each agent, the scorer and each seed's best agent: paired mean, CI, seeds above/equal/below."""
    lines = ["| oracle minus | mean | 95% CI | seeds oracle above / equal / below |", "|---|---:|---|---:|"]
    best = {row.seed: row.agents[row.best_agent] for row in rows}
    for label, other in [*((a, returns[a]) for a in agents), (SCORER, returns[SCORER]),
                         ("best agent of each seed (chosen after the fact)", best)]:
        diff = paired_difference(dict(returns[ORACLE]), dict(other))
        w, t, lo = win_tie_loss(returns[ORACLE], other)
        lines.append(f"| {short(label)} | {fmt(diff.mean)} | [{fmt(diff.low)}, {fmt(diff.high)}] | {w} / {t} / {lo} |")
    return lines


def seed_lines(rows: Sequence[SeedRow], agents: Sequence[str]) -> list[str]:
    """One row per seed: every return, an agent above the oracle starred, and the oracle's two margins."""
    head = ["seed", "oracle", "scorer", *(short(a) for a in agents), "oracle − best agent", "oracle − scorer"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for row in rows:
        cells = [str(row.seed), f"{row.oracle:,.1f}", f"{row.scorer:,.1f}",
                 *(f"{row.agents[a]:,.1f}" + ("*" if row.agents[a] > row.oracle else "") for a in agents),
                 fmt(row.oracle - row.agents[row.best_agent]), fmt(row.oracle - row.scorer)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def plan_lines(played: Sequence[Episodes]) -> list[str]:
    """Per re-run seed, the oracle's sweep winner, its switches and the share of steps each base was followed."""
    lines = ["| seed | sweep winner | its lead over the runner-up | switches (base@step) | steps followed | tails |",
             "|---:|---|---:|---|---|---:|"]
    for ep in played:
        sweep = sorted(ep.oracle.sweep.items(), key=lambda kv: -kv[1])
        lead = sweep[0][1] - sweep[1][1] if len(sweep) > 1 else float("nan")
        steps = followed_steps(ep.oracle.switches, ep.oracle.result.steps)
        shares = ", ".join(f"{label} {n / ep.oracle.result.steps:.0%}" for label, n in steps.items())
        lines.append(f"| {ep.seed} | {sweep[0][0]} | {lead:,.1f} | {', '.join(ep.oracle.switches)} | {shares} | "
                     f"{ep.oracle.tails} |")
    return lines


def behaviour_lines(played: Sequence[Episodes], labels: Sequence[str]) -> list[str]:
    """Per policy, seed means of what its own episodes did, and how it acts on the oracle's states."""
    lines = ["| policy | return | preemptions | recomputed tokens | mean wait (s) | mean service (s) | "
             "admission order as the oracle's (contested pairs) | on the oracle's decision steps: same / more / "
             "fewer / other admissions |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    oracle_admit = {ep.seed: request_times(ep.results[ORACLE].log)[0] for ep in played}
    for label in labels:
        ret, pre, rec, wait, serv, pairs, agree = [], [], [], [], [], [], []
        for ep in played:
            log = ep.results[label].log
            admit, waits, service = request_times(log)
            counted = (log.state != State.PENDING) & (log.state != State.REJECTED)
            ret.append(ep.results[label].total_reward)
            pre.append(log.num_preemptions.sum())
            rec.append(recomputed_tokens(log))
            wait.append(waits[counted].mean())
            serv.append(service[counted].mean())
            n, same = order_agreement(log.arrival_s, admit, oracle_admit[ep.seed])
            pairs.append(n)
            agree.append(same)
        steps = sum(ep.decisions for ep in played)
        counts = sum((ep.outcomes.get(label, Counter(same=ep.decisions)) for ep in played), Counter[str]())
        shares = " / ".join(f"{counts[k] / steps:.0%}" for k in ("same", "more", "fewer", "other"))
        lines.append(f"| {short(label)} | {np.mean(ret):,.1f} | {np.mean(pre):.1f} | {np.mean(rec):,.0f} | "
                     f"{np.mean(wait):.3f} | {np.mean(serv):.3f} | {np.mean(agree):.1%} ({np.mean(pairs):,.0f}) | "
                     f"{shares} |")
    return lines


def bucket_lines(played: Sequence[Episodes], labels: Sequence[str]) -> list[str]:
    """Per policy, its request-seconds minus the oracle's (seed mean) by prompt-length quartile, and in all split
    into wait and service; their sum is the oracle's return minus the policy's."""
    prompts = np.concatenate([ep.results[ORACLE].log.num_prompt_tokens for ep in played])
    edges = [float(q) for q in np.quantile(prompts, [0.25, 0.5, 0.75])]
    names = [f"≤ {edges[0]:,.0f}", *(f"{a:,.0f}-{b:,.0f}" for a, b in itertools.pairwise(edges)),
             f"> {edges[-1]:,.0f}"]
    head = ["policy", *(f"prompt {n}" for n in names), "all: wait", "all: service", "oracle's return − policy's"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for label in labels:
        gaps = []
        for ep in played:
            ours, oracle = ep.results[label].log, ep.results[ORACLE].log
            parts = [bucket_sums(request_times(log)[part], log.num_prompt_tokens, edges)
                     for log in (ours, oracle) for part in (1, 2)]
            gaps.append(np.concatenate([parts[0] + parts[1] - parts[2] - parts[3],
                                        [parts[0].sum() - parts[2].sum(), parts[1].sum() - parts[3].sum()]]))
        mean = np.mean(gaps, axis=0)
        ret = np.mean([ep.results[ORACLE].total_reward - ep.results[label].total_reward for ep in played])
        lines.append(f"| {short(label)} | " + " | ".join(fmt(v) for v in mean) + f" | {fmt(ret)} |")
    return lines


def report(task: str, board: Path, returns: Mapping[str, Mapping[int, float]], agents: Sequence[str],
           played: Sequence[Episodes]) -> str:
    rows = seed_rows(returns, agents)
    labels = [SCORER, *agents]
    out = [f"## {task}", "", f"Test seeds {rows[0].seed}-{rows[-1].seed} ({len(rows)}); returns from `{board}`.", "",
           "### Oracle minus each policy, paired per seed", "", *paired_lines(returns, rows, agents), "",
           "### Per seed (* marks an agent above the oracle)", "", *seed_lines(rows, agents), ""]
    if not played:
        return "\n".join([*out, "The oracle beats every agent on no seed: nothing was re-run.", ""])
    seeds = ", ".join(str(ep.seed) for ep in played)
    out += [f"### The oracle's plans on the seeds where it beats every agent ({len(played)}: {seeds})", "",
            *plan_lines(played), "",
            f"### What the episodes did, mean over those {len(played)} seeds", "",
            *behaviour_lines(played, [ORACLE, *labels]), "",
            "### Request-seconds beyond the oracle's, by prompt tokens (mean over those seeds)", "",
            *bucket_lines(played, labels), ""]
    return "\n".join(out)


def board_returns(path: Path, task: str, labels: Sequence[str]) -> dict[str, dict[int, float]]:
    """Test-track returns of ``labels`` on ``task`` from a leaderboard CSV, by label and seed."""
    returns: dict[str, dict[int, float]] = {label: {} for label in labels}
    for row in read_leaderboard(path):
        if row.task == task and row.policy in returns:
            returns[row.policy][row.seed] = row.episode_return
    missing = [label for label, seeds in returns.items() if not seeds]
    if missing:
        raise ValueError(f"{path} has no {task} rows for {missing} (rebuild the board with `oracle` in --policies)")
    return returns


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--task", required=True, choices=["memory-tight", "long-context"])
    parser.add_argument("--board", type=Path, default=Path("docs/bench/10x/leaderboard.csv"))
    parser.add_argument("--runs", nargs="+", type=Path, default=None,
                        help="the agents' run folders (default: docs/rl/10x/*__<task>__s*)")
    parser.add_argument("--tuned", type=Path, default=Path("docs/tuning"), help="where the tuned scorer is")
    parser.add_argument("--max-seeds", type=count_arg("seeds"), default=None,
                        help="re-run at most this many of the seeds the oracle wins (a quick look)")
    args = parser.parse_args(argv)
    runs = args.runs or sorted(Path("docs/rl/10x").glob(f"*__{args.task}__s*"))
    entries = make_entries([ORACLE], rl_runs=runs, tuned_dir=args.tuned, tasks=[args.task])
    agents = [e.label for e in entries if e.policy.startswith("rl:")]
    players = [e for e in entries if e.label in (SCORER, *agents)]
    returns = board_returns(args.board, args.task, [ORACLE, SCORER, *agents])
    oracle_jobs = {j.seed: j for j in make_jobs([args.task], entries) if j.entry.policy == ORACLE}
    wins = [row.seed for row in seed_rows(returns, agents) if row.oracle > row.agents[row.best_agent]]
    played = []
    for seed in wins[: args.max_seeds]:
        start = time.perf_counter()
        played.append(play_seed(args.task, seed, oracle_jobs[seed], players, returns))
        print(f"{args.task} seed {seed}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    print(report(args.task, args.board, returns, agents, played))


if __name__ == "__main__":
    main()
