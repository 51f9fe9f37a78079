"""Experiment files: which policies, workloads, seeds and engine settings a comparison runs."""

from __future__ import annotations

import re
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from servegym.backends import load_profile
from servegym.engine import EngineConfig
from servegym.engine.config import LENGTH_MODES
from servegym.envs.tasks import SPLITS, TASKS, Task
from servegym.policies import POLICIES, make_policy
from servegym.pool import PoolConfig
from servegym.validation import COUNT_LIMITS, count
from servegym.workloads import (
    WORKLOADS,
    Choice,
    Gamma,
    MarkovModulated,
    Poisson,
    RangeMix,
    SyntheticWorkload,
    TraceWorkload,
    Workload,
    bundled_trace,
    make_workload,
)
from servegym.workloads.scenarios import PAIRED_LENGTHS


class ExperimentError(ValueError):
    """An experiment file is malformed; the message names the file and the key."""


MAX_SEEDS = COUNT_LIMITS["seeds"][0]
"""Most seeds one experiment may run (``servegym.validation``'s rule for every seed count)."""


def check_seed_count(number: int) -> None:
    """How many seeds a grid runs: the shared count rule (at least one, at most :data:`MAX_SEEDS`)."""
    count("seeds", number, "seeds")


@dataclass(frozen=True)
class PolicySpec:
    name: str
    params: dict[str, Any] = field(default_factory=dict)
    label: str = ""

    @property
    def title(self) -> str:
        return self.label or self.name


