"""Workloads: arrival processes, length distributions, trace replay and the named scenarios."""

from servegym.workloads.arrivals import Gamma, MarkovModulated, Poisson
from servegym.workloads.base import PrefixChains, RequestSpec, Workload
from servegym.workloads.lengths import Choice, Empirical, PairedEmpirical, RangeMix
from servegym.workloads.mooncake import MooncakeWorkload, mooncake_trace, read_mooncake, trace_hit_ratio
from servegym.workloads.scenarios import WORKLOADS, make_workload
from servegym.workloads.sessions import SessionWorkload
from servegym.workloads.synthetic import FixedWorkload, SyntheticWorkload
from servegym.workloads.trace import TraceError, TraceWorkload, bundled_trace

__all__ = [
    "WORKLOADS",
    "Choice",
    "Empirical",
    "FixedWorkload",
    "Gamma",
    "MarkovModulated",
    "MooncakeWorkload",
    "PairedEmpirical",
    "Poisson",
    "PrefixChains",
    "RangeMix",
    "RequestSpec",
    "SessionWorkload",
    "SyntheticWorkload",
    "TraceError",
    "TraceWorkload",
    "Workload",
    "bundled_trace",
    "make_workload",
    "mooncake_trace",
    "read_mooncake",
    "trace_hit_ratio",
]
