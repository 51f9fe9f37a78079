"""servegym: a Gymnasium control environment for designing LLM-serving schedulers.

Importing the package registers ``servegym/Serving-v2`` (current), the legacy ``servegym/Serving-v1`` and
``-v0``, and one id per benchmark task (``servegym/MemoryTight-v2``, ...).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gymnasium.envs.registration import register, registry

if TYPE_CHECKING:
    from gymnasium.vector import VectorEnv

__version__ = "0.3.0"

VERSION = 2
"""The current env version."""
ENV_ID = f"servegym/Serving-v{VERSION}"
"""The current env id: what every runner, benchmark and training script builds."""
LEGACY_ENV_ID = "servegym/Serving-v0"
"""The first version, kept so that its results reproduce (see :data:`ENV_CHANGES`)."""
ENV_IDS = {version: f"servegym/Serving-v{version}" for version in range(VERSION + 1)}
"""Every registered version's id: the current one and the legacy ones, whose results reproduce."""
ENV_CHANGES = {
    2: "the benchmark's second integrity round: predicted output lengths err like a published predictor (Zheng et "
       "al., NeurIPS 2023: 62-token mean absolute error) and their interval can miss the truth (v1's interval, which "
       "always held it, is the length mode 'truth_interval'); test episodes share no request: a trace task's test "
       "split is its held-out middle 35% (v1: 30%, random windows that overlapped) cut into ten disjoint tiles, seed "
       "s replaying tile s mod 10, and the task reports on its own Task.test_seeds (10 for trace tasks, 27 for the "
       "mixture, 30 for the synthetic tasks); cluster-routing's windows are 120 s (v1: 300 s); a task's own id "
       "refuses overrides of its locked settings unless built with unlocked=True (recorded in the env's spec)",
    1: "trace tasks hold out their test data (long-context: test windows, split='test', from the middle 35-65% of "
       "the Azure code trace, training and validation windows from the rest); the truncation charge per unserved "
       "request is 600 s (v0: 60 s, which let 'never admit' tie FCFS on a heavy long-context window); servegym "
       "bench locks evaluation to the task's settings (policies' own engine settings run in an engine-config "
       "track)",
    0: "the first version: test and training windows from the whole trace, 60 s per unserved request",
}
"""What each version changed, newest first."""
TASK_IDS = {"relaxed": "Relaxed", "memory-tight": "MemoryTight", "long-context": "LongContext",
            "serverless-burst": "ServerlessBurst", "slo-goodput": "SloGoodput", "prefix-reuse": "PrefixReuse",
            "cluster-routing": "ClusterRouting", "mixture": "Mixture"}
"""Benchmark task -> the name of its own id, ``servegym/<Name>-v2`` (``gym.make(id)`` is the task's env)."""


def task_id(task: str) -> str:
    """The task's own env id: ``task_id("memory-tight") == "servegym/MemoryTight-v2"``."""
    return f"servegym/{TASK_IDS[task]}-v{VERSION}"


_ENTRY = "servegym.envs.mixture:make_serving_env"
_VECTOR_ENTRY = "servegym.envs.vector:make_serving_vector_env"
TASK_MAX_STEPS = {"prefix-reuse": 200_000, "cluster-routing": 1_000_000}
"""Tasks whose episodes run past the ids' 20,000 steps (their ``Task.max_steps``; tests check the two agree)."""
for _id, _kwargs in (*((env_id, {"version": version}) for version, env_id in ENV_IDS.items()),
                     *((task_id(task), {"version": VERSION, "task": task, "id_task": task}) for task in TASK_IDS)):
    if _id not in registry:
        register(id=_id, entry_point=_ENTRY, max_episode_steps=TASK_MAX_STEPS.get(_kwargs.get("task"), 20_000),
                 kwargs=_kwargs, vector_entry_point=_VECTOR_ENTRY)


def make_vec(env_id: str = ENV_ID, num_envs: int = 1, **kwargs: Any) -> VectorEnv:
    """``num_envs`` envs of ``env_id`` stepped in one call in this process (:class:`servegym.envs.vector.
    ServingVectorEnv`): ``gym.make_vec(env_id, num_envs, vectorization_mode="vector_entry_point", **kwargs)``;
    ``kwargs`` are ``gym.make``'s (``task=``, ``flat_obs=``, ...) plus ``autoreset_mode``, ``copy`` and ``shards``
    (> 1: split over that many processes, :class:`servegym.envs.sharded.ShardedVectorEnv`; the same episodes)."""
    import gymnasium as gym

    return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **kwargs)

__all__ = ["ENV_CHANGES", "ENV_ID", "ENV_IDS", "LEGACY_ENV_ID", "TASK_IDS", "VERSION", "__version__", "make_vec",
           "task_id"]
