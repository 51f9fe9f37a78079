"""The Gymnasium adapter over the serving engine."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, fields
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from servegym.backends import Backend, Profile
from servegym.backends.base import EMPTY
from servegym.backends.factory import make_backends
from servegym.engine import Engine, EngineConfig, StepOutcome
from servegym.engine.table import IDLE
from servegym.envs.actions import slot_action_masks
from servegym.envs.observation import SCHEMA, ObservationEncoder, observation_space, schema_table
from servegym.metrics.core import censored_latency, num_met_slo
from servegym.pool import Cluster, PoolConfig
from servegym.pool.cluster import ClusterStep, SkipRun
from servegym.validation import boolean, count, non_negative_number, optional, positive_int, positive_number
from servegym.workloads import Workload, make_workload
from servegym.workloads.scenarios import profile_for

REWARDS = {
    "latency": "minus requests-in-system x step seconds (plus arrivals' lag): sums to minus total latency",
    "tokens": "output tokens emitted in the step (throughput)",
    "slo_goodput": "requests that finished in the step within both SLOs: sums to the SLO-good request count",
}
STALL_WARNING_STEPS = 100
"""Consecutive stalled steps after which the env warns (once per env) that the policy is not making progress."""
THRASH_PREEMPTIONS_PER_REQUEST = 5
"""Preemptions per request of the episode beyond which the env warns (once per env) that the policy thrashes."""
TRUNCATION_PENALTY_S = 60.0
"""Default seconds of latency charged per unserved request when the env truncates an episode itself."""


class ServingEnv(gym.Env):
    """
    ## Description

    An LLM serving engine under a scheduler's control. Requests arrive from a workload, wait in a queue, are
    admitted, ingest their prompt in chunks (chunked prefill) and then decode one token per iteration until
    they finish. KV memory is paged; when an iteration would overflow it, running requests are preempted and
    later recompute. One `step` is one engine iteration (one forward pass): the action decides which waiting
    requests to admit before it runs. Iteration latency comes from the backend: a calibrated latency model
    (default) or a real model.

    With `pool={"num_containers": N, ...}` the engine is a serverless pool: each container has its own
    engine and KV cache, a router assigns arrivals, idle containers go cold after `keep_alive_s` and a cold
    one loads the model for `cold_start_s` before it can admit. Each step advances the container whose
    iteration ends first; the action applies to it, and `obs["pool"]` says which one it is and how warm
    every container is.

    ## Action Space

    `MultiDiscrete([W + 1] * W)` over the `W = queue_window` requests at the head of the queue. `action[i] = 0`
    leaves slot `i` waiting; `action[i] = k >= 1` admits it with rank `k` (rank 1 first; equal ranks go in queue
    order). So a 0/1 vector is an admit mask in arrival order, and distinct ranks give any order. Admission
    stops at the first request that does not fit (`max_num_seqs`, or free KV blocks for its first chunk).
    Admitting an empty slot is ignored and counted in `info["num_invalid_admissions"]` (an error with
    `strict_actions=True`); `action_masks()` gives the valid choices for MaskablePPO.

    ## Observation Space

    A `Dict` of flat float32 boxes (SB3 `MultiInputPolicy`); `queue_matrix(obs)` and `running_matrix(obs)`
    give row views. Rows beyond the live count are zero. With `flat_obs=True`, one float32 `Box` instead:
    `gymnasium.spaces.flatten` of the Dict (keys in sorted order: engine, pool, progress, queue, running), built
    in place at no extra cost, for `MlpPolicy` and cheap stacking in vector envs. With
    `engine={"prefix_caching": True}` two keys join (`prefix`, between pool and progress; `queue_prefix`, one row
    per visible request, between queue and running; docs/KV_REUSE.md); the others keep their layout.

    Shapes: `engine` `({engine},)`, `queue` `(W * {queue},)`, `running` `(max_num_seqs * {running},)`, `pool`
    `(num_containers * {pool},)`, `progress` `({progress},)` (the episode's time and requests so far: an agent's
    sense of the horizon). The features are in raw units (tokens, seconds, counts), for hand-coded policies;
    `servegym.envs.observation.scale_observation` puts every one on a bounded symmetric log scale for learning
    agents (`servegym train --observation scaled`). Every feature, from `servegym.envs.observation.SCHEMA`:

    {observation_table}

    Output lengths show as an interval `[lo, hi]`: exact when `length_mode="known"`, a published predictor's
    (often wrong) interval when `"predicted"`, `[1, max_tokens]` when `"unknown"`, a seeded interval that
    contains the truth when `"truth_interval"` (docs/ENV.md, length modes).

    ## Rewards

    `reward="latency"` (default): minus the request-seconds spent in the system since the last step (requests
    in system x elapsed time, plus the lag of requests that arrived meanwhile); over an episode it sums to
    minus the total time requests spent in the system, the unfinished counted up to the episode's end (minus
    `e2e_mean_all_s` times the arrived, unrejected requests), so maximising it minimises mean latency and
    starving the queue does not pay. `reward="slo_goodput"`: the number of requests that finished in the step with TTFT
    <= `ttft_slo_s` and mean inter-token latency <= `itl_slo_s`; it sums to the SLO-good request count
    (`goodput_rps * makespan_s`). `reward="tokens"`: output tokens emitted in the step.

    `reward_half_life_s` discounts by simulated time instead of by step: a step's reward is multiplied by
    `2 ** (-t / half_life)`, `t` the seconds from the episode's first arrival to the step's start, so the
    undiscounted sum of rewards is the time-discounted return (train with `gamma` at or near 1).

    ## Starting State

    The workload is drawn from `np_random`; the clock starts at the first arrival with it queued.

    ## Episode End

    Terminated when the workload is exhausted and the system is empty. Truncated by `max_steps` (the task's
    episode limit), by the idle-admission guard (`idle_guard_steps=N`: requests waited while nothing ran and no
    model was loading for `N` consecutive steps), and by `max_episode_steps` (gym.make's `TimeLimit`, 20,000
    for `servegym/Serving-v2`; Gymnasium's convention `max_episode_steps=-1` removes it). When the env truncates an episode itself (`max_steps` or the guard), the
    latency reward of the last step is charged `truncation_penalty_s` per unserved request (waiting, running
    or not yet arrived): steps are iterations of varying length, so without it an agent could end an episode
    cheaply by making iterations short or by stalling. `info["num_stalled_steps"]` counts the current run of
    stalled steps, with or without the guard; `info["idle_guard"]` marks a guard truncation. After the env ends
    an episode, terminated or truncated by itself, `step` raises until `reset` (`reset(options=...)` takes no
    keys yet: any is refused, as is a non-dict). An episode that ends where no step could say so (nothing to serve
    at `reset`, or with `router="agent"` a `route` that rejected its last request) ends at the next `step`, with
    reward 0 and `num_iterations` 0, counting only that route. With `router="agent"` the requests `route` sends
    (and rejects) between two steps are counted in the next step's `info["num_arrived"]` (`num_rejected`).

    With `decision_steps=True` one `step` applies the action to one iteration, then keeps iterating while no
    admission decision is possible (no request waits at the deciding container, its model is loading, or it
    has no free sequence slot or no free KV block) and returns at the next decision or the episode's end. The
    reward is the sum over those iterations (so episode sums are unchanged), the count keys of `info` and
    `step_s` sum over them, `info["num_iterations"]` says how many there were and `info["iteration_rewards"]`
    lists their rewards (a return summed from them is the same float as one summed step by step). `max_steps` and the guard
    count iterations.

    ## Arguments

    ```python
    import gymnasium as gym
    import servegym
    env = gym.make("servegym/Serving-v2", workload="burst", engine={"length_mode": "known"})
    ```

    | parameter | default | description |
    |-----------|---------|-------------|
    | `workload` | `"medium"` | a name from `servegym.workloads.WORKLOADS` or a `Workload` |
    | `profile` | `None` | calibrated profile: a shipped name, a JSON path or a `Profile`; None: the named workload's own (`servegym.workloads.scenarios.profile_for`), else `a100-llama3-8b` |
    | `backend` | `None` | `"calibrated"` (default, from `profile`), `"torch"` (a real model) or a `Backend` instance |
    | `backend_options` | `None` | `TorchBackend` arguments for `backend="torch"`: `model` (preset or local path), `device`, `dtype`, ... |
    | `engine` | `None` | an `EngineConfig` or a dict of its fields |
    | `pool` | `None` | a `PoolConfig` or a dict of its fields (containers, keep-alive, cold start, router) |
    | `queue_window` | `32` | visible waiting requests `W` |
    | `task` | `None` | a name from `servegym.envs.TASKS`: its workload, profile, engine, pool, reward and limits (other arguments override) |
    | `split` | `"train"` | with `task` only: `"test"` draws a trace task's episodes from its held-out test data (what `servegym bench` reports on) |
    | `version` | `2` | set by the id: `servegym/Serving-v2` (current) or `-v1`, `-v0` (legacy; see Version History) |
    | `unlocked` | `False` | a task's own id (`servegym/MemoryTight-v2`) refuses its locked settings unless `True` (then recorded in `env.spec.kwargs`) |
    | `reward` | `"latency"` | one of `REWARDS` |
    | `ttft_slo_s`, `itl_slo_s` | `2.0`, `0.2` | SLOs of the `slo_goodput` reward and `info["num_slo_good"]` |
    | `reward_half_life_s` | `None` | discount rewards by simulated time (see Rewards) |
    | `max_steps` | `None` | truncate after this many steps |
    | `idle_guard_steps` | `None` | truncate after this many consecutive stalled steps (see Episode End) |
    | `decision_steps` | `False` | one `step` runs through iterations with no admission decision to make (see Episode End) |
    | `flat_obs` | `False` | one float32 `Box`, `spaces.flatten` of the Dict (no extra cost; stacks cheaply in vector envs) |
    | `truncation_penalty_s` | `600.0` (v0: `60.0`) | latency charged per unserved request when `max_steps` or the guard truncates |
    | `latency_noise_cv` | `None` | override the profile's multiplicative latency noise |
    | `strict_actions` | `False` | raise on admits of empty slots instead of counting them |
    | `render_mode` | `None` | `"ansi"` (a line per container) or `"rgb_array"` (a frame per step, `servegym.envs.render`: KV cache by owner state, queue, batch, clock; `RecordVideo` records it) |

    ## Version History

    * v2: realistic predicted lengths (the interval can miss the truth), disjoint test episodes (ten tiles of a
      held-out 35% per trace task), `unlocked=True` for a task id's overrides (`servegym.ENV_CHANGES[2]`).
    * v1: trace tasks hold out their test data (`split="test"`); 600 s per unserved request at truncation;
      `servegym bench` evaluates on exactly the task's settings (`servegym.ENV_CHANGES`).
    * v0: initial release (legacy, `servegym/Serving-v0`: whole-trace windows for every split, 60 s).
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}

    def __init__(self, workload: str | Workload = "medium", profile: str | Profile | None = None,
                 backend: Backend | str | None = None, backend_options: dict[str, Any] | None = None,
                 engine: EngineConfig | dict[str, Any] | None = None, pool: PoolConfig | dict[str, Any] | None = None,
                 queue_window: int = 32, reward: str = "latency", latency_noise_cv: float | None = None,
                 strict_actions: bool = False, render_mode: str | None = None, ttft_slo_s: float = 2.0,
                 itl_slo_s: float = 0.2, reward_half_life_s: float | None = None, max_steps: int | None = None,
                 idle_guard_steps: int | None = None, truncation_penalty_s: float = TRUNCATION_PENALTY_S,
                 decision_steps: bool = False, flat_obs: bool = False) -> None:
        _check_arguments(workload, profile, reward, render_mode, queue_window, latency_noise_cv, strict_actions,
                         decision_steps, flat_obs, ttft_slo_s, itl_slo_s, reward_half_life_s, max_steps,
                         idle_guard_steps, truncation_penalty_s, self.metadata["render_modes"])
        self.engine_config = _config("engine", engine, EngineConfig) or EngineConfig()
        self.pool_config = _config("pool", pool, PoolConfig) or PoolConfig()
        n = self.pool_config.num_containers
        profile = profile if profile is not None else profile_for(workload)
        backends, cold_start = make_backends(backend, profile, self.engine_config, n, backend_options, latency_noise_cv,
                                             self.pool_config.profiles)
        self.workload = make_workload(workload) if isinstance(workload, str) else workload
        self.cluster = Cluster(self.engine_config, self.pool_config, backends, self.workload, cold_start)
        self._engine_loop = not self.engine_config.check_invariants
        """Iterations without a decision run in the pool's own loop (``Cluster.skip``; not with invariant checks)."""
        self.queue_window, self.reward_name, self.render_mode = queue_window, reward, render_mode
        self.strict_actions, self.decision_steps = strict_actions, decision_steps
        self.ttft_slo_s, self.itl_slo_s = float(ttft_slo_s), float(itl_slo_s)
        self.reward_half_life_s, self.truncation_penalty_s = reward_half_life_s, float(truncation_penalty_s)
        self.max_steps, self.idle_guard_steps = max_steps, idle_guard_steps
        self.iteration_limit: int | None = None
        """With ``decision_steps``: a step returns once the episode has run this many iterations (set by
        ``servegym.runner.IterationLimit``, a ``TimeLimit`` that counts iterations rather than steps)."""
        slots = self.engine_config.max_num_seqs
        self.action_space = spaces.MultiDiscrete(np.full(queue_window, queue_window + 1, dtype=np.int64))
        prefix = self.engine_config.prefix_caching
        self.dict_observation_space = observation_space(queue_window, slots, n, prefix)
        """The Dict space; with ``flat_obs`` the observation is ``spaces.flatten`` of it (hand-coded policies
        read ``spaces.unflatten(env.unwrapped.dict_observation_space, obs)``)."""
        self.observation_space = spaces.flatten_space(self.dict_observation_space) if flat_obs \
            else self.dict_observation_space
        self._encoder = ObservationEncoder(queue_window, slots, n, flat=flat_obs, prefix=prefix)
        self._warned_stall = self._warned_thrash = False
        self._clear_episode(0)

    def _clear_episode(self, num_requests: int) -> None:
        """Per-episode counters, zeroed by ``reset`` (``num_requests``: the episode's workload size)."""
        self._invalid = 0
        self._terminated = False
        """A step returned terminated this episode."""
        self._truncated = False
        """The env truncated this episode (``max_steps`` or the guard): a further ``step`` raises until ``reset``."""
        self._num_steps = 0
        self._num_stalled = 0
        """Consecutive steps after which requests waited, nothing ran and no model was loading."""
        self._num_slo_good = self._num_preempted = 0
        self._latency_charged = 0.0
        """Request-seconds the latency reward has charged so far this episode."""
        self._routed = self._routed_rejected = 0
        """Requests ``route()`` sent, and of them rejected, since the last step: counted in the next step's info."""
        self._thrash_limit = THRASH_PREEMPTIONS_PER_REQUEST * num_requests
        """Preemptions in an episode beyond which the env warns that the policy thrashes."""

    # ------------------------------------------------------------------ gym API
    @property
    def engine(self) -> Engine:
        """The container whose decision the next ``step`` takes (the only one unless ``pool`` says more)."""
        return self.cluster.engine

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        check_reset_options(options)
        super().reset(seed=seed)
        self.cluster.reset(self.np_random)
        self._encoder.reset(self.cluster)
        self._clear_episode(self.cluster.log.num_requests)
        info = self._info(self.engine.last, self.cluster.deciding, self.cluster.last_arrived,
                          self.cluster.last_rejected)
        return self._encoder.encode(self.cluster), info

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        self._require_not_truncated()
        self.cluster.require_routed()  # before the action is read: a refused step books nothing
        order = self._decode_action(action)
        if self.cluster.done and not self._terminated:
            # The episode ended where no step could say so: nothing to serve at reset (an empty workload, or every
            # request rejected on arrival; Gymnasium's reset has no terminated flag), or route() rejected its last
            # request. This step ends it, changing nothing; one after it raises (in the pool's step).
            self._terminated = True
            info = {**self._info(IDLE, self.cluster.deciding, *self._take_routed()), "num_iterations": 0}
            if self.decision_steps:
                info["iteration_rewards"] = []
            return self._encoder.encode(self.cluster), 0.0, True, False, info
        # Each iteration's reward, outcome and arrivals, in order (the outcomes are summed only for a step of several
        # iterations); a run of the engine's own loop is booked in bulk up to its last iteration, which is booked as
        # a single step is.
        reward, rewards, outcomes, arrived, rejected, run = 0.0, [], [], 0, 0, None
        while True:
            if run is None:
                started_s = self.cluster.time
                step = self.cluster.step(order)
            else:
                reward = self._account_run(run, reward, rewards)
                outcomes.extend(run.outcomes[:-1])
                started_s, step = run.started_s[-1], run.last
            r, terminated, truncated = self._account(started_s, step, self._finished_ids(step))
            reward += r
            rewards.append(r)
            outcomes.append(step.outcome)
            arrived += step.arrived
            rejected += step.rejected
            if self._ends_step(terminated, truncated):
                break
            order = order[:0]
            # The iterations up to the next one that ends the step, in the pool's own loop: the same steps.
            run = self.cluster.skip(self._iterations_left()) if self._engine_loop else None
        obs = self._encoder.encode(self.cluster)
        info = self._info(step.outcome, step.container, step.arrived, step.rejected)
        info["num_iterations"] = len(rewards)
        if self.decision_steps:  # each iteration's reward, so a return can be summed as without the skip
            info["iteration_rewards"] = rewards
        if len(rewards) > 1:  # counts over every iteration this step advanced, not only the last (summed in order)
            info.update(zip(COUNTED, (*_summed(outcomes), arrived, rejected), strict=True))
        if self._routed:
            routed, refused = self._take_routed()
            info["num_arrived"] += routed
            info["num_rejected"] += refused
        if truncated and self._num_stalled >= (self.idle_guard_steps or math.inf):
            info["idle_guard"] = True
        self._terminated, self._truncated = terminated, truncated
        return obs, reward, terminated, truncated, info

    def _ends_step(self, terminated: bool, truncated: bool) -> bool:
        """Whether the iteration just run is a step's last: the episode ended, the env steps every iteration, an
        admission could succeed now, a request waits to be routed, or the iteration limit is reached."""
        return terminated or truncated or not self.decision_steps or self.cluster.engine.can_admit() \
            or self.cluster.awaiting_route \
            or (self.iteration_limit is not None and self._num_steps >= self.iteration_limit)

    def route(self, container: int) -> float:
        """With ``pool.router == "agent"``: send the request that waits to be routed to ``container``; return the
        reward of its wait from arrival to now (``latency``: minus it; other rewards: 0)."""
        self._require_not_truncated()
        rejected, lag = self.cluster.route(container)
        self._routed += 1
        self._routed_rejected += rejected
        if self.reward_name != "latency":
            return 0.0
        self._latency_charged += lag
        return -lag

    def _take_routed(self) -> tuple[int, int]:
        """The requests ``route()`` sent since the last step and those of them rejected, counted now."""
        counts = self._routed, self._routed_rejected
        self._routed = self._routed_rejected = 0
        return counts

    def _require_not_truncated(self) -> None:
        """As after termination, nothing moves an episode the env truncated: its truncation charge is paid once."""
        if self._truncated:
            raise RuntimeError("the episode was truncated (max_steps or the idle guard); call reset()")

    def observe(self) -> dict[str, np.ndarray] | np.ndarray:
        """The observation of the current state (as ``step`` returns it), e.g. after :meth:`route`."""
        return self._encoder.encode(self.cluster)

    def _iterations_left(self) -> int:
        """Iterations before ``max_steps`` or the iteration limit (the last of them may end the episode)."""
        limits = [limit - self._num_steps for limit in (self.max_steps, self.iteration_limit) if limit is not None]
        return min(limits, default=2**62)

    def _finished_ids(self, step: ClusterStep) -> np.ndarray:
        return self.cluster.engines[step.container].last_finished_ids if step.outcome.num_finished else EMPTY

    def _account_run(self, run: SkipRun, reward: float, rewards: list[float]) -> float:
        """Book the iterations of ``run`` before its last as :meth:`_account` books each (rows ran after every
        one, so none stalled, ended the episode or reached a limit); return ``reward`` plus theirs, in order. Their
        preemptions are booked together: a thrash warning due inside the run names the run's end."""
        outcomes = run.outcomes[:-1]
        if not outcomes:
            return reward
        self._num_steps += len(outcomes)
        self._num_stalled = 0
        values = self._rewards(outcomes, run.latency_accrued_s[:-1], run.finished_ids)
        if self.reward_half_life_s is not None:
            values = [value * self._discount(started_s)
                      for value, started_s in zip(values, run.started_s[:-1], strict=True)]
        for value in values:
            reward += value
        rewards.extend(values)
        self._book_preemptions(sum(outcome.num_preemptions for outcome in outcomes))
        return reward

    def _account(self, started_s: float, step: ClusterStep, finished_ids: np.ndarray) -> tuple[float, bool, bool]:
        """Book the latest engine iteration, which started at pool time ``started_s``: its reward (penalty and
        discount applied), terminated, truncated."""
        self._num_steps += 1
        finished = {0: finished_ids} if step.outcome.num_finished else {}
        reward = self._rewards((step.outcome,), (step.latency_accrued_s,), finished)[0]
        self._num_stalled = self._num_stalled + 1 if self.cluster.stalled() else 0
        self._book_preemptions(step.outcome.num_preemptions)
        if self._num_stalled == STALL_WARNING_STEPS and not self._warned_stall:
            self._warned_stall = True
            warnings.warn(f"requests have waited while nothing ran for {STALL_WARNING_STEPS} steps at t="
                          f"{self.cluster.time:.2f} s: the policy is not admitting (info['num_stalled_steps'] counts "
                          "such steps; idle_guard_steps truncates them)", RuntimeWarning, stacklevel=3)
        terminated = self.cluster.done
        truncated = not terminated and self.max_steps is not None and self._num_steps >= self.max_steps
        guarded = not terminated and self.idle_guard_steps is not None and self._num_stalled >= self.idle_guard_steps
        if (truncated or guarded) and self.reward_name == "latency":
            # With several containers the pool clock trails the busiest one; charge the time requests spent
            # in containers that ran ahead, so the return is the censored latency whatever the pool.
            reward -= censored_latency(self.cluster.log).sum() - self._latency_charged
            reward -= self.truncation_penalty_s * self.num_unserved
        if self.reward_half_life_s is not None:
            reward *= self._discount(started_s)
        return reward, terminated, truncated or guarded

    def _book_preemptions(self, count: int) -> None:
        self._num_preempted += count
        if self._num_preempted > self._thrash_limit and not self._warned_thrash:
            self._warned_thrash = True
            warnings.warn(f"{self._num_preempted} preemptions for {self.cluster.log.num_requests} requests by t="
                          f"{self.cluster.time:.2f} s: the policy is thrashing the KV cache (info['num_preemptions'] "
                          "counts them per step)", RuntimeWarning, stacklevel=4)

    @property
    def num_steps(self) -> int:
        """Engine iterations this episode has run (with ``decision_steps``, more than the calls of ``step``)."""
        return self._num_steps

    def _rewards(self, outcomes: Sequence[StepOutcome], accrued_s: Sequence[float],
                 finished_ids: dict[int, np.ndarray]) -> list[float]:
        """The rewards of consecutive iterations, before any truncation charge or discount (``finished_ids``: the
        ids each iteration that finished any finished, by its index); their SLO-good finishes are counted for
        ``info["num_slo_good"]`` whatever the reward."""
        if self.reward_name == "latency":
            values = [-accrued for accrued in accrued_s]
            for accrued in accrued_s:  # one by one, as the return sums them
                self._latency_charged += accrued
        elif self.reward_name == "tokens":
            values = [float(outcome.num_decode_tokens) for outcome in outcomes]
        else:
            values = [0.0] * len(outcomes)
        for i, ids in finished_ids.items():
            if i < len(outcomes):
                good = num_met_slo(self.cluster.log, ids, self.ttft_slo_s, self.itl_slo_s)
                self._num_slo_good += good
                if self.reward_name not in ("latency", "tokens"):  # the SLO goodput
                    values[i] = float(good)
        return values

    def _discount(self, started_s: float) -> float:
        """``reward_half_life_s``'s factor for an iteration that started at pool time ``started_s``."""
        return 2.0 ** (-(started_s - self.cluster.log.arrival_s[0]) / self.reward_half_life_s)

    @property
    def num_unserved(self) -> int:
        """Requests of the episode neither finished nor rejected (waiting, running or not yet arrived)."""
        log = self.cluster.log
        return log.num_requests - sum(e.num_finished for e in self.cluster.engines) - self.cluster.num_rejected

    def render(self) -> str | np.ndarray | None:
        """``ansi``: one line per container; ``rgb_array``: the frame of :mod:`servegym.envs.render` (KV cache,
        queue, batch and clock), of shape ``render.frame_shape(num_containers)``; None without a render mode."""
        if self.render_mode == "rgb_array":
            from servegym.envs.render import draw_frame, panel_of  # numpy drawing, loaded when frames are asked for

            log, now = self.cluster.log, self.cluster.time
            return draw_frame(now, self._num_steps, [panel_of(e, log, self.queue_window, now)
                                                     for e in self.cluster.engines])
        if self.render_mode != "ansi":
            return None
        return " | ".join(
            f"c{e.container}{'*' if e.container == self.cluster.deciding else ' '} t={e.clock:8.3f}s "
            f"running={e.num_running} waiting={e.waiting.size} kv={e.num_used_blocks}/{e.num_kv_blocks} finished={e.num_finished}"
            for e in self.cluster.engines
        )

    # ------------------------------------------------------------------ actions
    def _decode_action(self, action) -> np.ndarray:
        a = np.asarray(action)
        w = self.queue_window
        if a.shape != (w,):
            raise ValueError(f"action must have shape ({w},), got {a.shape}")
        if a.dtype.kind == "b":  # a boolean admit mask, as the README describes a 0/1 vector
            a = a.astype(np.int64)
        if a.dtype.kind not in "iu":
            if a.dtype.kind == "f" and np.isnan(a).any():
                raise ValueError("action contains NaN")
            raise TypeError(f"action must be an integer array (MultiDiscrete), got dtype {a.dtype}")
        values = a if a.dtype == np.int64 and a.flags.c_contiguous else np.ascontiguousarray(a, dtype=np.int64)
        order = np.empty(w, dtype=np.int64)
        count, beyond = self.engine.admit_order(values, w, order)  # one compiled pass: checked, cut and ordered
        if count < 0:
            raise ValueError(f"action values must be in [0, {w}], got min {a.min()} max {a.max()}")
        if beyond:
            if self.strict_actions:
                visible = self.num_visible
                empty = (np.flatnonzero(a[visible:]) + visible).tolist()
                raise ValueError(f"action admits empty queue slot(s) {empty}; only {visible} visible")
            self._invalid += beyond
        return order[:count]

    @property
    def num_visible(self) -> int:
        """Occupied slots of the queue window: waiting requests the next action can admit."""
        return min(self.engine.waiting.size, self.queue_window)

    def action_masks(self) -> np.ndarray:
        """Valid values per slot, flattened for sb3-contrib's MaskablePPO: empty slots may only be 0."""
        return slot_action_masks(self.queue_window, self.num_visible, self.queue_window + 1)

    # ------------------------------------------------------------------ info
    def _info(self, out: StepOutcome, container: int, arrived: int, rejected: int) -> dict[str, Any]:
        e = self.cluster.engines[container]
        return {
            "container": container,
            "next_container": self.cluster.deciding,
            "clock_s": e.clock,
            "step_s": out.dt_s,
            "num_decode_tokens": out.num_decode_tokens,
            "num_prefill_tokens": out.num_prefill_tokens,
            "num_admitted": out.num_admitted,
            "num_refused": out.num_refused,
            "num_preemptions": out.num_preemptions,
            "num_finished": out.num_finished,
            "num_arrived": arrived,
            "num_rejected": rejected,
            "num_running": e.num_running,
            "num_waiting": e.waiting.size,
            "kv_used_frac": e.num_used_blocks / e.num_kv_blocks,
            "num_invalid_admissions": self._invalid,
            "num_stalled_steps": self._num_stalled,
            "num_slo_good": self._num_slo_good,
        }

    def config_dict(self) -> dict[str, Any]:
        """The engine and pool configuration as plain values (for logs and result files)."""
        both = {**asdict(self.engine_config), **{f"pool_{k}": v for k, v in asdict(self.pool_config).items()}}
        return {k: getattr(v, "value", v) for k, v in both.items()}


