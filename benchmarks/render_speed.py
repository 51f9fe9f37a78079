"""What seeing an episode costs: the same seeded episode without rendering, with an ``rgb_array`` frame every step,
and its trace export and timeline figure, in one run.

Usage: python benchmarks/render_speed.py [--workload burst] [--policy fcfs] [--repeats 3]

Prints the episode's steps and wall time without frames, with a frame drawn after every step (the cost
``RecordVideo`` adds before encoding), and the time to build the Trace Event Format events and to draw
``timeline.png`` from the finished episode; each as a ratio to the bare episode. Each figure is the best of
``--repeats`` runs, bare and rendered runs alternating so that both see the same machine.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import gymnasium as gym

from servegym.evaluation.timeline import plot_timeline
from servegym.evaluation.trace import trace_events
from servegym.policies import make_policy
from servegym.runner import make_env


def episode(workload: str, policy_name: str, render: bool) -> tuple[int, float, gym.Env]:
    policy = make_policy(policy_name)
    env = make_env(policy, max_episode_steps=10**7, workload=workload, render_mode="rgb_array" if render else None)
    obs, _ = env.reset(seed=0)
    policy.reset()
    steps, start, done = 0, time.perf_counter(), False
    while not done:
        obs, _, terminated, truncated, _ = env.step(policy.act(obs))
        if render:
            env.render()
        steps += 1
        done = terminated or truncated
    return steps, time.perf_counter() - start, env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="burst")
    parser.add_argument("--policy", default="fcfs")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    bare, framed = [], []
    for _ in range(args.repeats):
        steps, seconds, env = episode(args.workload, args.policy, render=False)
        bare.append(seconds)
        env.close()
        _, seconds, env = episode(args.workload, args.policy, render=True)
        framed.append(seconds)
    log = env.unwrapped.cluster.log
    start = time.perf_counter()
    events = trace_events(log)
    trace_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        plot_timeline({"episode": log}, Path(folder) / "timeline.png")
        timeline_s = time.perf_counter() - start
    env.close()
    base = min(bare)
    print(f"{args.policy} on {args.workload}, seed 0: {steps} steps, {log.num_requests} requests")
    print(f"  episode, no frames      {base:8.3f} s  ({base / steps * 1e6:.0f} us a step)")
    print(f"  episode + rgb_array     {min(framed):8.3f} s  {min(framed) / base:6.2f}x  "
          f"({(min(framed) - base) / steps * 1e6:.0f} us a frame)")
    print(f"  trace events ({len(events['traceEvents'])})   {trace_s:8.3f} s  {trace_s / base:6.2f}x")
    print(f"  timeline.png            {timeline_s:8.3f} s  {timeline_s / base:6.2f}x")


if __name__ == "__main__":
    main()
