"""Benchmark tasks: named, frozen settings of the serving env with a seed split (``gym.make(..., task=NAME)``).

A task fixes everything that defines the problem an agent solves: the workload, the GPU profile, the engine and
pool, the reward and the episode limits. Its seeds are split three ways, disjoint by construction: training
episodes draw from :data:`TRAIN_SEEDS`, periodic evaluation during training uses :data:`VALIDATION_SEEDS`, and
results are reported on the frozen test seeds only (:attr:`Task.test_seeds`, ``servegym bench``). A task drawn
from a trace also splits its data: ``split="test"`` replays a held-out part of the trace (``test_workload``: its
middle 35%) and ``split="train"`` (training and validation) draws windows from the rest, so no test request is ever
trained on.

Test episodes are independent too. A trace task's test episodes are disjoint tiles of the held-out part (seed ``s``
replays tile ``s mod n``), so its ``n`` consecutive test seeds share no request, and ``n`` is what the held-out part
holds: 10 for every trace task, which therefore reports on ``TEST_SEEDS[:10]``. Serving-v1 drew 30 random windows
there instead, which overlapped (30 long-context episodes held 3,226 distinct requests in 11,173 rows). The other
tasks draw every request afresh (Poisson arrivals, lengths from parametric mixes), so their 30 seeds are 30
independent episodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from servegym import VERSION

TRAIN_SEEDS = range(0, 100_000)
"""Seeds of training episodes (:class:`~servegym.rl.wrappers.TrainSeeds` cycles through them)."""
VALIDATION_SEEDS = tuple(range(100_000, 100_005))
"""Seeds of the periodic evaluations that pick ``best_model.zip``."""
TEST_SEEDS = tuple(range(900_000, 900_030))
"""The frozen test seeds, of which each task reports on its own :attr:`Task.test_seeds`. Never train or select on
these."""
TILED_TEST_SEEDS = TEST_SEEDS[:10]
"""The test seeds of a trace task: one per tile of its held-out data (tile ``seed mod 10``; tests check each task's
test workload holds exactly this many tiles)."""
MIXTURE_TEST_SEEDS = tuple(seed for seed in TEST_SEEDS if seed not in (900_016, 900_017, 900_021))
"""The mixture's test seeds: :data:`TEST_SEEDS` but three whose episode would replay a long-context tile that an
earlier seed replays (the mixture draws long-context for 900,016, 900,017 and 900,021, and its component replays the
seed: tiles 6, 7 and 1, as for 900,006, 900,007 and 900,001). 27 episodes, 7 of them long-context."""


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
    test_seeds: tuple[int, ...] = TEST_SEEDS
    """The seeds the task reports on: :data:`TEST_SEEDS` where every request is drawn afresh, as many as the held-out
    data holds disjoint tiles where it is replayed (no request in two test episodes)."""
    v1_workloads: tuple[str, str] | None = None
    """The (train, test) workloads of ``servegym/Serving-v1`` where v2 changed them (None: the same); kept so v1
    results reproduce."""
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
        if not self.test_seeds or not set(self.test_seeds) <= set(TEST_SEEDS):
            raise ValueError(f"test_seeds must be some of TEST_SEEDS, got {self.test_seeds!r}")
        object.__setattr__(self, "test_seeds", tuple(self.test_seeds))
        object.__setattr__(self, "engine", _frozen(self.engine))
        object.__setattr__(self, "pool", _frozen(self.pool))

    @property
    def is_mixture(self) -> bool:
        return bool(self.components)

    def workload_for(self, split: str | None, version: int = VERSION) -> str:
        """The workload of ``split`` (``train`` or ``test``) in env ``version``; ``None`` or version 0: the v0
        legacy one, the same for both."""
        if split is None or version == 0:
            return self.legacy_workload or self.workload
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if version == 1 and self.v1_workloads:
            return self.v1_workloads[SPLITS.index(split)]
        return self.test_workload if split == "test" and self.test_workload else self.workload

    def env_kwargs(self, split: str | None = "train", version: int = VERSION) -> dict[str, Any]:
        """The serving env's arguments for this task, data split and env version (a mixture task has one set per
        component)."""
        if self.is_mixture:
            raise ValueError(f"task {self.name!r} is a mixture of {self.components}; build each component")
        kwargs = {"workload": self.workload_for(split, version), "engine": dict(self.engine), "pool": dict(self.pool),
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
             "scores the same, so a learner must simply not get in the way; test split: 30 seeds, every request "
             "drawn afresh", workload="low", engine=PREDICTED),
        Task("memory-tight", "200-2000-token prompts on an A40's 53k KV tokens at 7 req/s: FCFS preempts about 150 "
             "times an episode; the order of admission decides who recomputes; test split: 30 seeds, every request "
             "drawn afresh", workload="tight-memory", profile="a40-llama2-7b", engine=PREDICTED),
        Task("long-context", "random 120 s windows of the Azure code trace (median prompt 1.5k, p99 7.4k tokens) "
             "on an A100 whose KV cache is capped at 32k tokens: long prompts crowd out short ones and preempt; "
             "training windows come from outside the held-out middle 35% of the trace, and the test split is the "
             "ten back-to-back 120 s tiles of that middle: 10 test episodes, no request in two",
             workload="azure-code-window-train-v2", test_workload="azure-code-tiles-test",
             test_seeds=TILED_TEST_SEEDS, v1_workloads=("azure-code-window-train", "azure-code-window-test"),
             legacy_workload="azure-code-window", profile="a100-llama3-8b",
             engine={**PREDICTED, "num_kv_blocks": 2048}),
        Task("serverless-burst", "bursts of 90 req/s reach a pool of 4 containers that start cold, go cold after "
             "2 s idle and take 13 s to load; the agent decides for whichever container's iteration ends first; "
             "test split: 30 seeds, every request drawn afresh", workload="burst", engine=PREDICTED,
             pool={"num_containers": 4, "keep_alive_s": 2.0, "start_cold": True}),
        Task("slo-goodput", "Poisson 47 req/s, 1.35x the A100's capacity; the reward counts requests that meet "
             "TTFT <= 2 s and mean ITL (TPOT) <= 0.2 s, so some requests must be sacrificed for others; test "
             "split: 30 seeds, every request drawn afresh", workload="high", engine=PREDICTED, reward="slo_goodput"),
        Task("prefix-reuse", "random 600 s windows of the Mooncake conversation trace (12k-token prompts, multi-turn "
             "sessions sharing prefixes), one replica's sessions in 5, on an A100 with prefix caching: which queued "
             "prompt to prefill decides what stays cached and what is computed again; the test split is the held-out "
             "middle 35% of the trace (sessions that start there) as two back-to-back 600 s windows times the 5 "
             "shards: 10 test episodes, no request in two", workload="mooncake-conversation-v2",
             test_workload="mooncake-conversation-tiles-test", test_seeds=TILED_TEST_SEEDS,
             v1_workloads=("mooncake-conversation", "mooncake-conversation-test"),
             legacy_workload="mooncake-conversation", profile="a100-llama3-8b",
             engine={**PREDICTED, "prefix_caching": True}, max_steps=200_000),
        Task("cluster-routing", "random 120 s windows of the whole Mooncake conversation trace at its own rate "
             "(3.4 req/s of 12k-token prompts, multi-turn sessions sharing prefixes) reach 8 A100 replicas with "
             "prefix caching; the decision is which replica serves each arrival (FCFS admits inside each): a "
             "replica that caches the session's prefix computes less, a loaded one makes it wait; the test split is "
             "the ten back-to-back 120 s tiles of the held-out middle 35% of the trace (sessions that start there): "
             "10 test episodes, no request in two", workload="mooncake-cluster-v2",
             test_workload="mooncake-cluster-tiles-test", test_seeds=TILED_TEST_SEEDS,
             v1_workloads=("mooncake-cluster", "mooncake-cluster-test"), legacy_workload="mooncake-cluster",
             profile="a100-llama3-8b",
             engine={**PREDICTED, "prefix_caching": True}, pool={"num_containers": 8}, max_steps=1_000_000,
             decision="route"),
        Task("mixture", "each episode is drawn from relaxed, memory-tight or long-context: one policy for "
             "different GPUs, loads and lengths (generalisation); the test split is its components', on 27 of the "
             "test seeds, so that no long-context tile is replayed twice (7 long-context episodes)",
             components=("relaxed", "memory-tight", "long-context"), test_seeds=MIXTURE_TEST_SEEDS),
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
