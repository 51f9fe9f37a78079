"""Train stable-baselines3 agents on the serving env (extra ``rl``), resumably.

A run directory ``runs/<env>__<algo>__<mode>__<task>__s<seed>`` holds:

* ``config.json``: the :class:`TrainConfig` and the run's state (written at the start, updated atomically
  after each new best and at the end; always strict JSON). However a call ends, it tells the truth: ``status``
  is ``finished``, ``interrupted`` (SIGINT or SIGTERM, named in ``stopped_by``; ``interrupted`` is then true) or
  ``failed`` (with ``error``), with ``timesteps_done`` of the ``timesteps`` asked and ``last_checkpoint`` (the
  file ``--resume`` continues from). A start that fails before the first step leaves no run directory;
* ``best_model.zip`` + ``best_vecnormalize.pkl``: the best model by periodic evaluation on the task's
  validation seeds, with the normalisation statistics it was scored with; ``eval.csv`` the evaluation history;
* ``checkpoints/model_<N>_steps.zip`` + ``model_vecnormalize_<N>_steps.pkl`` every ``checkpoint_freq`` steps and
  when a signal stops the run (``servegym train --resume RUN`` continues from the latest to ``timesteps``);
* ``model.zip`` + ``vecnormalize.pkl`` at the end, and TensorBoard logs under ``tb/``.

Training episodes draw their seeds from :data:`~servegym.envs.tasks.TRAIN_SEEDS`, evaluation uses
:data:`~servegym.envs.tasks.VALIDATION_SEEDS`; the test seeds of ``servegym bench`` are never seen.
"""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing
import os
import pickle
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from servegym import ENV_ID
from servegym.benchmark.provenance import RECORD, data_record
from servegym.envs.tasks import TRAIN_SEEDS, VALIDATION_SEEDS
from servegym.rl.algorithms import algorithm_class, check_hyperparams
from servegym.rl.config import TrainConfig, router_expert, scorer_params, usable_cpus
from servegym.rl.evaluation import FINAL_MODEL, FINAL_STATS, SeedListEval, write_json
from servegym.rl.fast_dist import policy_for
from servegym.rl.route_policy import normalizes_observations
from servegym.rl.stopping import StopOnSignals, TrainingInterrupted, end_processes, spawned_children
from servegym.rl.wrappers import ScaledObservation, TrainSeeds, rank_grid, wrap

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm

CHECKPOINT_RE = re.compile(r"model_(\d+)_steps\.zip$")


def make_training_env(env_kwargs: dict[str, Any], mode: str, max_episode_steps: int | None = None,
                      seeds: tuple[int, int] | None = None, monitor: bool = True,
                      reward_scale: float = 1.0, reference: str | None = None,
                      mode_kwargs: dict[str, Any] | None = None, observation: str = "raw") -> gym.Env:
    """The env an agent trains on: ``gym.make`` + episode statistics + the action mode (its wrapper built with
    ``mode_kwargs``), and with ``seeds =
    (start, stride)`` training seeds from :data:`TRAIN_SEEDS` for every reset; rewards relative to the
    ``reference`` params file's policy, then times ``reward_scale`` (both after the episode statistics, which stay
    in the task's units); with ``observation="scaled"`` the agent sees :class:`ScaledObservation`."""
    from stable_baselines3.common.monitor import Monitor

    limit = {"max_steps": max_episode_steps} if max_episode_steps is not None else {}
    env = gym.make(ENV_ID, **{**env_kwargs, **limit})
    if seeds is not None:
        env = TrainSeeds(env, *seeds)
    env = Monitor(env) if monitor else env
    if reference is not None:
        from servegym.rl.reference import ReferenceReward
        from servegym.tuning.study import read_params

        env = ReferenceReward(env, *read_params(reference))
    if reward_scale != 1.0:
        env = gym.wrappers.TransformReward(env, partial(_scaled, reward_scale))
    env = wrap(env, mode, **(mode_kwargs or {}))
    return ScaledObservation(env) if observation == "scaled" else env