@dataclass(frozen=True)
class WorkloadSpec:
    label: str
    source: str | dict[str, Any]
    """A registered workload name, or an inline description (see :func:`build_workload`)."""
    length_mode: str | None = None
    policy_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per-policy parameter overrides for this workload (e.g. flow control's budget for its arrival rate)."""

    def build(self) -> Workload:
        return build_workload(self.source, self.label)


@dataclass(frozen=True)
class Experiment:
    name: str
    policies: tuple[PolicySpec, ...]
    workloads: tuple[WorkloadSpec, ...]
    seeds: tuple[int, ...] = tuple(range(10))
    description: str = ""
    regime: str = ""
    """The regime the experiment runs in and why (load against its bounds, what an eviction costs), stated in the
    file before any result; the reproduction report prints it beside the verdicts."""
    profile: str | None = None
    """One profile for every workload; None: each named workload's own (``profile_for``), else the default."""
    engine: dict[str, Any] = field(default_factory=dict)
    pool: dict[str, Any] = field(default_factory=dict)
    max_steps: int = 200_000
    ttft_slo_s: float = 2.0
    itl_slo_s: float = 0.2
    task: str | None = None
    """A benchmark task (``servegym tasks``) whose env every run plays: its workload (unless ``workloads`` name
    others), profile, engine, pool, reward and limits, with ``engine``/``pool``/``profile`` on top. A routing task
    (``cluster-routing``) is played by router policies, each deciding which replica serves an arrival; None: the
    plain serving env, played by admission policies."""
    split: str = "test"
    """With ``task``: its held-out test data or its training data (``train``)."""

    def __post_init__(self) -> None:
        check_seed_count(len(self.seeds))

    def with_seeds(self, seeds: int) -> Experiment:
        check_seed_count(seeds)
        return replace(self, seeds=tuple(range(seeds)))


TOP_KEYS = {"name", "description", "regime", "profile", "seeds", "engine", "pool", "max_steps", "policies", "workloads",
            "length_modes", "ttft_slo_s", "itl_slo_s", "task", "split"}


NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
"""An experiment name is a plain folder name: it must not escape the output folder."""


def experiment_from_dict(data: Any, source: str = "<experiment>", base: Path | None = None) -> Experiment:
    """Validate a parsed experiment file; errors name ``source`` and the key. Relative profile and trace paths
    resolve against ``base`` (the file's folder), not the working directory."""
    def fail(message: str) -> ExperimentError:
        return ExperimentError(f"{source}: {message}")

    if not isinstance(data, dict):
        raise fail("expected a mapping at the top level")
    unknown = set(data) - TOP_KEYS
    if unknown:
        raise fail(f"unknown key(s) {sorted(unknown)}; allowed: {sorted(TOP_KEYS)}")
    for key in ("name", "policies", *(() if "task" in data else ("workloads",))):
        if key not in data:
            raise fail(f"missing key {key!r}")
    task, split = _task(data, fail)
    if not isinstance(data["name"], str) or not NAME_PATTERN.fullmatch(data["name"]):
        raise fail(f"name must be a plain folder name (letters, digits, '.', '_', '-'), got {data['name']!r}")
    seeds = _seeds(data.get("seeds", 10), fail)
    policies = tuple(_policy(item, fail) for item in _list(data["policies"], "policies", fail))
    titles = [p.title for p in policies]
    if len(set(titles)) != len(titles):
        dupes = sorted({t for t in titles if titles.count(t) > 1})
        raise fail(f"policies: labels must be unique (each is one row of the results), repeated: {dupes}; give "
                   "repeats a distinct label")
    _check_decisions(policies, task, fail)
    modes = data.get("length_modes", [None])
    if not isinstance(modes, list) or not modes or any(m is not None and m not in LENGTH_MODES for m in modes):
        raise fail(f"length_modes must be a list of known/predicted/unknown, got {modes!r}")
    workloads = []
    listed = data["workloads"] if "workloads" in data else [{"label": task.name, "name": task.workload_for(split)}]
    for item in _list(listed, "workloads", fail):
        label, src, params = _workload(item, fail)
        if isinstance(src, dict) and isinstance(src.get("trace"), dict):
            path = src["trace"].get("path", "bundled")
            if path != "bundled":
                src = {**src, "trace": {**src["trace"], "path": _resolve(str(path), base)}}
        for mode in modes:
            workloads.append(WorkloadSpec(label if mode is None else f"{label}/{mode}", src, mode, params))
    labels = [w.label for w in workloads]
    if len(set(labels)) != len(labels):
        raise fail(f"workload labels must be unique, got {labels}")
    for key, config in (("engine", EngineConfig), ("pool", PoolConfig)):
        value = data.get(key, {})
        if not isinstance(value, dict):
            raise fail(f"{key} must be a mapping")
        _check_config(key, config, value, fail)
    max_steps = data.get("max_steps", task.max_steps if task is not None else 200_000)
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise fail(f"max_steps must be a positive int, got {max_steps!r}")
    for key in ("ttft_slo_s", "itl_slo_s"):
        value = data.get(key, 1.0)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise fail(f"{key} must be a number > 0, got {value!r}")
    profile = data.get("profile")
    if profile is not None:
        profile = _resolve(str(profile), base) if str(profile).endswith(".json") else str(profile)
        try:
            load_profile(profile)
        except (ValueError, OSError) as err:
            raise fail(f"profile: {err}") from None
    experiment = Experiment(
        name=str(data["name"]), policies=policies, workloads=tuple(workloads), seeds=seeds,
        description=str(data.get("description", "")), regime=" ".join(str(data.get("regime", "")).split()),
        profile=profile,
        engine=dict(data.get("engine", {})), pool=dict(data.get("pool", {})), max_steps=max_steps,
        ttft_slo_s=float(data.get("ttft_slo_s", 2.0)), itl_slo_s=float(data.get("itl_slo_s", 0.2)),
        task=task.name if task is not None else None, split=split,
    )
    for w in experiment.workloads:
        try:
            check_workload(w)
        except (ValueError, TypeError, KeyError, OSError) as err:
            raise fail(f"workload {w.label!r}: {err}") from None
    return experiment


def _task(data: dict[str, Any], fail) -> tuple[Task | None, str]:
    """The experiment's ``task`` (None without one) and ``split``; a mixture task is refused (each episode is
    another component's, no one grid cell)."""
    name = data.get("task")
    if name is None:
        if "split" in data:
            raise fail("split picks a task's data: give task too")
        return None, "test"
    if name not in TASKS:
        raise fail(f"unknown task {name!r}; tasks: {sorted(TASKS)}")
    task = TASKS[name]
    if task.is_mixture:
        raise fail(f"task {name!r} is a mixture of {list(task.components)}; compare its components (or run "
                   "servegym bench --tasks mixture)")
    split = data.get("split", "test")
    if split not in SPLITS:
        raise fail(f"split must be one of {list(SPLITS)}, got {split!r}")
    return task, split


def _check_decisions(policies: tuple[PolicySpec, ...], task: Task | None, fail) -> None:
    """Every policy decides what the runs' env asks: the routing env's replica on a routing task, an admission
    everywhere else."""
    from servegym.benchmark.bench import Entry, entry_decision

    wanted = task.decision if task is not None else "admission"
    routing = sorted(name for name, t in TASKS.items() if t.decision == "route")
    for spec in policies:
        decision = entry_decision(Entry(spec.title, spec.name, spec.params))
        if decision == wanted:
            continue
        if decision == "route":
            where = f"task {task.name} decides admissions" if task is not None else "the experiment has no task"
            raise fail(f"policy {spec.title!r} routes arrivals among replicas, but {where}: give a routing task "
                       f"(task: {' or '.join(routing)})")
        raise fail(f"policy {spec.title!r} decides admissions, but task {task.name} decides routes: give router "
                   "policies (servegym policies lists the router-* ones)")


def check_workload(workload: WorkloadSpec) -> None:
    """Build the workload and draw one episode of it, so that a bad trace (empty, unsorted, malformed) or a bad
    distribution fails here, in the process that reads the experiment, and not in every worker."""
    workload.build().sample(np.random.default_rng(0))


_YAML_EXPONENT_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
"""``1e9``, ``2.5e-3``, ``1E+6``: floats to YAML 1.2 and to Python, strings to PyYAML's YAML 1.1 resolver (it wants
a dot and a signed exponent)."""


def _yaml_loader() -> type:
    import yaml

    class Loader(yaml.SafeLoader):
        """PyYAML's safe loader that also reads exponent-only floats (``rate: 1e9``) as numbers."""

    Loader.add_implicit_resolver("tag:yaml.org,2002:float", _YAML_EXPONENT_FLOAT, list("-+0123456789"))
    return Loader


def load_experiment(path: str | Path) -> Experiment:
    import yaml

    path = Path(path)
    if path.is_dir():
        raise ExperimentError(f"experiment file {path} is a folder; give a .yaml file in it")
    if not path.is_file():
        raise ExperimentError(f"experiment file {path} does not exist")
    try:
        data = yaml.load(path.read_text(), Loader=_yaml_loader())  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError as err:
        raise ExperimentError(f"{path}: invalid YAML: {' '.join(str(err).split())}") from None
    return experiment_from_dict(data, str(path), path.resolve().parent)


def _resolve(path: str, base: Path | None) -> str:
    """A relative path against the experiment file's folder (absolute paths and names stay)."""
    if base is None or Path(path).is_absolute():
        return path
    return str(base / path)


def _seeds(value: Any, fail) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        try:
            check_seed_count(value)
        except ValueError as err:
            raise fail(str(err)) from None
        return tuple(range(value))
    if not (isinstance(value, list) and value and all(isinstance(s, int) and not isinstance(s, bool)
                                                       for s in value)):
        raise fail(f"seeds must be a positive int or a non-empty list of ints, got {value!r}")
    try:
        check_seed_count(len(value))
    except ValueError as err:
        raise fail(str(err)) from None
    if min(value) < 0:
        raise fail(f"seeds must be >= 0, got {min(value)}")
    if len(set(value)) != len(value):
        raise fail(f"seeds must be distinct (a repeat would be counted twice), repeated: "
                   f"{sorted({s for s in value if value.count(s) > 1})}")
    return tuple(value)


def _check_config(key: str, config: type, value: dict[str, Any], fail) -> None:
    """Build the engine or pool config now, so a typo fails at load time with the file's name."""
    allowed = {f.name for f in fields(config)}
    unknown = set(value) - allowed
    if unknown:
        raise fail(f"{key}: unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    try:
        config(**value)
    except (TypeError, ValueError) as err:
        raise fail(f"{key}: {err}") from None


def _list(value: Any, key: str, fail) -> list:
    if not isinstance(value, list) or not value:
        raise fail(f"{key} must be a non-empty list")
    return value


def _policy(item: Any, fail) -> PolicySpec:
    if isinstance(item, str):
        item = {"name": item}
    if not isinstance(item, dict) or "name" not in item or set(item) - {"name", "params", "label"}:
        raise fail(f"a policy is a name or {{name, params, label}}, got {item!r}")
    if item["name"] not in POLICIES and not str(item["name"]).startswith("rl:"):
        raise fail(f"unknown policy {item['name']!r}; registered: {sorted(POLICIES)} (or rl:RUN_DIR)")
    spec = PolicySpec(item["name"], dict(item.get("params", {})), str(item.get("label", "")))
    try:
        make_policy(spec.name, **spec.params)
    except (TypeError, ValueError, OSError) as err:
        raise fail(f"policy {spec.title!r}: {err}") from None
    return spec


def _workload(item: Any, fail) -> tuple[str, str | dict[str, Any], dict[str, dict[str, Any]]]:
    if isinstance(item, str):
        item = {"label": item, "name": item}
    if not isinstance(item, dict) or "label" not in item:
        raise fail(f"a workload is a registered name or a mapping with a label, got {item!r}")
    params = item.get("policy_params", {})
    if not isinstance(params, dict) or not all(isinstance(v, dict) for v in params.values()):
        raise fail(f"workload {item['label']!r}: policy_params must map policy names to parameter mappings")
    for name in params:
        if name not in POLICIES:
            raise fail(f"workload {item['label']!r}: policy_params names unknown policy {name!r}")
    if "name" in item:
        if item["name"] not in WORKLOADS:
            raise fail(f"unknown workload {item['name']!r}; named ones: {sorted(WORKLOADS)}")
        return str(item["label"]), str(item["name"]), params
    return str(item["label"]), {k: v for k, v in item.items() if k not in ("label", "policy_params")}, params


def _keys(spec: Any, key: str, required: set[str], optional: set[str] = frozenset()) -> dict[str, Any]:
    """``spec`` as a mapping with exactly these keys (besides ``kind``); errors name ``key`` and the keys."""
    if not isinstance(spec, dict):
        raise ValueError(f"{key} must be a mapping, got {spec!r}")
    given = set(spec) - {"kind"}
    if given - required - optional or required - given:
        raise ValueError(f"{key}: expected key(s) {sorted(required)}" + (f" and optionally {sorted(optional)}"
                         if optional else "") + f", got {sorted(given)}")
    return {k: v for k, v in spec.items() if k != "kind"}


def _length_dist(spec: Any, key: str):
    if not isinstance(spec, dict) or "kind" not in spec:
        raise ValueError(f"{key} must be a mapping with a kind (choice, range_mix, fixed)")
    kind = spec["kind"]
    if kind == "choice":
        args = _keys(spec, key, {"values", "probs"})
        return Choice(tuple(_items(args["values"], f"{key}.values")), tuple(_items(args["probs"], f"{key}.probs")))
    if kind == "range_mix":
        args = _keys(spec, key, {"ranges", "probs"})
        ranges = tuple(tuple(_items(r, f"{key}.ranges[{i}]")) for i, r in enumerate(_items(args["ranges"],
                                                                                          f"{key}.ranges")))
        return RangeMix(ranges, tuple(_items(args["probs"], f"{key}.probs")))
    if kind == "fixed":
        return Choice((_keys(spec, key, {"value"})["value"],), (1.0,))
    raise ValueError(f"{key}.kind {kind!r} is not one of choice, range_mix, fixed")


def _items(value: Any, key: str) -> list:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{key} must be a non-empty list, got {value!r}")
    return value


def _arrivals(spec: Any):
    if not isinstance(spec, dict) or "kind" not in spec:
        raise ValueError("arrivals must be a mapping with a kind (poisson, gamma, mmpp)")
    builders = {"poisson": Poisson, "gamma": Gamma, "mmpp": MarkovModulated}
    kind = spec["kind"]
    if kind not in builders:
        raise ValueError(f"arrivals.kind {kind!r} is not one of {sorted(builders)}")
    names = {f.name for f in fields(builders[kind])}
    optional = {f.name for f in fields(builders[kind]) if f.default is not MISSING}
    return builders[kind](**_keys(spec, f"arrivals ({kind})", names - optional, optional))


def build_workload(source: str | dict[str, Any], label: str = "") -> Workload:
    """A workload from a registered name or an inline description.

    In an experiment file a workload is a registered name, ``{label, name, policy_params}``, or an inline
    description with a ``label`` (and optional ``policy_params``).
    Inline: ``{trace: {path: bundled | PATH, time_scale, duration_s, max_requests}}``, or
    ``{arrivals: {kind: poisson|gamma|mmpp, ...}, duration_s, max_requests, prompt: LEN, output: LEN}`` with
    ``LEN`` one of ``{kind: choice, values, probs}``, ``{kind: range_mix, ranges, probs}``,
    ``{kind: fixed, value}``; or ``lengths: gsm8k | azure-conv`` (pairs drawn jointly) instead of prompt and output.
    """
    if isinstance(source, str):
        return make_workload(source)
    if "trace" in source:
        allowed = {f.name for f in fields(TraceWorkload)}
        trace = _keys(source["trace"], "trace", set(), allowed)
        path = trace.pop("path", "bundled")
        path = str(bundled_trace()) if path == "bundled" else path
        if not Path(path).is_file():
            raise ValueError(f"trace file {path} does not exist")
        return TraceWorkload(path, **trace)
    unknown = set(source) - {"arrivals", "duration_s", "max_requests", "prompt", "output", "lengths"}
    if unknown:
        raise ValueError(f"unknown workload key(s) {sorted(unknown)}")
    arrivals = _arrivals(source.get("arrivals"))
    common = {"duration_s": source.get("duration_s", 60.0), "max_requests": source.get("max_requests")}
    if "lengths" in source:
        if source["lengths"] not in PAIRED_LENGTHS:
            raise ValueError(f"lengths {source['lengths']!r} is not one of {sorted(PAIRED_LENGTHS)}")
        return SyntheticWorkload(arrivals, paired=PAIRED_LENGTHS[source["lengths"]](), **common)
    return SyntheticWorkload(arrivals, prompt=_lengths(source.get("prompt"), "prompt"),
                             output=_lengths(source.get("output"), "output"), **common)


def _lengths(spec: Any, key: str):
    """A length distribution; errors start with ``key`` (``prompt`` or ``output``)."""
    try:
        return _length_dist(spec, key)
    except ValueError as err:
        raise ValueError(err if str(err).startswith(key) else f"{key}: {err}") from None
