"""Optuna studies over a policy's declared search space: resumable, shareable by many workers, prunable."""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from servegym.policies import POLICIES, make_policy
from servegym.runner import make_env, run_episode
from servegym.tuning.objectives import OBJECTIVES, Objective, get_objective
from servegym.tuning.stopping import StopOnSignals, TuningInterrupted
from servegym.tuning.storage import (
    TuningError,
    fail_stale_trials,
    make_storage,
    public_url,
    storage_path,
    worker_id,
)
from servegym.validation import count, count_arg
from servegym.workloads import Workload, make_workload

if TYPE_CHECKING:
    import optuna

log = logging.getLogger(__name__)

TUNING_SEED_BASE = 10_000
"""Tuning episodes use seeds from here on; evaluation uses seeds 0.. (disjoint by construction)."""
IDENTITY = ("policy", "workload", "objective", "env_id")
"""Study user attributes fixed by its first run; a run asking for other values is refused (a study begun on another
env version too: its trials scored another env)."""
NOT_COUNTED = "not_counted"
"""A trial user attribute: why this PRUNED trial is not one of the study's finished trials (a stop cut it short, or
the study already held its ``--trials`` when it started). :func:`finished_trials` leaves such trials out."""


SAMPLERS = ("tpe", "cmaes")
PRUNERS = ("median", "halving", "none")
OBJECTIVE_NAMES = tuple(OBJECTIVES)


@dataclass(frozen=True)
class TuneConfig:
    policy: str
    workload: str | None
    """The workload to tune on; None: the one ``env["task"]`` draws per episode (a mixture task)."""
    objective: str = field(default="goodput", metadata={"help": "what a trial optimises", "choices": OBJECTIVE_NAMES})
    trials: int = field(default=50, metadata={
        "help": "finished trials (complete, or pruned by the pruner) the study should hold: a run adds only the "
                "missing ones, so re-running a stopped command finishes the count and workers sharing a study stop "
                "together at it; failed and interrupted trials are not counted (0: report only)",
        "type": count_arg("trials", low=0)})
    seeds: int = field(default=3, metadata={"help": "episodes averaged per trial (tuning seeds TUNING_SEED_BASE + k)",
                                            "type": count_arg("seeds")})
    eval_seeds: int = field(default=5, metadata={"help": "held-out seeds 0..N-1 for default vs tuned",
                                                 "type": count_arg("seeds")})
    storage: str | None = field(default=None, metadata={
        "help": "Optuna storage URL (default sqlite:///studies/<study>.db; journal:PATH for a journal file)"})
    study_name: str | None = None
    pruner: str = field(default="median", metadata={"help": "Optuna pruner", "choices": PRUNERS})
    sampler: str = field(default="tpe", metadata={
        "help": "tpe (Optuna's default) or cmaes, the CMA evolution strategy (continuous search spaces; a "
                "multi-objective study always uses NSGA-II)", "choices": SAMPLERS})
    sampler_seed: int | None = field(default=None, metadata={
        "help": "the sampler's seed; default: a fresh one per worker (recorded on its trials), so parallel workers "
                "sample different points; workers sharing a study need different seeds"})
    heartbeat_s: int = 30
    """RDB storages: a running trial's heartbeat period; a trial silent for twice that is failed (worker died)."""
    max_steps: int = field(default=100_000, metadata={"help": "episode length cap in engine iterations",
                                                      "type": count_arg("steps")})
    env: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Counts first, before anything is built from them (a list of 10**9 seeds, say).
        for name, kind, low in (("trials", "trials", 0), ("seeds", "seeds", 1), ("eval_seeds", "seeds", 1),
                                ("max_steps", "steps", 1)):
            object.__setattr__(self, name, count(name, getattr(self, name), kind, low))
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; registered: {sorted(POLICIES)}")
        if POLICIES[self.policy].search_space is None:
            tunable = sorted(n for n, c in POLICIES.items() if c.search_space is not None)
            raise ValueError(f"policy {self.policy!r} declares no search space; tunable: {tunable}")
        get_objective(self.objective)
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {self.sampler!r}")
        if self.pruner not in PRUNERS:
            raise ValueError(f"pruner must be median, halving or none, got {self.pruner!r}")
        if isinstance(self.heartbeat_s, bool) or not isinstance(self.heartbeat_s, int) or self.heartbeat_s < 1:
            raise ValueError(f"heartbeat_s must be a whole number >= 1, got {self.heartbeat_s!r}")
        if self.workload is None and not self.env.get("task"):
            raise ValueError("without a workload, env['task'] must name the task whose episodes are tuned on")
        if self.sampler_seed is not None and not 0 <= self.sampler_seed < 2**32:
            raise ValueError(f"sampler_seed must be in [0, 2**32), got {self.sampler_seed}")

    @property
    def name(self) -> str:
        return self.study_name or f"{self.policy}-{self.workload or self.env['task']}-{self.objective}"

    def storage_url(self) -> str:
        return self.storage or f"sqlite:///studies/{self.name}.db"

    def storage_label(self) -> str:
        """The storage URL with any password masked, for messages and reports."""
        return public_url(self.storage_url())