def _scaled(scale: float, reward: float) -> float:
    return scale * reward


def _vec_env(cfg: TrainConfig, subprocess: bool, offset: int = 0):
    from stable_baselines3.common.vec_env import SubprocVecEnv

    from servegym.rl.vec_env import NativeVecEnv

    start = cfg.seed * 10_007 + offset
    factories = [partial(make_training_env, cfg.env_kwargs(), cfg.resolved_mode, cfg.max_episode_steps,
                         (start + rank, cfg.n_envs), True, cfg.reward_scale, cfg.reward_reference,
                         cfg.mode_kwargs(), cfg.observation)
                 for rank in range(cfg.n_envs)]
    if cfg.vec_env == "subprocess" and subprocess and cfg.n_envs > 1:
        # spawn, not SB3's default forkserver: each worker is this process's own child, known by its pid from the
        # start, so a stop during set-up ends it at once (a forkserver's children outlived a SIGTERM by ~30 s).
        return SubprocVecEnv(factories, start_method="spawn")
    shards = min(cfg.n_envs, usable_cpus()) if cfg.vec_env == "sharded" and subprocess else 1
    return NativeVecEnv(factories, shards)


def _imitate(model: BaseAlgorithm, cfg: TrainConfig) -> dict[str, float]:
    from servegym.rl.imitation import imitate, imitate_router

    if cfg.resolved_mode == "route":
        return imitate_router(model, cfg.env_kwargs(), *router_expert(cfg.imitate), cfg.imitate_episodes,
                              seed=cfg.seed)
    return imitate(model, cfg.env_kwargs(), scorer_params(cfg.imitate, "imitate"), cfg.imitate_episodes,
                   seed=cfg.seed)


def _algorithm_kwargs(cfg: TrainConfig, observation_space: gym.Space) -> dict[str, Any]:
    """The algorithm's arguments: the run's hyperparameters, with a per-transition discount buffer if asked."""
    if cfg.discount_half_life_s is None:
        return dict(cfg.hyperparams)
    from servegym.rl.time_discount import buffer_class

    return {**cfg.hyperparams,
            "rollout_buffer_class": buffer_class(isinstance(observation_space, gym.spaces.Dict))}


def check_start(cfg: TrainConfig) -> None:
    """Refuse here, in this process, what would otherwise fail only inside the env workers or the algorithm: the
    algorithm's arguments (:func:`~servegym.rl.algorithms.check_hyperparams`), then the training env, built once
    and reset on the first training seed. The env is built one group of settings at a time, so that the error names
    the flag at fault: ``--profile``, ``--engine``, ``--pool``, ``--env``, ``--max-episode-steps``."""
    check_hyperparams(cfg.algo, cfg.hyperparams)
    kwargs = cfg.env_kwargs()
    core = {key: kwargs[key] for key in ("task", "workload", "profile") if key in kwargs}
    stages = [(f"--profile {cfg.profile}" if cfg.profile is not None else f"the {cfg.task or cfg.workload} env", {}),
              (f"--engine {json.dumps(cfg.engine)}", {"engine": kwargs["engine"]}),
              (f"--pool {json.dumps(cfg.pool)}", {"pool": kwargs["pool"]}),
              (f"--env {json.dumps(cfg.env)}", dict(cfg.env)),
              (f"--max-episode-steps {cfg.max_episode_steps}",
               {} if cfg.max_episode_steps is None else {"max_steps": cfg.max_episode_steps})]
    for label, extra in stages:
        core.update(extra)
        if extra or label == stages[0][0]:
            _built(label, partial(gym.make, ENV_ID, **core))
    _built(f"the training env ({cfg.resolved_mode} mode)",
           partial(make_training_env, kwargs, cfg.resolved_mode, cfg.max_episode_steps, (cfg.seed * 10_007, 1), True,
                   cfg.reward_scale, cfg.reward_reference, cfg.mode_kwargs(), cfg.observation), reset=True)


