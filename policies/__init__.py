"""Hand-coded scheduling policies: one file each, registered by name in :data:`POLICIES`."""

from servegym.policies import fcfs, flow_control, twp  # noqa: F401  (each module registers its policy)
from servegym.policies.base import (
    POLICIES,
    Policy,
    admit_first,
    engine_feature,
    make_policy,
    output_estimate,
    ranks_action,
    register_policy,
)

__all__ = [
    "POLICIES",
    "Policy",
    "admit_first",
    "engine_feature",
    "make_policy",
    "output_estimate",
    "ranks_action",
    "register_policy",
]