def tuning_workload(cfg: TuneConfig) -> Workload | None:
    """The workload a study's episodes use, or None where the task draws it (a mixture)."""
    return None if cfg.workload is None else make_workload(cfg.workload)


def evaluate(policy: str, params: dict[str, Any], workload: Workload | None, seeds: list[int], max_steps: int,
             env: dict[str, Any] | None = None,
             checkpoint: Callable[[], None] | None = None) -> list[dict[str, float]]:
    out = []
    for seed in seeds:
        p = make_policy(policy, **params)
        chosen = {} if workload is None else {"workload": workload}
        e = make_env(p, max_episode_steps=max_steps, **chosen, **(env or {}))
        result = run_episode(e, p, seed=seed, checkpoint=checkpoint)
        out.append({**result.summary, "episode_return": result.total_reward})
        e.close()
    return out


def objective_function(cfg: TuneConfig, objective: Objective, workload: Workload | None,
                       checkpoint: Callable[[], None] = lambda: None,
                       ) -> Callable[[optuna.Trial], float | tuple[float, ...]]:
    """The trial function; ``checkpoint`` runs before each episode (it raises to stop the run there)."""
    import optuna

    space = POLICIES[cfg.policy].search_space

    def run(trial: optuna.Trial) -> float | tuple[float, ...]:
        trial.set_user_attr("worker", worker_id())
        trial.set_user_attr("sampler_seed", cfg.sampler_seed)
        params = space(trial)
        started = time.perf_counter()
        scores = []
        for k in range(cfg.seeds):
            checkpoint()
            seed = TUNING_SEED_BASE + k
            metrics = evaluate(cfg.policy, params, workload, [seed], cfg.max_steps, cfg.env, checkpoint)[0]
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


def _check_identity(study: optuna.Study, cfg: TuneConfig) -> None:
    """Record the study's policy, workload, objective and env id on first use; refuse a run that asks for others."""
    from servegym import ENV_ID

    wanted = {"policy": cfg.policy, "workload": cfg.workload, "objective": cfg.objective, "env_id": ENV_ID}
    if not any(key in study.user_attrs for key in IDENTITY):
        _check_legacy_params(study, cfg)
    elif "env_id" not in study.user_attrs and study.get_trials(deepcopy=False):
        study.set_user_attr("env_id", "an env before servegym/Serving-v2")  # its trials ran on v1 or v0
    for key in IDENTITY:
        if key not in study.user_attrs:
            study.set_user_attr(key, wanted[key])
    recorded = {key: study.user_attrs[key] for key in IDENTITY}  # read back: a racing first worker may have won
    if recorded != wanted:
        raise TuningError(f"study {cfg.name!r} in {cfg.storage_label()} holds trials of {_describe(recorded)}, "
                          f"not of {_describe(wanted)}; choose another --study name")


