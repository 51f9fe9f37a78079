"""Every metric declared once: its name, header, unit, format, direction and definition.

``summarize`` (``metrics/core.py``) computes them; the run summary, the experiment report, fidelity, tuning's
objectives and report, and the leaderboard read their headers, formats and directions from here. Adding a
metric is one :class:`Metric` below plus its computation in ``summarize`` (``tests/test_metrics_registry.py``
checks that the two name the same set).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """One metric. Values are stored in base units (seconds, requests, tokens); ``scale`` converts them to the
    unit shown (``1e3`` shows seconds as ms)."""

    name: str
    header: str
    unit: str
    decimals: int
    higher_is_better: bool | None
    """None for a count that is neither (requests, makespan)."""
    definition: str
    scale: float = 1.0
    signed: bool = False
    """Print a sign (a rate of change)."""

    def format(self, value: float) -> str:
        """``value`` (base units) as shown in tables: scaled, to ``decimals`` places, ``n/a`` for NaN."""
        if math.isnan(value):
            return "n/a"
        return f"{value * self.scale:{'+' if self.signed else ''}.{self.decimals}f}"

    @property
    def direction(self) -> str:
        """Optuna's word for it: ``maximize`` or ``minimize``."""
        if self.higher_is_better is None:
            raise ValueError(f"metric {self.name!r} has no direction")
        return "maximize" if self.higher_is_better else "minimize"


_DECLARED = (
    Metric("num_requests", "requests", "", 0, None, "requests in the workload"),
    Metric("num_arrived", "arrived", "", 0, None, "requests that arrived before the episode ended"),
    Metric("num_finished", "finished", "", 0, True, "requests that emitted their last token"),
    Metric("num_rejected", "rejected", "", 0, False, "requests refused on arrival (they can never fit)"),
    Metric("num_unfinished", "unfinished", "", 0, False, "requests waiting or running when the episode ended"),
    Metric("makespan_s", "makespan (s)", "s", 2, None, "first arrival to last finish"),
    Metric("throughput_rps", "throughput (req/s)", "req/s", 3, True, "finished requests over the makespan"),
    Metric("throughput_tps", "throughput (tok/s)", "tok/s", 1, True,
           "output tokens of finished requests over the makespan"),
    Metric("goodput_rps", "goodput (req/s)", "req/s", 3, True,
           "requests finishing within both SLOs (TTFT and every ITL) over the makespan"),
    Metric("ttft_p50", "TTFT P50 (s)", "s", 3, False, "median time from arrival to first token"),
    Metric("ttft_p95", "TTFT P95 (s)", "s", 3, False, "95th percentile of time to first token"),
    Metric("ttft_p99", "TTFT P99 (s)", "s", 3, False, "99th percentile of time to first token"),
    Metric("e2e_mean", "E2E mean (s)", "s", 3, False, "mean arrival-to-last-token latency of finished requests"),
    Metric("e2e_p50", "E2E P50 (s)", "s", 3, False, "median end-to-end latency of finished requests"),
    Metric("e2e_p95", "E2E P95 (s)", "s", 3, False, "95th percentile end-to-end latency of finished requests"),
    Metric("e2e_p99", "E2E P99 (s)", "s", 3, False, "99th percentile end-to-end latency of finished requests"),
    Metric("e2e_mean_all_s", "E2E mean, all (s)", "s", 3, False,
           "mean end-to-end latency over every arrived, unrejected request, the unfinished counted to the end"),
    Metric("e2e_p95_all_s", "E2E P95, all (s)", "s", 3, False, "95th percentile of the same censored latencies"),
    Metric("itl_mean", "ITL mean (ms)", "ms", 1, False, "mean gap between consecutive output tokens", scale=1e3),
    Metric("itl_p50", "ITL P50 (ms)", "ms", 1, False, "median inter-token gap", scale=1e3),
    Metric("itl_p99", "ITL P99 (ms)", "ms", 1, False, "99th percentile inter-token gap", scale=1e3),
    Metric("itl_cv", "ITL CV", "", 3, False, "coefficient of variation of the inter-token gaps"),
    Metric("kv_util_mean", "KV util mean", "", 3, None, "mean fraction of KV blocks in use, time-weighted"),
    Metric("kv_util_max", "KV util max", "", 3, None, "largest fraction of KV blocks in use"),
    Metric("kv_util_std", "KV util std", "", 3, None, "standard deviation of the KV fraction in use"),
    Metric("num_preemptions", "preemptions", "", 0, False, "evictions by recompute"),
    Metric("prefix_hit_ratio", "prefix hit", "", 3, True,
           "prompt tokens found cached (GPU or host) at first admission over prompt tokens of admitted requests"),
    Metric("prefix_host_hit_ratio", "host hit", "", 3, None,
           "the part of the prefix hit ratio found in the host tier (copied back, not recomputed)"),
    Metric("num_cold_starts", "cold starts", "", 0, False, "requests that waited for a container's model to load"),
    Metric("queue_slope_rps", "queue growth (req/s)", "req/s", 3, False,
           "least-squares slope of the waiting queue's length over time", signed=True),
    Metric("episode_return", "return", "", 1, True,
           "the undiscounted sum of the env's rewards (minus request-seconds, or SLO-good requests)"),
)
METRICS: dict[str, Metric] = {m.name: m for m in _DECLARED}
"""Every metric by name."""
EPISODE_METRICS = frozenset({"episode_return"})
"""Metrics of the env's rewards rather than of the log (``summarize`` does not compute them)."""


def metric(name: str) -> Metric:
    """The declared metric ``name``; an unknown name is an error that lists the known ones."""
    try:
        return METRICS[name]
    except KeyError:
        raise KeyError(f"unknown metric {name!r}; declared: {sorted(METRICS)}") from None
