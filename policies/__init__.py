"""Hand-coded scheduling policies: one file each, registered by name in :data:`POLICIES`."""

from servegym.policies import (  # noqa: F401  (each module registers its policy)
    alpha_protection,
    amin,
    clairvoyant_greedy,
    dynamic_batch,
    fcfs,
    flow_control,
    lpm,
    mc,
    mc_sf,
    priority,
    random_admit,
    round_robin,
    routers,
    sarathi,
    scorer,
    serverless_llm,
    twp,
    vllm,
)
from servegym.policies.base import (
    POLICIES,
    Policy,
    admit_first,
    deciding,
    engine_feature,
    make_policy,
    output_estimate,
    policies_table,
    ranks_action,
    register_policy,
)

__all__ = [
    "POLICIES",
    "Policy",
    "admit_first",
    "deciding",
    "engine_feature",
    "make_policy",
    "output_estimate",
    "policies_table",
    "ranks_action",
    "register_policy",
]
