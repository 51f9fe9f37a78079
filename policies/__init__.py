"""Hand-coded scheduling policies: one file each, registered by name in :data:`POLICIES`."""

from servegym.policies import fcfs  # noqa: F401  (registers the policy)
from servegym.policies.base import POLICIES, Policy, admit_first, engine_feature, make_policy, register_policy

__all__ = ["POLICIES", "Policy", "admit_first", "engine_feature", "make_policy", "register_policy"]