def _built(label: str, build: Callable[[], gym.Env], reset: bool = False) -> None:
    """Build (and with ``reset``, reset) an env and close it; a failure is a one-line ``ValueError`` led by
    ``label``."""
    try:
        env = build()
        try:
            if reset:
                env.reset()
        finally:
            env.close()
    except (ValueError, TypeError, KeyError, OSError, gym.error.Error) as err:
        raise ValueError(f"{label}: {_one_line(err)}") from None


def _one_line(err: BaseException) -> str:
    """An error's message on one line; gym.make's "unexpected keyword argument" without its echo of every kwarg."""
    text = " ".join(str(err).split())
    unexpected = re.search(r"unexpected keyword argument '(\w+)'", text)
    if isinstance(err, TypeError) and unexpected:
        return f"gym.make({ENV_ID!r}) takes no argument {unexpected.group(1)!r}"
    return text or type(err).__name__


def train(cfg: TrainConfig, progress: bool = True, subprocess: bool = True, checked: bool = False) -> Path:
    """Train from scratch, evaluating periodically on the validation seeds; return the run directory.

    Everything checkable is checked first (:func:`check_start`), before the run directory or any worker exists;
    a start that fails later (before the first step) removes the run directory it made, so the corrected command
    is not refused. SIGINT or SIGTERM raises :class:`~servegym.rl.stopping.TrainingInterrupted` (``exit_status``
    130 or 143) after a checkpoint of the steps taken is saved and ``config.json`` says ``interrupted``
    (:func:`resume` continues it); any other error is re-raised after it says ``failed``. ``checked``: the caller
    has run :func:`check_start` on ``cfg`` already (its env build and any reference episode are not repeated)."""
    run = Path(cfg.out) / cfg.run_name
    if run.is_dir() and any(run.iterdir()):
        raise ValueError(f"{run} already holds a run; continue it with --resume {run}, or pick another --out or "
                         "--seed")
    if not checked:
        check_start(cfg)
    existed = run.is_dir()
    run.mkdir(parents=True, exist_ok=True)
    return _from_scratch(run, cfg, progress, subprocess, failed_start=partial(_discard, run, existed))


def _from_scratch(run: Path, cfg: TrainConfig, progress: bool, subprocess: bool,
                  failed_start: Callable[[], None]) -> Path:
    state = {"status": "running", "interrupted": False, "timesteps_done": 0, "wall_s": 0.0,
             "best_mean_reward": None, "best_timesteps": None, "last_checkpoint": None, RECORD: training_record(cfg)}
    with _Session(run, cfg, state, failed_start) as session:
        from stable_baselines3.common.vec_env import VecNormalize

        venv = _vec_env(cfg, subprocess)
        if cfg.normalize:
            venv = VecNormalize(venv, norm_obs=normalizes_observations(cfg.algo, cfg.resolved_mode), norm_reward=True,
                                gamma=cfg.hyperparams.get("gamma", 0.99))
        policy = policy_for(cfg.algo, venv.action_space, cfg.resolved_mode)
        try:
            session.model = algorithm_class(cfg.algo)(policy, venv, seed=cfg.seed, verbose=0,
                                                      tensorboard_log=str(run / "tb"),
                                                      **_algorithm_kwargs(cfg, venv.observation_space))
        except (AssertionError, TypeError, ValueError) as err:  # a value the algorithm refuses
            raise ValueError(f"--hyperparams {json.dumps(cfg.hyperparams)}: {algorithm_class(cfg.algo).__name__} "
                             f"refuses them: {_one_line(err)}") from None
        if cfg.imitate is not None:
            session.write(imitation=_imitate(session.model, cfg))
        session.learning = True
        return _learn(session, cfg.timesteps, progress, reset=True)


