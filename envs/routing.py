"""Routing as the decision: an env that stops at each arrival and asks which replica serves it."""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from servegym.envs.serving import COUNTED, ServingEnv
from servegym.pool.cluster import Cluster
from servegym.pool.routing import Router, RouteState

REPLICA_FEATURES = ("num_waiting", "num_running", "used_blocks", "queued_blocks", "free_blocks", "cached_tokens",
                    "fits", "holds_model")
"""Columns of ``obs["replicas"]``, one row per replica, as raw counts (a learner normalises them)."""
REQUEST_FEATURES = ("prompt_tokens", "output_lo", "output_hi", "turn", "block_size")
"""Entries of ``obs["request"]``: the arriving request's prompt and output-length interval, the arrivals routed so
far modulo the number of replicas (the round-robin turn), and the KV block size."""
MAX_FEATURE = 2.0**31
"""Upper bound of every feature (token and block counts)."""


SERVED = COUNTED[:-2]
"""The count keys of a serving step's info that a routing step sums over its serving steps (the rest, arrivals and
rejections, are its route's)."""


class RoutingEnv(gym.Env):
    """A cluster of replicas in which the agent routes each arriving request; admission inside each replica is a
    named hand-coded policy's (default ``fcfs``).

    ## Action Space
    ``Discrete(N)``: the replica that receives the arriving request. A replica whose KV cache cannot hold the
    request even at its shortest possible output is masked out by :meth:`action_masks` (sb3-contrib's
    ``MaskablePPO``); routed there anyway, the request is rejected, and under the latency reward that step also
    pays the serving env's ``truncation_penalty_s`` (the price of an unserved request; ``info["misrouted"]``), so
    dropping a request is never cheaper than serving it.

    ## Observation Space
    ``Dict``: ``replicas`` ``Box(0, 2**31, (N, 8), float32)``, one row per replica with the columns of
    :data:`REPLICA_FEATURES` (queued and running requests; KV blocks in use, taken by queued prompts and free;
    prompt tokens of the arriving request the replica holds cached, GPU plus host tier; whether it fits; whether
    the replica holds the model), and ``request`` ``Box(0, 2**31, (5,), float32)`` (:data:`REQUEST_FEATURES`).
    With ``flat_obs`` the observation is ``spaces.flatten`` of the Dict. These are exactly what the rule-based
    routers read (:class:`~servegym.pool.routing.RouteState`), so a router can act from the observation.

    ## Rewards
    The serving env's reward (``latency``: minus the request-seconds in the system) summed over the engine
    iterations run between two arrivals, plus the routed request's wait from arrival to routing; an episode's
    return is the return of the same episode with the same routing decisions made by a router (to float
    rounding). ``info["iteration_rewards"]`` lists the terms in order. The serving env's count keys of ``info``
    (``step_s``, tokens, admissions, preemptions, finishes) sum over the step's serving steps; ``num_arrived`` and
    ``num_rejected`` count the step's route (1, and 1 if it was rejected), so their sums over an episode are the
    log's.

    ## Episode End
    Terminated once the workload is exhausted and every replica is empty; truncated as the serving env truncates
    (``max_steps`` counts engine iterations, and the idle guard).

    Args:
        serving: a :class:`ServingEnv` whose pool routes with ``Router.AGENT`` (``servegym.make_routing_env``
            builds one from a task).
        admission: the hand-coded policy that admits requests inside each replica (a ``Policy``).
        flat_obs: flatten the observation into one ``Box``.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"]}

    def __init__(self, serving: ServingEnv, admission: Any, flat_obs: bool = False) -> None:
        if serving.pool_config.router is not Router.AGENT:
            raise ValueError(f"the serving env must route with 'agent', not {serving.pool_config.router.value!r}")
        self.serving, self.admission, self.flat_obs = serving, admission, bool(flat_obs)
        self.num_replicas = n = serving.pool_config.num_containers
        self.action_space = spaces.Discrete(n)
        self.dict_observation_space = spaces.Dict({
            "replicas": spaces.Box(0.0, MAX_FEATURE, (n, len(REPLICA_FEATURES)), np.float32),
            "request": spaces.Box(0.0, MAX_FEATURE, (len(REQUEST_FEATURES),), np.float32),
        })
        self.observation_space = spaces.flatten_space(self.dict_observation_space) if flat_obs \
            else self.dict_observation_space
        self.render_mode = serving.render_mode
        self._inner_obs: dict[str, np.ndarray] | None = None
        self._state: RouteState | None = None
        self._ended = False

    @property
    def cluster(self) -> Cluster:
        return self.serving.cluster

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self._inner_obs, info = self.serving.reset(seed=seed, options=options)
        self.admission.reset()
        self._ended = False
        return self._observe(), self._info(info)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        if self._ended:
            raise RuntimeError("the episode is over; call reset()")
        cluster = self.cluster
        rewards: list[float] = []
        info: dict[str, Any] = {}
        # The serving steps' counts summed in order; the arrival and rejection counts are this step's route's.
        counts: dict[str, Any] = {**dict.fromkeys(COUNTED, 0), "step_s": 0.0}
        terminated = truncated = misrouted = False
        if cluster.awaiting_route:
            chosen = np.asarray(action)
            if chosen.ndim != 0 or chosen.dtype.kind not in "iu" or not 0 <= chosen < self.num_replicas:
                raise ValueError(f"action must be a replica index in [0, {self.num_replicas}), got {action!r}")
            allowed, rejected = self.action_masks()[int(chosen)], cluster.num_rejected
            rewards.append(self.serving.route(int(chosen)))
            counts["num_arrived"], counts["num_rejected"] = 1, cluster.num_rejected - rejected
            if not allowed and cluster.num_rejected > rejected and self.serving.reward_name == "latency":
                # A rejection the route caused (another replica could hold it): priced as an unserved request,
                # or dropping requests would be the cheapest route under the latency reward.
                rewards.append(-self.serving.truncation_penalty_s)
                misrouted = True
            self._inner_obs = self.serving.observe()
        while not cluster.awaiting_route:
            if cluster.done and rewards:
                terminated = True
                break
            self._inner_obs, r, terminated, truncated, info = self.serving.step(self.admission.act(self._inner_obs))
            rewards.extend(info.get("iteration_rewards", (r,)))
            for key in SERVED:
                counts[key] += info[key]
            if terminated or truncated:
                break
        self._ended = terminated or truncated
        reward = 0.0
        for r in rewards:
            reward += r
        info = {**self._info(info), **counts, "misrouted": misrouted}
        info["iteration_rewards"] = rewards
        return self._observe(), reward, terminated, truncated, info

    def _observe(self) -> Any:
        cluster = self.cluster
        n = self.num_replicas
        replicas = np.zeros((n, len(REPLICA_FEATURES)), dtype=np.float32)
        request = np.zeros(len(REQUEST_FEATURES), dtype=np.float32)
        if cluster.routing_request < cluster.log.num_requests:
            rid = cluster.routing_request
            s = self._state = cluster.route_state(rid)
            waiting = np.array([e.waiting.size for e in cluster.engines])
            columns = (waiting, s.load - waiting, s.used_blocks, s.queued_blocks, s.free_blocks, s.cached_tokens,
                       s.fits, s.holds_model)
            replicas[:] = np.column_stack(columns)
            log = cluster.log
            request[:] = (s.prompt_tokens, log.output_lo[rid], log.output_hi[rid], s.turn % n, s.block_size)
        obs = {"replicas": np.minimum(replicas, MAX_FEATURE), "request": np.minimum(request, MAX_FEATURE)}
        return spaces.flatten(self.dict_observation_space, obs) if self.flat_obs else obs

    def action_masks(self) -> np.ndarray:
        """Replicas that can hold the arriving request (every replica if none can, or none is arriving)."""
        fits = self._state.fits if self._state is not None and self.cluster.awaiting_route else None
        return np.ones(self.num_replicas, dtype=bool) if fits is None or not fits.any() else fits.copy()

    def _info(self, inner: dict[str, Any]) -> dict[str, Any]:
        cluster = self.cluster
        return {**inner, "clock_s": cluster.time, "request": cluster.routing_request,
                "num_routed": cluster.num_arrived, "num_running": sum(e.num_running for e in cluster.engines),
                "num_waiting": sum(e.waiting.size for e in cluster.engines)}

    def render(self) -> str | None:
        return self.serving.render()

    def close(self) -> None:
        self.serving.close()