def _check_legacy_params(study: optuna.Study, cfg: TuneConfig) -> None:
    """A study from before identities were recorded: refuse it if its trials share no parameter with the policy."""
    import optuna

    held = {name for trial in study.get_trials(deepcopy=False) for name in trial.params}
    if not held:
        return
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "new study created in memory" line
    try:
        own = set(POLICIES[cfg.policy].search_space(optuna.create_study().ask()))
    finally:
        optuna.logging.set_verbosity(verbosity)
    if not held & own:
        raise TuningError(f"study {cfg.name!r} in {cfg.storage_label()} holds trials over {sorted(held)}, not over "
                          f"policy {cfg.policy!r}'s {sorted(own)}; choose another --study name")


def _describe(identity: dict[str, str]) -> str:
    return (f"policy {identity['policy']!r} on workload {identity['workload']!r} "
            f"with objective {identity['objective']!r} on {identity['env_id']}")


def load_study(cfg: TuneConfig, create: bool = True) -> optuna.Study:
    """Open (or create) the study, check it is this policy's, and fail the trials of dead workers.

    With ``create=False`` a missing study (or storage file) is a :class:`TuningError`, and nothing is created.
    """
    import optuna

    url, shown = cfg.storage_url(), cfg.storage_label()
    path = storage_path(url)
    if not create and path is not None and not path.is_file():
        raise TuningError(f"no study storage at {path}; run some trials first (--trials N)")
    objective = get_objective(cfg.objective)
    seed = cfg.sampler_seed if cfg.sampler_seed is not None else fresh_seed()
    if objective.multi:
        sampler = optuna.samplers.NSGAIISampler(seed=seed)
    elif cfg.sampler == "cmaes":
        sampler = optuna.samplers.CmaEsSampler(seed=seed)
    else:
        sampler = optuna.samplers.TPESampler(seed=seed)
    storage = make_storage(url, heartbeat_s=cfg.heartbeat_s)
    try:
        if create:
            study = optuna.create_study(study_name=cfg.name, storage=storage, directions=list(objective.directions),
                                        sampler=sampler, pruner=_pruner(cfg.pruner), load_if_exists=True)
        else:
            study = optuna.load_study(study_name=cfg.name, storage=storage, sampler=sampler,
                                      pruner=_pruner(cfg.pruner))
    except KeyError as err:
        if create:
            raise TuningError(f"cannot read study {cfg.name!r} from {shown} (KeyError: {err})") from None
        raise TuningError(f"no study {cfg.name!r} in {shown}; run some trials first (--trials N)") from None
    except Exception as err:  # a storage that opened but cannot be read: corrupt tables, say
        raise TuningError(f"cannot read study {cfg.name!r} from {shown} ({type(err).__name__}: {err})") from None
    _check_identity(study, cfg)
    fail_stale_trials(study, storage)
    return study


def fresh_seed() -> int:
    """A sampler seed of its own for each worker, so that workers sharing a study never sample in lockstep."""
    return secrets.randbits(32)


def counted(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether ``trial`` is one of its study's finished trials: COMPLETE, or PRUNED by the pruner (a trial marked
    :data:`NOT_COUNTED` is not: a stop cut it short, or it was surplus). FAIL and RUNNING trials are not finished."""
    import optuna

    state = optuna.trial.TrialState
    return trial.state == state.COMPLETE or (trial.state == state.PRUNED and NOT_COUNTED not in trial.user_attrs)


def finished_trials(study: optuna.Study) -> int:
    """How many of the study's trials count towards ``TuneConfig.trials`` (see :func:`counted`)."""
    return sum(counted(t) for t in study.get_trials(deepcopy=False))


UNNAMED_WAIT_S = 5.0
"""How long a worker waits for a RUNNING trial to name its worker (which a live one does milliseconds after asking
for it) before taking it for the trial of a worker killed in between, which will never finish."""


def _on_its_way(trial: optuna.trial.FrozenTrial) -> bool:
    """A RUNNING trial that names its worker: a live one's, as :func:`load_study` fails those of dead workers. A
    RUNNING trial without a name may be a worker's that was killed right after asking for it: it never finishes."""
    import optuna

    return trial.state == optuna.trial.TrialState.RUNNING and "worker" in trial.user_attrs