COUNTED = ("step_s", "num_decode_tokens", "num_prefill_tokens", "num_admitted", "num_refused", "num_preemptions",
           "num_finished", "num_arrived", "num_rejected")
"""Info keys that sum over the iterations of one decision step: ``StepOutcome``'s fields in order, then the
cluster step's arrivals and rejections."""


RESET_OPTIONS: frozenset[str] = frozenset()
"""The keys ``reset(options=...)`` understands: none yet (Gymnasium's default), so any key is a caller's typo."""


def _summed(outcomes: list[StepOutcome]) -> tuple:
    """Each field of ``outcomes`` summed over them: the step times one by one in order (a float column, added as
    single steps add them), the counts (integers, exact in any order) by ``sum``."""
    columns = zip(*outcomes, strict=True)
    step_s = 0
    for value in next(columns):
        step_s += value
    return step_s, *(sum(column) for column in columns)


def check_reset_options(options: Any) -> None:
    """``reset``'s ``options``: None or a dict of known keys; anything else is refused rather than ignored."""
    if options is None:
        return
    if not isinstance(options, dict):
        raise TypeError(f"reset options must be a dict or None, got {type(options).__name__} {options!r}")
    unknown = sorted(set(options) - RESET_OPTIONS, key=str)
    if unknown:
        known = ", ".join(sorted(RESET_OPTIONS)) or "none"
        raise ValueError(f"reset options {unknown} are not understood (known: {known})")


