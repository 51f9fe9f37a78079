"""A trained residual agent against its base, the tuned scorer, seed by seed: where the return gap comes from.

Usage: python benchmarks/agent_vs_scorer.py --run docs/rl/10m/Serving-v2__ppo__score-residual__memory-tight__s0
    [--board docs/bench/10m/leaderboard.csv] [--tuned docs/tuning] [--max-seeds N] [--states]

Both play every test seed of the run's task as the board plays them, each return checked against the board's
CSV to the bit. The latency reward sums to minus the request-seconds in the system, so the agent's gain over the
scorer (its return minus the scorer's) splits exactly into less waiting (arrival to first admission) and less
service (first admission to finish, preemptions and recomputation included), shown per prompt-length quartile
(the quartiles of all the seeds' prompts). Every figure is the mean over the seeds of the per-seed difference,
agent minus scorer for counts and scorer minus agent for request-seconds (positive: the agent saves them), with a
95% Student-t CI over the seeds.

With ``--states``, where the agent departs from its base: the agent's episodes are replayed and at each decision
step (an admission could succeed) the scorer acts on the agent's state, its admissions found on a copy of the env
(``oracle_vs_agents.replay_decisions``); the shares of steps where the agent admits what the scorer would, more,
fewer or other requests, by the deciding container's KV use and queue length before the step. Pooled over the
seeds' decision steps: descriptive, not a test.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np
from oracle_vs_agents import (
    OUTCOMES,
    SCORER,
    ActionRecorder,
    Decision,
    board_returns,
    bucket_sums,
    decision_shares,
    recomputed_tokens,
    replay_decisions,
    request_times,
)

from servegym.benchmark.bench import BenchJob, make_entries, play
from servegym.engine.log import EpisodeLog
from servegym.evaluation.stats import mean_ci
from servegym.policies import make_policy
from servegym.runner import EpisodeResult, make_env, run_episode
from servegym.validation import count_arg

KV_EDGES = (0.5, 0.75, 0.9)
"""``--states``: buckets of the KV blocks' share in use (``<= 0.5``, ..., ``> 0.9``)."""
QUEUE_EDGES = (1, 4, 16)
"""``--states``: buckets of the requests waiting (1, 2-4, 5-16, more)."""
AGENT_VIEW = {"same": "as the scorer", "fewer": "agent admits more", "more": "agent admits fewer", "other": "other"}
"""``compare_admissions``' outcomes of the scorer beside the agent, said of the agent."""


def episode_measures(log: EpisodeLog, edges: list[float]) -> np.ndarray:
    """Request-seconds per prompt quartile, then waiting and service in all, preemptions and recomputed tokens."""
    _, wait, service = request_times(log)
    by_prompt = bucket_sums(wait + service, log.num_prompt_tokens, edges)
    return np.concatenate([by_prompt, [wait.sum(), service.sum(), log.num_preemptions.sum(),
                                       recomputed_tokens(log)]])


def play_recorded(job: BenchJob) -> tuple[EpisodeResult, list[np.ndarray]]:
    """``bench.play`` of a test-track policy entry, keeping the actions it stepped the env with."""
    policy = make_policy(job.entry.policy, **job.entry.params)
    env = ActionRecorder(make_env(policy, task=job.task, split="test", apply_overrides=False))
    try:
        return run_episode(env, policy, seed=job.seed), env.actions
    finally:
        env.close()


