"""Benchmark tasks: named, frozen settings of the serving env with a seed split (``gym.make(..., task=NAME)``).

A task fixes everything that defines the problem an agent solves: the workload, the GPU profile, the engine and
pool, the reward and the episode limits. Its seeds are split three ways, disjoint by construction: training
episodes draw from :data:`TRAIN_SEEDS`, periodic evaluation during training uses :data:`VALIDATION_SEEDS`, and
results are reported on the frozen :data:`TEST_SEEDS` only (``servegym bench``). A task drawn from a trace also
splits its data: ``split="test"`` draws windows from a held-out part of the trace (``test_workload``; for
long-context its middle 35-65%) and ``split="train"`` (training and validation) from the rest, so no test request
is ever trained on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

TRAIN_SEEDS = range(0, 100_000)
"""Seeds of training episodes (:class:`~servegym.rl.wrappers.TrainSeeds` cycles through them)."""
VALIDATION_SEEDS = tuple(range(100_000, 100_005))
"""Seeds of the periodic evaluations that pick ``best_model.zip``."""
TEST_SEEDS = tuple(range(900_000, 900_030))
"""The frozen test set: the seeds every leaderboard row is measured on. Never train or select on these."""


DECISIONS = ("admission", "route")
"""What a task's policies decide (:attr:`Task.decision`)."""