def _discard(run: Path, existed: bool) -> None:
    """Remove what a failed start wrote: ``run`` itself, or its contents when it was there (empty) before."""
    if not existed:
        shutil.rmtree(run, ignore_errors=True)
        return
    for path in run.iterdir():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def resume(run: str | Path, progress: bool = True, subprocess: bool = True) -> Path:
    """Continue a run from its latest checkpoint (model and normalisation statistics) to its timesteps; a run that
    was stopped or failed before it kept any step (no checkpoint) starts over in the same folder. A stop or an
    error is recorded in ``config.json`` as in :func:`train`; a resume that fails to start leaves the run's
    record as it was."""
    run = Path(run)
    data = _read_config(run)
    cfg = TrainConfig.from_json(data)
    checkpoint = resume_point(run)
    check_start(cfg)
    restore = partial(write_json, run / "config.json", data)
    if checkpoint is None:  # nothing kept: start over
        _discard(run, existed=True)
        restore()
        return _from_scratch(run, cfg, progress, subprocess, failed_start=restore)
    steps = int(CHECKPOINT_RE.search(checkpoint.name).group(1))
    stats = checkpoint.with_name(f"model_vecnormalize_{steps}_steps.pkl")
    if cfg.normalize and not stats.is_file():
        raise ValueError(f"{checkpoint} has no matching statistics {stats.name}")
    state = {key: data.get(key) for key in ("timesteps_done", "wall_s", "best_mean_reward", "best_timesteps", RECORD)}
    state.update(status="running", interrupted=False, resumed_from=steps, last_checkpoint=_relative(run, checkpoint))
    with _Session(run, cfg, state, failed_start=restore) as session:
        from stable_baselines3.common.vec_env import VecNormalize

        venv = _vec_env(cfg, subprocess, offset=steps)  # fresh training seeds, not the episodes already seen
        if cfg.normalize:
            venv = VecNormalize.load(str(stats), venv)
            venv.training = True
        extra = _algorithm_kwargs(cfg, venv.observation_space)
        buffer = {"rollout_buffer_class": extra["rollout_buffer_class"]} if "rollout_buffer_class" in extra else {}
        session.model = algorithm_class(cfg.algo).load(checkpoint, env=venv, device="cpu",
                                                       tensorboard_log=str(run / "tb"), **buffer)
        session.learning = True
        return _learn(session, max(0, cfg.timesteps - session.model.num_timesteps), progress, reset=False)


def resume_point(run: str | Path) -> Path | None:
    """The checkpoint :func:`resume` continues ``run`` from, or None when it starts over (a run stopped or failed
    before it kept a step); a ``ValueError`` when there is nothing to resume."""
    run = Path(run)
    data = _read_config(run)
    status, asked = data.get("status"), data.get("timesteps")
    if status == "finished" and isinstance(asked, int) and int(data.get("timesteps_done") or 0) >= asked:
        raise ValueError(f"{run} finished its {asked} timesteps already: nothing to resume")
    checkpoint = latest_checkpoint(run)
    if checkpoint is None and status not in ("interrupted", "failed"):
        raise ValueError(f"{run} has no checkpoint to resume from (checkpoints/model_<N>_steps.zip)")
    return checkpoint


def latest_checkpoint(run: Path) -> Path | None:
    found = [(int(m.group(1)), p) for p in (run / "checkpoints").glob("model_*_steps.zip")
             if (m := CHECKPOINT_RE.search(p.name))]
    return max(found)[1] if found else None


