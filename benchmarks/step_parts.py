"""Where a native vector env step's time goes, per action mode: the split that says what compiling would buy.

Usage: python benchmarks/step_parts.py [--task memory-tight] [--envs 16] [--steps 500] [--repeats 1] [--modes ...]

Steps ``--envs`` training envs of ``--task`` (``rl_speed.py``'s vec-section factories, pre-drawn random actions,
the same seeds) in one ``ServingVectorEnv`` per action mode, twice: untimed, for the rate, then with a wall-clock
timer around each part, for the split (the timers add about 0.1-0.3 us a call, booked to the part around the timed
call, so the parts sum to more than the untimed step). With ``--repeats R`` the untimed run is made R times (a fresh
vector env each time, the same episodes) and the fastest counts: on a shared machine, whose speed moves by tens of
percent between seconds, the best of several short runs is what two versions of the code can be compared by. The
parts, in us per env step:

* ``engine``: the engine's ``step`` calls made by the pool's ``step`` (compiled where built; its iteration-time
  model runs as Python); ``skip``: the engine's own loop of iterations nothing can be admitted at
  (``Cluster.skip``, engine included);
* ``pool``: the pool's ``step`` less its engine call (the clock, arrivals, routing, the latency integral);
* ``encode``, ``decode``: the observation written and the action read (``ObservationEncoder.encode``,
  ``ServingEnv._decode_action``); ``account``: rewards and counts (``_account`` and ``_account_run``);
  ``info``: the info dict; ``env, rest``: the rest of ``ServingEnv.step`` and of its ``reset`` at each episode's
  start (drawing the workload);
* ``wrappers``: the action-mode wrapper, SB3's ``Monitor`` and Gymnasium's ``TimeLimit``, ``OrderEnforcing``
  and checker (what a wrapped ``step`` costs over the unwrapped one, resets included);
* ``vector``: ``ServingVectorEnv.step_rows`` over its sub-envs' steps (batching the rows, rewards and flags).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial

from rl_speed import VEC_MODES, _task_env, _timed_attr

from servegym.envs.vector import ServingVectorEnv
from servegym.validation import count_arg

PARTS = ("engine", "skip", "pool", "encode", "decode", "account", "info", "env, rest", "wrappers", "vector")


def run(mode: str, args: argparse.Namespace, instrument: Callable[[ServingVectorEnv], dict[str, float]] | None
        ) -> tuple[float, dict[str, float], list[float]]:
    """Step the vector env ``args.steps`` times (timed by ``instrument``'s timers where given); return the wall
    seconds, the timers' seconds and the rewards' sum per vector step (the same with and without timers)."""
    vector = ServingVectorEnv([partial(_task_env, args.task, mode)] * args.envs, autoreset_mode="SameStep",
                              copy=False)
    try:
        vector.reset(seed=0)
        vector.action_space.seed(0)
        actions = [vector.action_space.sample() for _ in range(64)]
        spent = instrument(vector) if instrument else {}
        sums = []
        start = time.perf_counter()
        for k in range(args.steps):
            sums.append(float(vector.step_rows(actions[k % len(actions)])[1].sum()))
        wall = time.perf_counter() - start
        return wall, spent, sums
    finally:
        vector.close()


def instrument(vector: ServingVectorEnv) -> dict[str, float]:
    """Put a timer around each part of every sub-env's step; return the seconds each part's timers add up to."""
    spent = dict.fromkeys(("vector", "wrapped", "unwrapped", "cluster", "engine", "skip", "encode", "decode",
                           "account", "info"), 0.0)
    _timed_attr(vector, "step_rows", spent, "vector")
    for env in vector.envs:
        serving = env.unwrapped
        _timed_attr(env, "step", spent, "wrapped")
        _timed_attr(env, "reset", spent, "wrapped")
        _timed_attr(serving, "step", spent, "unwrapped")
        _timed_attr(serving, "reset", spent, "unwrapped")
        in_pool_step = [False]  # the engine's own loop (skip) calls its step too: count the pool step's alone
        _timed_attr(serving.cluster, "step", spent, "cluster", sets=in_pool_step)
        _timed_attr(serving.cluster, "skip", spent, "skip")
        for engine in serving.cluster.engines:
            _timed_attr(engine, "step", spent, "engine", within=in_pool_step)
        _timed_attr(serving._encoder, "encode", spent, "encode")
        _timed_attr(serving, "_decode_action", spent, "decode")
        _timed_attr(serving, "_account", spent, "account")
        _timed_attr(serving, "_account_run", spent, "account")
        _timed_attr(serving, "_info", spent, "info")
    return spent


def parts(s: dict[str, float]) -> dict[str, float]:
    """The parts (seconds) from the timers' nested sums."""
    return {"engine": s["engine"], "skip": s["skip"], "pool": s["cluster"] - s["engine"], "encode": s["encode"],
            "decode": s["decode"], "account": s["account"], "info": s["info"],
            "env, rest": s["unwrapped"] - s["cluster"] - s["skip"] - s["encode"] - s["decode"] - s["account"]
            - s["info"], "wrappers": s["wrapped"] - s["unwrapped"], "vector": s["vector"] - s["wrapped"]}


def parts_row(mode: str, args: argparse.Namespace) -> str:
    steps = args.steps * args.envs
    walls, plain = [], None
    for _ in range(args.repeats):
        wall, _, sums = run(mode, args, None)
        if plain is not None and sums != plain:
            raise RuntimeError(f"{mode}: a repeat stepped other episodes than the first")
        walls.append(wall)
        plain = sums
    wall = min(walls)
    _, s, timed = run(mode, args, instrument)
    if timed != plain:
        raise RuntimeError(f"{mode}: the timed run stepped other episodes than the untimed one")
    us = {k: v / steps * 1e6 for k, v in parts(s).items()}
    return (f"| {mode} | {steps / wall:,.0f} | {wall / steps * 1e6:.1f} | {s['vector'] / steps * 1e6:.1f} | "
            + " | ".join(f"{us[k]:.1f}" for k in PARTS) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="memory-tight", help="the task whose training envs are stepped")
    parser.add_argument("--envs", type=count_arg("envs"), default=16, help="sub-envs of the vector env")
    parser.add_argument("--steps", type=count_arg("steps"), default=500, help="vector steps per measurement")
    parser.add_argument("--repeats", type=count_arg("seeds"), default=1,
                        help="untimed runs per mode, the fastest reported")
    parser.add_argument("--modes", nargs="+", choices=VEC_MODES, default=list(VEC_MODES), help="the action modes")
    args = parser.parse_args()
    print(f"{args.task}, {args.envs} envs in one ServingVectorEnv, {args.steps} vector steps, random actions, "
          f"the untimed rate the best of {args.repeats}; us per env step")
    print("| mode | env steps/s | untimed | timed | " + " | ".join(PARTS) + " |")
    print("|---|---:|---:|---:|" + "---:|" * len(PARTS))
    for mode in args.modes:
        print(parts_row(mode, args), flush=True)


if __name__ == "__main__":
    main()