def _claimed(trials: list[optuna.trial.FrozenTrial]) -> int:
    """The trials that are finished or on their way (see :func:`counted` and :func:`_on_its_way`)."""
    return sum(counted(t) or _on_its_way(t) for t in trials)


class _Filling:
    """``run`` as the trial function of a run that fills ``study`` up to ``target`` finished trials.

    Trial numbers give every worker the same order, so a trial is surplus when the trials numbered before it,
    finished or on their way, already make ``target`` (workers that started a trial at the same moment): it is pruned
    before it samples anything, marked :data:`NOT_COUNTED`, and its worker stops. So workers sharing a study never
    finish more than ``target`` trials together. A trial cut short by a stop (:class:`TuningInterrupted`) is pruned
    and marked too, never failed and never completed with a partial value; the loop ends there, and :func:`tune`,
    which has seen the signal, raises the stop.
    """

    def __init__(self, study: optuna.Study, run: Callable[[optuna.Trial], float | tuple[float, ...]],
                 target: int) -> None:
        self.study, self.run, self.target = study, run, target
        self.last: optuna.Trial | None = None
        """The latest trial this worker started (:meth:`prune_if_running` after a forced stop)."""
        self.orphans: set[int] = set()
        """RUNNING trials that never named their worker (:meth:`_ahead`)."""

    def __call__(self, trial: optuna.Trial) -> float | tuple[float, ...]:
        import optuna

        self.last = trial
        try:
            trial.set_user_attr("worker", worker_id())  # first: the others count this trial as on its way
            if self._ahead(trial.number) >= self.target:
                trial.set_user_attr(NOT_COUNTED, f"surplus: the study already had {self.target} trials")
                self.study.stop()
                raise optuna.TrialPruned(f"surplus: the study already had {self.target} trials")
            return self.run(trial)
        except TuningInterrupted as stop:
            optuna.logging.set_verbosity(optuna.logging.WARNING)  # the stop's own message says it (tune restores)
            self.study.stop()  # no further trial, even if the signal came before the loop began
            trial.set_user_attr(NOT_COUNTED, f"stopped by {stop.signal_name}")
            raise optuna.TrialPruned(f"stopped by {stop.signal_name}") from None

    def _ahead(self, number: int) -> int:
        """The trials numbered below ``number`` that are finished or on their way. A RUNNING one that names no worker
        yet is waited for (another worker asked for it a moment ago), up to :data:`UNNAMED_WAIT_S`."""
        import optuna

        running, waited = optuna.trial.TrialState.RUNNING, time.monotonic() + UNNAMED_WAIT_S
        while True:
            trials = [t for t in self.study.get_trials(deepcopy=False) if t.number < number]
            unnamed = {t.number for t in trials if t.state == running and "worker" not in t.user_attrs}
            if not unnamed - self.orphans or time.monotonic() > waited:
                self.orphans |= unnamed  # never named: their workers died; not waited for again
                return _claimed(trials)
            time.sleep(0.05)

    def prune_if_running(self, signal_name: str) -> None:
        """Mark pruned (and not counted) this worker's latest trial if a forced stop (a second signal, inside Optuna's
        own code) left it RUNNING."""
        import optuna

        running = optuna.trial.TrialState.RUNNING
        if self.last is not None and any(t.number == self.last.number
                                         for t in self.study.get_trials(deepcopy=False, states=(running,))):
            self.last.set_user_attr(NOT_COUNTED, f"stopped by {signal_name}")
            self.study.tell(self.last, state=optuna.trial.TrialState.PRUNED, skip_if_finished=True)


def _stop_when_full(target: int) -> Callable[[optuna.Study, optuna.trial.FrozenTrial], None]:
    """An ``optimize`` callback: no further trial once the study's trials finished or on their way make ``target``."""

    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if _claimed(study.get_trials(deepcopy=False)) >= target:
            study.stop()

    return callback