class _Session:
    """One :func:`train` or :func:`resume` call: keeps the run's ``config.json`` true however the call ends, keeps
    the steps taken when a signal stops it (a checkpoint), and stops the env workers it started when the call does
    not end normally."""

    def __init__(self, run: Path, cfg: TrainConfig, state: dict[str, Any],
                 failed_start: Callable[[], None]) -> None:
        self.run, self.cfg, self.state = run, cfg, state
        self.failed_start = failed_start
        """What an error before the first step undoes (:func:`train`: the run directory it made)."""
        self.model: BaseAlgorithm | None = None
        self.learning = False
        """Set once the model is built (and warm-started) and learning begins: from here a stop saves a checkpoint
        and an error is the run's (recorded as ``failed``), not the start's."""
        self.stop = StopOnSignals()
        self._wall_before = float(state.get("wall_s") or 0.0)
        self._started = time.perf_counter()
        self._children: set[multiprocessing.process.BaseProcess] = set()

    def write(self, **changes: Any) -> None:
        """Update the state (and the wall time so far) and write ``config.json``."""
        self.state.update(changes, wall_s=self._wall_before + time.perf_counter() - self._started)
        _write_config(self.run, self.cfg, self.state)

    def progress(self) -> dict[str, Any]:
        """The steps the model has taken and the checkpoint a resume would start from."""
        done = (self.state.get("timesteps_done") or 0) if self.model is None else self.model.num_timesteps
        checkpoint = latest_checkpoint(self.run)
        return {"timesteps_done": int(done),
                "last_checkpoint": None if checkpoint is None else _relative(self.run, checkpoint)}

    def __enter__(self) -> _Session:
        import torch

        torch.set_num_threads(self.cfg.torch_threads)  # before the model is built, cloned and trained
        self._children = set(multiprocessing.active_children())
        self._spawned = spawned_children()
        self.stop.__enter__()
        self.write()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if err is not None:
                with contextlib.suppress(TrainingInterrupted), self.stop.saving():
                    # A second signal waits until the record is written, and is the same stop (suppressed).
                    self._record(err)
                    self._stop_workers()
        finally:
            self.stop.__exit__(kind, err, tb)

    def _record(self, err: BaseException) -> None:
        if self.state.get("status") == "finished":  # a signal after the final save: the run is complete
            return
        if isinstance(err, KeyboardInterrupt):
            if self.learning:
                self._save_stop_checkpoint()
            progress = self.progress()
            name = err.signal_name if isinstance(err, TrainingInterrupted) else "SIGINT"
            self.write(status="interrupted", interrupted=True, stopped_by=name, **progress)
            if isinstance(err, TrainingInterrupted):
                err.run, err.progress = self.run, progress
        elif isinstance(err, Exception):
            if not self.learning:
                self.failed_start()
                return
            self.write(status="failed", error=f"{type(err).__name__}: {err}", **self.progress())

    def _save_stop_checkpoint(self) -> None:
        """Save the model and its normalisation statistics as ``checkpoints/model_<N>_steps``, N the steps it has
        taken, as the periodic checkpoints are (the steps of a rollout not yet learned from are counted, as SB3
        counts them): :func:`resume` continues from it to the run's timesteps. Each file is written whole
        (atomically), statistics first, so the latest model always has its statistics."""
        model = self.model
        if model is None:
            return
        steps = int(model.num_timesteps)
        folder = self.run / "checkpoints"
        path, stats_path = folder / f"model_{steps}_steps.zip", folder / f"model_vecnormalize_{steps}_steps.pkl"
        stats = model.get_vec_normalize_env()
        if path.is_file() and (stats is None or stats_path.is_file()):
            return  # the periodic checkpoint of this very step
        folder.mkdir(exist_ok=True)
        if stats is not None:
            _write_atomically(stats_path, pickle.dumps(stats))  # what VecNormalize.save writes
        buffer = io.BytesIO()
        model.save(buffer)
        _write_atomically(path, buffer.getvalue())

    def _stop_workers(self) -> None:
        """Terminate the env workers (SubprocVecEnv's daemon processes) this call started, set-up included."""
        started = [p for p in multiprocessing.active_children() if p not in self._children and p.daemon]
        for process in started:
            process.terminate()
        for process in started:
            process.join(timeout=30)
        # A signal that lands inside Process.start() leaves a spawned child multiprocessing never registered.
        end_processes(spawned_children() - self._spawned)


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _relative(run: Path, path: Path) -> str:
    return path.relative_to(run).as_posix()