def _check_arguments(workload: Any, profile: Any, reward: Any, render_mode: Any, queue_window: int,
                     latency_noise_cv: float | None, strict_actions: bool, decision_steps: bool, flat_obs: bool,
                     ttft_slo_s: float, itl_slo_s: float, reward_half_life_s: float | None, max_steps: int | None,
                     idle_guard_steps: int | None, truncation_penalty_s: float, render_modes: list[str]) -> None:
    """``ServingEnv``'s arguments, each checked with an error that names it (the configs check themselves)."""
    if not isinstance(workload, str | Workload):
        raise TypeError(f"workload must be a name from servegym.workloads.WORKLOADS or a Workload, got {workload!r}")
    if profile is not None and not isinstance(profile, str | Profile):
        raise TypeError(f"profile must be a shipped name, a JSON path or a Profile, got {profile!r}")
    optional(non_negative_number)("latency_noise_cv", latency_noise_cv)
    for name, value in (("strict_actions", strict_actions), ("decision_steps", decision_steps),
                        ("flat_obs", flat_obs)):
        boolean(name, value)
    if not isinstance(reward, str):
        raise TypeError(f"reward must be a string, one of {sorted(REWARDS)}, got {reward!r}")
    count("queue_window", queue_window, "slots")
    for name, value in (("ttft_slo_s", ttft_slo_s), ("itl_slo_s", itl_slo_s)):
        positive_number(name, value)
    optional(positive_number)("reward_half_life_s", reward_half_life_s)
    optional(positive_int)("max_steps", max_steps)
    optional(positive_int)("idle_guard_steps", idle_guard_steps)
    non_negative_number("truncation_penalty_s", truncation_penalty_s)
    if reward not in REWARDS:
        raise ValueError(f"unknown reward {reward!r}; choose from {sorted(REWARDS)}")
    if render_mode is not None and render_mode not in render_modes:
        raise ValueError(f"render_mode must be None or one of {render_modes}")


def _config(name: str, value: Any, cls: type) -> Any:
    """An engine or pool config from a config, a dict of its fields, or None; anything else is a clear error."""
    if value is None or isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise TypeError(f"{name} must be a {cls.__name__} or a dict of its fields, got {value!r}")
    allowed = {f.name for f in fields(cls)}
    unknown = set(value) - allowed
    if unknown:
        raise ValueError(f"{name}: unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    return cls(**value)


def _document_observations(doc: str) -> str:
    """Fill the docstring's observation placeholders from the schema, so docs and spaces cannot drift."""
    doc = doc.replace("{observation_table}", schema_table().replace("\n", "\n    "))
    for key, features in SCHEMA.items():
        doc = doc.replace(f"{{{key}}}", str(len(features)))
    return doc


ServingEnv.__doc__ = _document_observations(ServingEnv.__doc__)
