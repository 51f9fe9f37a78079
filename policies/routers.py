"""Routers as policies: each routes the arrivals of a routing task (``RoutingEnv``) by one rule of
:mod:`servegym.pool.routing`, reading the observation alone; admission inside the replicas is the task's.

A router policy's choice on an observation is its rule's on the :class:`~servegym.pool.routing.RouteState` the
observation carries, so a routing env played by ``router-least-loaded`` runs the episode a pool with
``router="least_loaded"`` runs (``tests/test_routing_env.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from servegym.envs.routing import REPLICA_FEATURES, REQUEST_FEATURES
from servegym.policies.base import Observation, Policy, register_policy
from servegym.policies.params import PolicyParams, param
from servegym.pool.routing import ROUTERS, Router, RouteState
from servegym.validation import non_negative_int, positive_number

_COLUMN = {name: i for i, name in enumerate(REPLICA_FEATURES)}
_ENTRY = {name: i for i, name in enumerate(REQUEST_FEATURES)}


def route_state(obs: Observation, prefix_weight: float = 1.0, load_weight: float = 1.0,
                rng: np.random.Generator | None = None) -> RouteState:
    """The :class:`RouteState` a routing observation carries (its counts are exact in float32)."""
    replicas, request = obs["replicas"], obs["request"]

    def column(name: str, dtype: type = np.int64) -> np.ndarray:
        return replicas[:, _COLUMN[name]].astype(dtype)

    return RouteState(
        load=column("num_waiting") + column("num_running"), free_blocks=column("free_blocks"),
        used_blocks=column("used_blocks"), queued_blocks=column("queued_blocks"),
        cached_tokens=column("cached_tokens"), fits=column("fits", bool), holds_model=column("holds_model", bool),
        prompt_tokens=int(request[_ENTRY["prompt_tokens"]]), block_size=int(request[_ENTRY["block_size"]]),
        turn=int(request[_ENTRY["turn"]]), prefix_weight=prefix_weight, load_weight=load_weight, rng=rng)


class RouterPolicy(Policy):
    """Route each arrival by :attr:`router`'s rule."""

    decision = "route"
    stateless = True
    router: ClassVar[Router]

    def act(self, obs: Observation) -> np.int64:
        return np.int64(ROUTERS[self.router](route_state(obs)))

    def pool_overrides(self) -> dict[str, Any]:
        """The router it declares: a serving env built for this policy routes its arrivals by the same rule."""
        return {"router": self.router.value}


@register_policy
class RoundRobinRouter(RouterPolicy):
    name = "router-round-robin"
    router = Router.ROUND_ROBIN
    source = "BLIS (inference-sim) and every load balancer's baseline"
    rule = "replicas in rotation, one turn per arrival"


@register_policy
class LeastLoadedRouter(RouterPolicy):
    name = "router-least-loaded"
    router = Router.LEAST_LOADED
    source = "BLIS least-loaded; vLLM production-stack's session-free router"
    rule = "fewest queued + running requests"


@register_policy
class LeastKVRouter(RouterPolicy):
    name = "router-least-kv"
    router = Router.LEAST_KV
    source = "llm-d inference scheduler's KV-utilisation scorer alone"
    rule = "most free KV blocks"


@register_policy
class PrefixAffinityRouter(RouterPolicy):
    name = "router-prefix-affinity"
    router = Router.PREFIX_AFFINITY
    source = "SGLang cache-aware router; BLIS prefix-affinity"
    rule = "longest cached prefix of the prompt; misses and ties to the least loaded"


@dataclass(frozen=True)
class KVAwareParams(PolicyParams):
    prefix_weight: float = param(1.0, "cost per KV block the arrival must prefill (Dynamo's overlap weight)",
                                 positive_number)
    load_weight: float = param(1.0, "cost per KV block a replica holds in use or queued", positive_number)


@register_policy
class KVAwareRouter(RouterPolicy):
    name = "router-kv-aware"
    router = Router.KV_AWARE
    source = "NVIDIA Dynamo's KV router; llm-d's weighted prefix and load scorers"
    rule = "least prefix_weight x blocks to prefill + load_weight x blocks in use or queued"
    Params = KVAwareParams

    @staticmethod
    def search_space(trial: Any) -> dict[str, Any]:
        # Only the ratio of the weights decides (the cost is compared across replicas), so one is tuned.
        return {"prefix_weight": trial.suggest_float("prefix_weight", 0.01, 1000.0, log=True)}

    def act(self, obs: Observation) -> np.int64:
        p = self.params
        return np.int64(ROUTERS[self.router](route_state(obs, p.prefix_weight, p.load_weight)))

    def pool_overrides(self) -> dict[str, Any]:
        return {**super().pool_overrides(), "prefix_weight": self.params.prefix_weight,
                "load_weight": self.params.load_weight}


@dataclass(frozen=True)
class PowerOfTwoParams(PolicyParams):
    seed: int = param(0, "seed of the policy's own generator (restarted by reset)", non_negative_int)


@register_policy
class PowerOfTwoRouter(RouterPolicy):
    name = "router-power-of-two"
    router = Router.POWER_OF_TWO
    stateless = False
    source = "Mitzenmacher: The Power of Two Choices in Randomized Load Balancing (IEEE TPDS 2001); BLIS"
    rule = "two distinct replicas at random, the less loaded"
    Params = PowerOfTwoParams

    def reset(self) -> None:
        self.rng = np.random.default_rng(self.params.seed)

    def act(self, obs: Observation) -> np.int64:
        return np.int64(ROUTERS[self.router](route_state(obs, rng=self.rng)))
