"""Optuna studies over a policy's declared search space: resumable, shareable by many workers, prunable."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from servegym.policies import POLICIES, make_policy
from servegym.runner import make_env, run_episode
from servegym.tuning.objectives import Objective, get_objective
from servegym.workloads import Workload, make_workload

if TYPE_CHECKING:
    import optuna

TUNING_SEED_BASE = 10_000
"""Tuning episodes use seeds from here on; evaluation uses seeds 0.. (disjoint by construction)."""


@dataclass(frozen=True)
class TuneConfig:
    policy: str
    workload: str
    objective: str = "goodput"
    trials: int = 50
    seeds: int = 3
    """Episodes averaged per trial (tuning seeds TUNING_SEED_BASE + k)."""
    eval_seeds: int = 5
    """Held-out seeds 0..eval_seeds-1 for the default-vs-tuned comparison."""
    storage: str | None = None
    study_name: str | None = None
    pruner: str = "median"
    sampler_seed: int = 0
    max_steps: int = 100_000
    env: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; registered: {sorted(POLICIES)}")
        if POLICIES[self.policy].search_space is None:
            tunable = sorted(n for n, c in POLICIES.items() if c.search_space is not None)
            raise ValueError(f"policy {self.policy!r} declares no search space; tunable: {tunable}")
        get_objective(self.objective)
        if self.pruner not in ("median", "halving", "none"):
            raise ValueError(f"pruner must be median, halving or none, got {self.pruner!r}")
        if self.trials < 0:
            raise ValueError("trials must be >= 0 (0 only reports on an existing study)")
        for name in ("seeds", "eval_seeds"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")

    @property
    def name(self) -> str:
        return self.study_name or f"{self.policy}-{self.workload}-{self.objective}"

    def storage_url(self) -> str:
        return self.storage or f"sqlite:///studies/{self.name}.db"


def make_storage(url: str) -> optuna.storages.BaseStorage:
    """An Optuna storage from a URL: any RDB URL (sqlite:///, postgresql://, mysql://) or ``journal:PATH``
    for a JournalStorage on a shared file (the safest choice for many processes on one machine or an NFS)."""
    import optuna

    if url.startswith("journal:"):
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        path = Path(url.removeprefix("journal:"))
        path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path)))
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}}
                                      if url.startswith("sqlite") else {})


def evaluate(policy: str, params: dict[str, Any], workload: Workload, seeds: list[int], max_steps: int,
             env: dict[str, Any] | None = None) -> list[dict[str, float]]:
    out = []
    for seed in seeds:
        p = make_policy(policy, **params)
        e = make_env(p, max_episode_steps=max_steps, workload=workload, **(env or {}))
        out.append(run_episode(e, p, seed=seed).summary)
        e.close()
    return out


def objective_function(cfg: TuneConfig, objective: Objective,
                       workload: Workload) -> Callable[[optuna.Trial], float | tuple[float, ...]]:
    import optuna

    space = POLICIES[cfg.policy].search_space

    def run(trial: optuna.Trial) -> float | tuple[float, ...]:
        params = space(trial)
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        started = time.perf_counter()
        scores = []
        for k in range(cfg.seeds):
            seed = TUNING_SEED_BASE + k
            metrics = evaluate(cfg.policy, params, workload, [seed], cfg.max_steps, cfg.env)[0]
            scores.append(objective.score(metrics))
            if not objective.multi:
                trial.report(float(np.mean([s[0] for s in scores])), k)
                if trial.should_prune():
                    raise optuna.TrialPruned()
        trial.set_user_attr("wall_s", time.perf_counter() - started)
        mean = tuple(float(v) for v in np.mean(scores, axis=0))
        return mean if objective.multi else mean[0]

    return run


def _pruner(name: str):
    import optuna

    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=0)
    if name == "halving":
        return optuna.pruners.SuccessiveHalvingPruner()
    return optuna.pruners.NopPruner()


def load_study(cfg: TuneConfig) -> optuna.Study:
    import optuna

    objective = get_objective(cfg.objective)
    sampler = (optuna.samplers.NSGAIISampler(seed=cfg.sampler_seed) if objective.multi
               else optuna.samplers.TPESampler(seed=cfg.sampler_seed))
    return optuna.create_study(study_name=cfg.name, storage=make_storage(cfg.storage_url()),
                               directions=list(objective.directions), sampler=sampler,
                               pruner=_pruner(cfg.pruner), load_if_exists=True)


def tune(cfg: TuneConfig, progress: bool = True) -> optuna.Study:
    """Run ``cfg.trials`` more trials on the (possibly shared, possibly resumed) study; return the study.

    A trial that raises is recorded as failed and the study goes on. SIGTERM and Ctrl-C stop after marking
    the running trial failed; every completed trial is already in the storage.
    """

    study = load_study(cfg)
    objective = get_objective(cfg.objective)
    workload = make_workload(cfg.workload)
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt("SIGTERM")

    signal.signal(signal.SIGTERM, on_term)
    try:
        study.optimize(objective_function(cfg, objective, workload), n_trials=cfg.trials, catch=(Exception,),
                       show_progress_bar=progress, gc_after_trial=False)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    return study


def best_params(study: optuna.Study) -> dict[str, Any]:
    """The best trial's parameters (for multi-objective studies: the Pareto trial with the best first value)."""
    import optuna

    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not complete:
        raise RuntimeError(f"study {study.study_name!r} has no completed trial")
    if len(study.directions) == 1:
        return dict(study.best_trial.params)
    sign = 1 if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else -1
    return dict(max(study.best_trials, key=lambda t: sign * t.values[0]).params)


def write_params(policy: str, params: dict[str, Any], path: Path, note: str = "") -> None:
    """A params file that ``servegym run/compare --params FILE`` accepts."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"policy": policy, "params": params, "note": note}, indent=2) + "\n")


def read_params(path: str | Path) -> tuple[str, dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"params file {path} does not exist")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: invalid JSON at line {err.lineno}: {err.msg}") from None
    if not isinstance(data, dict) or "policy" not in data or not isinstance(data.get("params"), dict):
        raise ValueError(f"{path}: expected {{'policy': NAME, 'params': {{...}}}}")
    return str(data["policy"]), dict(data["params"])