def _learn(session: _Session, timesteps: int, progress: bool, reset: bool) -> Path:
    import torch
    from stable_baselines3.common.callbacks import CallbackList, CheckpointCallback

    class Checkpoints(CheckpointCallback):
        """SB3's checkpoints, each written whole before a signal stops the run."""

        def _on_step(self) -> bool:
            with session.stop.saving():
                return super()._on_step()

    model, cfg, run, state = session.model, session.cfg, session.run, session.state
    # Validating every distribution's arguments costs more than an env step in the admit mode (32 slots).
    torch.distributions.Distribution.set_default_validate_args(False)
    eval_env = make_training_env(cfg.env_kwargs(), cfg.resolved_mode, cfg.max_episode_steps, monitor=False,
                                 mode_kwargs=cfg.mode_kwargs(), observation=cfg.observation)

    def on_best(score: float, timesteps_done: int) -> None:
        session.write(best_mean_reward=score, best_timesteps=timesteps_done)

    best = state["best_mean_reward"]
    evaluation = SeedListEval(eval_env, VALIDATION_SEEDS[: cfg.eval_episodes], max(1, cfg.eval_freq // cfg.n_envs),
                              run, cfg.algo == "maskable-ppo", on_best, -float("inf") if best is None else best,
                              saving=session.stop.saving,
                              at_start=reset and (cfg.imitate is not None or cfg.score_base is not None))
    checkpoints = Checkpoints(max(1, cfg.checkpoint_freq // cfg.n_envs), str(run / "checkpoints"),
                              name_prefix="model", save_vecnormalize=True)
    from servegym.rl.threads import UpdateThreads

    callbacks = [checkpoints, evaluation, UpdateThreads(cfg.update_threads, cfg.torch_threads)]
    if cfg.discount_half_life_s is not None:
        from servegym.rl.time_discount import TimeDiscount

        callbacks.insert(0, TimeDiscount(cfg.discount_half_life_s))  # before a checkpoint or evaluation
    if timesteps > 0:
        try:
            model.learn(total_timesteps=timesteps, callback=CallbackList(callbacks),
                        progress_bar=progress, tb_log_name="train", reset_num_timesteps=reset)
        finally:  # an update stopped by a signal or an error leaves its threads set
            torch.set_num_threads(cfg.torch_threads)
    if evaluation.best_score == -float("inf"):  # no evaluation fell due: score the final model once
        from stable_baselines3.common.logger import configure

        model.set_logger(configure(str(run / "tb"), ["tensorboard"]))  # a loaded model has none before learn()
        evaluation.init_callback(model)
        evaluation.evaluate_now()
    venv = model.get_env()
    with session.stop.saving():
        model.save(run / FINAL_MODEL)
        if cfg.normalize:
            venv.save(str(run / FINAL_STATS))
        session.write(status="finished", interrupted=False, **session.progress())
    venv.close()
    eval_env.close()
    return run


def training_record(cfg: TrainConfig) -> dict[str, Any]:
    """What the run learns from (:func:`~servegym.benchmark.provenance.data_record`): its task, split and workload,
    its training and validation seeds, and the records of the params files it builds on (a residual's base scorer,
    an imitated scorer)."""
    from servegym.tuning.study import params_record

    files = {"score_base": cfg.score_base, "imitate": cfg.imitate}
    inputs = {name: params_record(path) for name, path in files.items() if path is not None and Path(path).is_file()}
    return data_record(cfg.task, cfg.env.get("split"), cfg.workload or cfg.env.get("workload"),
                       {"train": [TRAIN_SEEDS.start, TRAIN_SEEDS.stop],
                        "validation": [VALIDATION_SEEDS[0], VALIDATION_SEEDS[0] + cfg.eval_episodes]}, inputs)


def _write_config(run: Path, cfg: TrainConfig, state: dict[str, Any]) -> None:
    grid = {"rank_grid": rank_grid()} if cfg.resolved_mode == "rank" else {}
    write_json(run / "config.json", {**asdict(cfg), **grid, "mode": cfg.resolved_mode, "env_kwargs": cfg.env_kwargs(),
                                     "train_seeds": [TRAIN_SEEDS.start, TRAIN_SEEDS.stop],
                                     "validation_seeds": list(VALIDATION_SEEDS[: cfg.eval_episodes]), **state})


def _read_config(run: Path) -> dict[str, Any]:
    path = run / "config.json"
    if not path.is_file():
        raise ValueError(f"{run} is not a servegym train run (no config.json)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from None
