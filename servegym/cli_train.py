"""``servegym train``: a stable-baselines3 agent on a task or workload."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from servegym.cli_args import add_config_args, config_args, json_object
from servegym.engine.config import LENGTH_MODES
from servegym.envs.tasks import TASKS
from servegym.rl.config import TrainConfig
from servegym.rl.zoo import shipped_zoo_files
from servegym.workloads import WORKLOADS

TRAIN_FLAGS = ("timesteps", "seed", "n_envs", "vec_env", "max_episode_steps", "eval_freq", "eval_episodes",
               "checkpoint_freq", "reward_scale", "observation", "update_threads", "out")
"""``servegym train``'s flags that mirror ``TrainConfig`` fields (type, default and help from the field)."""


def cmd_train(args: argparse.Namespace) -> int:
    import json

    from servegym.rl.stopping import TrainingInterrupted
    from servegym.rl.train import check_start, resume, resume_point, train

    try:
        if args.resume:
            checkpoint = resume_point(args.resume)
            print(f"servegym train: resuming {args.resume} "
                  f"{f'from {checkpoint.name}' if checkpoint else '(no checkpoint: from the start)'}")
            run = resume(args.resume, progress=not args.quiet)
        else:
            engine = {"length_mode": args.length_mode or "predicted"}
            engine.update(json_object("--engine", args.engine))
            hyper = json_object("--hyperparams", args.hyperparams)
            fields = {**config_args(args, TRAIN_FLAGS), "mode": args.mode, "env": json_object("--env", args.env),
                      "normalize": not args.no_normalize}
            if args.zoo:
                if not args.task:
                    raise ValueError("--zoo reads the entry of a task: give --task")
                from servegym.rl.zoo import read_zoo

                zoo = read_zoo(args.zoo, args.task, args.algo)
                fields.update({k: v for k, v in zoo.items() if k != "hyperparams"})
                hyper = {**zoo["hyperparams"], **hyper}
            cfg = TrainConfig(algo=args.algo, task=args.task, workload=args.workload,
                              profile=args.profile, engine=engine, pool=json_object("--pool", args.pool),
                              hyperparams=hyper, **fields, reward_reference=args.reward_reference,
                              imitate=args.imitate, score_base=args.score_base,
                              discount_half_life_s=args.discount_half_life,
                              **({} if args.residual_scale is None else {"residual_scale": args.residual_scale}))
            check_start(cfg)  # bad input is one line, before this one and before any worker
            print(f"servegym train: {cfg.run_name}: {cfg.timesteps} timesteps on {cfg.n_envs} envs")
            run = train(cfg, progress=not args.quiet, checked=True)
    except TrainingInterrupted as stop:  # SIGINT 130, SIGTERM 143
        print(f"\nservegym train: {stop.message()}", file=sys.stderr)
        return stop.exit_status
    info = json.loads((run / "config.json").read_text())
    best = info["best_mean_reward"]
    print(f"trained in {info['wall_s']:.0f} s; best validation return "
          f"{'n/a' if best is None else f'{best:.1f}'} at {info['best_timesteps']} steps; run: {run}")
    if info.get("mode") == "route":  # a router: it plays its routing task
        print(f"use it as a router: servegym run --task {info['task']} --policy rl:{run}   or servegym bench "
              f"--tasks {info['task']} --rl {run}")
    else:
        print(f"use it as a policy: servegym run --policy rl:{run}   or in servegym bench --rl {run}")
    return 0


def add_train_parser(sub: Any) -> None:
    """Add ``servegym train`` to ``sub`` (the parser's ``add_subparsers()`` result)."""
    trn = sub.add_parser("train", help="train a stable-baselines3 agent (PPO by default)")
    trn.add_argument("--algo", default="ppo", choices=["ppo", "a2c", "dqn", "sac", "maskable-ppo"])
    trn.add_argument("--mode", default=None, choices=["admit", "window", "count", "rank", "score", "params", "route"],
                     help="action mode (default per algorithm; on a routing task, such as cluster-routing, route: "
                          "the replica of each arrival, its only mode)")
    trn.add_argument("--task", default=None, choices=sorted(TASKS),
                     help="benchmark task (servegym tasks); the options below override its settings")
    trn.add_argument("--workload", default=None, choices=sorted(WORKLOADS),
                     help="workload (default: the task's, else burst)")
    trn.add_argument("--profile", default=None, help="GPU profile (default: the task's or the workload's)")
    trn.add_argument("--engine", default=None, help='engine settings as JSON, e.g. \'{"num_kv_blocks": 500}\'')
    trn.add_argument("--pool", default=None, help='pool settings as JSON, e.g. \'{"num_containers": 4}\'')
    trn.add_argument("--env", default=None,
                     help='other gym.make arguments as JSON, e.g. \'{"decision_steps": true}\'')
    add_config_args(trn, TrainConfig, TRAIN_FLAGS)
    trn.add_argument("--length-mode", choices=LENGTH_MODES, default=None,
                     help="default: predicted (every task uses predicted lengths)")
    trn.add_argument("--hyperparams", default=None, help='JSON, e.g. \'{"learning_rate": 3e-4, "n_steps": 512}\'')
    trn.add_argument("--no-normalize", action="store_true",
                     help="no VecNormalize (the score mode's network reads raw features on a log scale)")
    trn.add_argument("--zoo", default=None, metavar="FILE",
                     help="hyperparameters in the RL Zoo's format: a YAML file, or the name of one shipped with "
                          f"servegym ({', '.join(shipped_zoo_files())}; e.g. --zoo ppo): the entry for the task's id "
                          "replaces --timesteps, --n-envs, --no-normalize, --mode and --env where it has them, and "
                          "gives the algorithm's arguments (--hyperparams JSON merges on top)")
    trn.add_argument("--reward-reference", default=None, metavar="PARAMS",
                     help="train on rewards relative to this policy's episode on the same seed (a params file)")
    trn.add_argument("--imitate", default=None, metavar="PARAMS",
                     help="score mode: first fit the policy to a tuned scorer (servegym tune's best_params.json); "
                          "route mode: to a router, by name (router-kv-aware) or params file")
    trn.add_argument("--score-base", default=None, metavar="PARAMS",
                     help="score mode: act as a residual on this tuned scorer (action 0 is the scorer); params "
                          "mode: the scorer whose parameters the agent moves")
    trn.add_argument("--residual-scale", type=float, default=None,
                     help="score mode with --score-base: an action of 1 multiplies a score by exp(scale) and moves "
                          "the memory target by 0.6 x scale of the cache (default 0.2)")
    trn.add_argument("--discount-half-life", type=float, default=None, metavar="SECONDS",
                     help="PPO/A2C: discount each step by the simulated seconds it took (half-life), not per step")
    trn.add_argument("--resume", default=None, metavar="RUN",
                     help="continue RUN from its latest checkpoint (a stop saves one) to its timesteps; the other "
                          "options are RUN's own (config.json)")
    trn.add_argument("--quiet", action="store_true")
    trn.set_defaults(func=cmd_train)