def tune(cfg: TuneConfig, progress: bool = True) -> optuna.Study:
    """Run trials until the (possibly shared, possibly resumed) study holds ``cfg.trials`` finished ones; return it.

    Finished means COMPLETE, or PRUNED by the pruner (:func:`finished_trials`): a run adds only the missing trials,
    at most that many, so re-running a stopped run finishes the count, and workers sharing a study stop together at
    ``cfg.trials`` (a trial that other workers' running trials make surplus is not run). ``cfg.trials == 0`` opens
    an existing study without creating one. A trial that raises is recorded as failed (not counted: a re-run
    retries it) and the study goes on. SIGINT or SIGTERM stops the run before the running trial's next episode
    (a second signal at once), stores that trial as pruned and not counted, and raises :class:`TuningInterrupted`
    (``exit_status`` 130 or 143); every finished trial is in the storage.
    Without ``cfg.sampler_seed`` this worker draws a fresh seed, recorded on its trials.
    """
    import optuna

    if cfg.sampler_seed is None:
        cfg = replace(cfg, sampler_seed=fresh_seed())
    verbosity = optuna.logging.get_verbosity()
    with StopOnSignals() as stop:
        study = load_study(cfg, create=cfg.trials > 0)
        stop.study = study
        filling = _Filling(study, objective_function(cfg, get_objective(cfg.objective), tuning_workload(cfg),
                                                     stop.checkpoint), cfg.trials)
        try:
            stop.checkpoint()  # a signal while the study opened
            missing = cfg.trials - _claimed(study.get_trials(deepcopy=False))
            if missing > 0:
                study.optimize(filling, n_trials=missing, catch=(Exception,), callbacks=[_stop_when_full(cfg.trials)],
                               show_progress_bar=progress, gc_after_trial=False)
                stop.checkpoint()  # a signal between trials stopped the loop
        except TuningInterrupted as err:
            try:
                filling.prune_if_running(err.signal_name)
            except Exception as problem:  # mid-transaction after a forced stop: a resume fails the trial later
                log.warning("could not mark this worker's running trial pruned: %s", problem)
            err.study = study
            raise
        finally:
            optuna.logging.set_verbosity(verbosity)
    return study


def best_params(study: optuna.Study) -> dict[str, Any]:
    """The best trial's parameters (for multi-objective studies: the Pareto trial with the best first value)."""
    import optuna

    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not complete:
        raise TuningError(f"study {study.study_name!r} has no completed trial to report on")
    if len(study.directions) == 1:
        return dict(study.best_trial.params)
    sign = 1 if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else -1
    return dict(max(study.best_trials, key=lambda t: sign * t.values[0]).params)


def write_params(policy: str, params: dict[str, Any], path: Path, note: str = "",
                 record: dict[str, Any] | None = None) -> None:
    """A params file that ``servegym run/compare --params FILE`` accepts, with the study's data record (what it
    tuned on, :func:`~servegym.benchmark.provenance.data_record`) when it has one."""
    from servegym.benchmark.provenance import RECORD

    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"policy": policy, "params": params, "note": note, **({RECORD: record} if record else {})}
    path.write_text(json.dumps(data, indent=2) + "\n")


def params_record(path: str | Path | None) -> dict[str, Any] | None:
    """The data record of a params file (None: the file has none, or there is no file)."""
    from servegym.benchmark.provenance import RECORD

    if path is None or not Path(path).is_file():
        return None
    try:
        data = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    record = data.get(RECORD) if isinstance(data, dict) else None
    return record if isinstance(record, dict) else None


def study_record(cfg: TuneConfig) -> dict[str, Any]:
    """What a study tunes on: its task, split and workload, and its tuning and evaluation seeds."""
    from servegym.benchmark.provenance import data_record

    return data_record(cfg.env.get("task"), cfg.env.get("split"), cfg.workload,
                       {"tuning": [TUNING_SEED_BASE, TUNING_SEED_BASE + cfg.seeds], "evaluation": [0, cfg.eval_seeds]})


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