def _frozen(mapping: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class Task:
    """One benchmark task: the env's arguments, the limits of an episode, and what makes it hard."""

    name: str
    summary: str
    """What makes the task hard (or, for a control task, why it is not)."""
    workload: str = "medium"
    """The workload of training and validation episodes (``split="train"``)."""
    test_workload: str | None = None
    """The workload of test episodes (``split="test"``), held out from ``workload``'s data; None: the same."""
    legacy_workload: str | None = None
    """What ``servegym/Serving-v0`` drew every episode from (None: ``workload``); kept so v0 results reproduce."""
    profile: str | None = None
    engine: Mapping[str, Any] = field(default_factory=_frozen)
    pool: Mapping[str, Any] = field(default_factory=_frozen)
    reward: str = "latency"
    ranking: str = "episode_return"
    """What the leaderboard ranks by (higher is better): the episode return, which the reward sums to. For the
    latency reward it is minus the request-seconds in the system, unfinished requests counted to the episode's
    end, minus the truncation penalty per unserved request when the env cut the episode short."""
    max_steps: int = 20_000
    idle_guard_steps: int | None = 200
    """Truncate (with the env's truncation penalty) after this many consecutive steps in which requests wait
    and nothing runs: a policy that stops admitting cannot run the episode out."""
    components: tuple[str, ...] = ()
    """For a mixture task: the tasks it samples among, uniformly, per episode."""
    decision: str = "admission"
    """What a policy or agent decides: ``"admission"`` (the serving env) or ``"route"`` (which replica serves each
    arrival: the routing env, :class:`~servegym.envs.routing.RoutingEnv`)."""
    admission: str = "fcfs"
    """For a routing task: the hand-coded policy that admits requests inside every replica."""

    def __post_init__(self) -> None:
        if self.decision not in DECISIONS:
            raise ValueError(f"decision must be one of {DECISIONS}, got {self.decision!r}")
        object.__setattr__(self, "engine", _frozen(self.engine))
        object.__setattr__(self, "pool", _frozen(self.pool))

    @property
    def is_mixture(self) -> bool:
        return bool(self.components)

    def workload_for(self, split: str | None) -> str:
        """The workload of ``split`` (``train`` or ``test``); ``None``: the v0 legacy one, the same for both."""
        if split is None:
            return self.legacy_workload or self.workload
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return self.test_workload if split == "test" and self.test_workload else self.workload

    def env_kwargs(self, split: str | None = "train") -> dict[str, Any]:
        """The serving env's arguments for this task and data split (a mixture task has one set per
        component)."""
        if self.is_mixture:
            raise ValueError(f"task {self.name!r} is a mixture of {self.components}; build each component")
        kwargs = {"workload": self.workload_for(split), "engine": dict(self.engine), "pool": dict(self.pool),
                  "reward": self.reward, "max_steps": self.max_steps, "idle_guard_steps": self.idle_guard_steps}
        if self.profile is not None:
            kwargs["profile"] = self.profile
        return kwargs


SPLITS = ("train", "test")
"""Data splits: ``train`` for training and validation episodes, ``test`` for the reported ones."""
PREDICTED = {"length_mode": "predicted"}

TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task("relaxed", "a control task: Poisson 16 req/s, under half the A100's capacity; every sensible policy "
             "scores the same, so a learner must simply not get in the way", workload="low", engine=PREDICTED),
        Task("memory-tight", "200-2000-token prompts on an A40's 53k KV tokens at 7 req/s: FCFS preempts about 150 "
             "times an episode; the order of admission decides who recomputes", workload="tight-memory",
             profile="a40-llama2-7b", engine=PREDICTED),
        Task("long-context", "random 120 s windows of the Azure code trace (median prompt 1.5k, p99 7.4k tokens) "
             "on an A100 whose KV cache is capped at 32k tokens: long prompts crowd out short ones and preempt; "
             "test windows come from the held-out middle 35-65% of the trace, training windows from the rest",
             workload="azure-code-window-train", test_workload="azure-code-window-test",
             legacy_workload="azure-code-window", profile="a100-llama3-8b",
             engine={**PREDICTED, "num_kv_blocks": 2048}),
        Task("serverless-burst", "bursts of 90 req/s reach a pool of 4 containers that start cold, go cold after "
             "2 s idle and take 13 s to load; the agent decides for whichever container's iteration ends first",
             workload="burst", engine=PREDICTED,
             pool={"num_containers": 4, "keep_alive_s": 2.0, "start_cold": True}),
        Task("slo-goodput", "Poisson 47 req/s, 1.35x the A100's capacity; the reward counts requests that meet "
             "TTFT <= 2 s and mean ITL (TPOT) <= 0.2 s, so some requests must be sacrificed for others",
             workload="high", engine=PREDICTED, reward="slo_goodput"),
        Task("prefix-reuse", "random 600 s windows of the Mooncake conversation trace (12k-token prompts, multi-turn "
             "sessions sharing prefixes), one replica's sessions in 5, on an A100 with prefix caching: which queued "
             "prompt to prefill decides what stays cached and what is computed again; test windows hold only "
             "sessions that start in the held-out middle 35-65% of the trace", workload="mooncake-conversation",
             test_workload="mooncake-conversation-test", profile="a100-llama3-8b",
             engine={**PREDICTED, "prefix_caching": True}, max_steps=200_000),
        Task("cluster-routing", "random 300 s windows of the whole Mooncake conversation trace at its own rate "
             "(3.4 req/s of 12k-token prompts, multi-turn sessions sharing prefixes) reach 8 A100 replicas with "
             "prefix caching; the decision is which replica serves each arrival (FCFS admits inside each): a "
             "replica that caches the session's prefix computes less, a loaded one makes it wait; test windows hold "
             "only sessions that start in the held-out middle 35-65% of the trace", workload="mooncake-cluster",
             test_workload="mooncake-cluster-test", profile="a100-llama3-8b",
             engine={**PREDICTED, "prefix_caching": True}, pool={"num_containers": 8}, max_steps=1_000_000,
             decision="route"),
        Task("mixture", "each episode is drawn from relaxed, memory-tight or long-context: one policy for "
             "different GPUs, loads and lengths (generalisation)", components=("relaxed", "memory-tight",
                                                                              "long-context")),
    )
}
"""The benchmark tasks, by name."""


def get_task(name: str | Task) -> Task:
    if isinstance(name, Task):
        return name
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; choose from {sorted(TASKS)}") from None
