"""Pure metric functions over episode logs."""

from servegym.metrics.core import (
    censored_latency,
    e2e_latency,
    goodput,
    inter_token_latencies,
    itl_cv,
    kv_utilisation,
    kv_utilisation_stats,
    makespan,
    met_slo,
    num_met_slo,
    percentiles,
    queue_growth_slope,
    summarize,
    ttft,
)
from servegym.metrics.registry import METRICS, Metric, metric

__all__ = [
    "METRICS",
    "Metric",
    "censored_latency",
    "e2e_latency",
    "goodput",
    "inter_token_latencies",
    "itl_cv",
    "kv_utilisation",
    "kv_utilisation_stats",
    "makespan",
    "met_slo",
    "metric",
    "num_met_slo",
    "percentiles",
    "queue_growth_slope",
    "summarize",
    "ttft",
]
