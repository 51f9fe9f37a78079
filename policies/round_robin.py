"""Round-Robin routing across the container pool, FCFS admission inside each container."""

from __future__ import annotations

from typing import Any

from servegym.policies.base import register_policy
from servegym.policies.fcfs import FCFS


@register_policy
class RoundRobin(FCFS):
    """FCFS admission; the pool's router sends arrivals to containers in rotation."""

    name = "round-robin"
    source = "TWP paper baseline"
    rule = "routes to containers in rotation; FCFS admission in each"

    def pool_overrides(self) -> dict[str, Any]:
        return {"router": "round_robin"}