def state_lines(decisions: list[Decision]) -> list[str]:
    """The ``--states`` tables: by KV use, then by queue length."""
    lines = []
    for title, values, edges, names in (
            ("KV blocks in use", [d.kv_used for d in decisions], KV_EDGES,
             [f"≤ {KV_EDGES[0]:.0%}", *(f"{a:.0%}-{b:.0%}" for a, b in itertools.pairwise(KV_EDGES)),
              f"> {KV_EDGES[-1]:.0%}"]),
            ("requests waiting", [d.waiting for d in decisions], QUEUE_EDGES,
             ["1", *(f"{a + 1}-{b}" for a, b in itertools.pairwise(QUEUE_EDGES)), f"> {QUEUE_EDGES[-1]}"])):
        lines += [f"\n| {title} | decision steps | " + " | ".join(AGENT_VIEW.values()) + " |",
                  "|---|---:|" + "---:|" * len(AGENT_VIEW)]
        for name, (steps, shares) in zip(names, decision_shares(decisions, SCORER, values, edges), strict=True):
            by_outcome = dict(zip(OUTCOMES, shares, strict=True))
            cells = (f"{by_outcome[o]:.1%}" if steps else "-" for o in AGENT_VIEW)
            lines.append(f"| {name} | {steps:,} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="the agent's run folder (a score-residual run)")
    parser.add_argument("--board", type=Path, default=Path("docs/bench/10m/leaderboard.csv"))
    parser.add_argument("--tuned", type=Path, default=Path("docs/tuning"), help="where the tuned scorer is")
    parser.add_argument("--max-seeds", type=count_arg("seeds"), default=None, help="the first N test seeds only")
    parser.add_argument("--states", action="store_true", help="also where the agent departs from the scorer")
    args = parser.parse_args()
    task = json.loads((args.run / "config.json").read_text())["task"]
    entries = [e for e in make_entries([], rl_runs=[args.run], tuned_dir=args.tuned, tasks=[task])
               if e.label == SCORER or e.policy.startswith("rl:")]
    agent = next(e.label for e in entries if e.policy.startswith("rl:"))
    scorer = next(e for e in entries if e.label == SCORER)
    returns = board_returns(args.board, task, [SCORER, agent])
    seeds = sorted(returns[SCORER])[: args.max_seeds]
    logs: dict[str, list[EpisodeLog]] = {SCORER: [], agent: []}
    decisions: list[Decision] = []
    for seed in seeds:
        start = time.perf_counter()
        for entry in entries:
            job = BenchJob(task, entry, seed)
            result, actions = play_recorded(job) if args.states and entry.label == agent else (play(job), None)
            if result.total_reward != returns[entry.label][seed]:
                raise RuntimeError(f"{entry.label} on seed {seed}: {result.total_reward!r} here, "
                                   f"{returns[entry.label][seed]!r} on the board (another code version?)")
            logs[entry.label].append(result.log)
            if actions is not None:
                decisions += replay_decisions(task, seed, actions, {SCORER: make_policy(scorer.policy,
                                                                                         **scorer.params)},
                                              result.total_reward)
        print(f"seed {seed}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    prompts = np.concatenate([log.num_prompt_tokens for log in logs[SCORER]])
    edges = [float(q) for q in np.quantile(prompts, [0.25, 0.5, 0.75])]
    ours = np.array([episode_measures(log, edges) for log in logs[agent]])
    base = np.array([episode_measures(log, edges) for log in logs[SCORER]])
    wait, service = len(edges) + 1, len(edges) + 2  # columns of episode_measures; counts follow them
    saved = np.concatenate([base[:, :service + 1] - ours[:, :service + 1], ours[:, service + 1:] -
                            base[:, service + 1:]], axis=1)
    gain = np.array([returns[agent][s] - returns[SCORER][s] for s in seeds])
    if not np.allclose(gain, saved[:, wait] + saved[:, service], rtol=1e-9, atol=1e-6):  # the reward is minus these
        raise RuntimeError("the return gaps are not the request-seconds saved: is the task's reward `latency`?")
    names = [f"prompt ≤ {edges[0]:,.0f}", *(f"prompt {a:,.0f}-{b:,.0f}" for a, b in itertools.pairwise(edges)),
             f"prompt > {edges[-1]:,.0f}", "all: waiting", "all: service", "preemptions (agent − scorer)",
             "recomputed tokens (agent − scorer)"]
    print(f"## {agent} against {SCORER} on {task}\n\nTest seeds {seeds[0]}-{seeds[-1]} ({len(seeds)}); returns "
          f"checked against `{args.board}`. Mean per seed, 95% CI over the seeds.\n")
    print("| measure | mean | 95% CI |\n|---|---:|---:|")
    labels = [f"request-seconds saved, {n}" if i <= service else n for i, n in enumerate(names)]
    for name, column in [("return gain (agent − scorer)", gain), *zip(labels, saved.T, strict=True)]:
        mean, half = mean_ci(column)
        print(f"| {name} | {mean:,.1f} | [{mean - half:,.1f}, {mean + half:,.1f}] |")
    print(f"\nScorer per seed: {base[:, service + 1].mean():.1f} preemptions, {base[:, service + 2].mean():,.0f} "
          f"recomputed tokens, {base[:, wait].mean():,.0f} request-seconds waiting and {base[:, service].mean():,.0f} "
          "in service.")
    if args.states:
        print(f"\nWhere the agent departs from the scorer: its {len(decisions):,} decision steps, the scorer acting on "
              "the agent's state, pooled over the seeds.")
        print("\n".join(state_lines(decisions)))


if __name__ == "__main__":
    main()
