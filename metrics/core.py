"""Episode metrics as pure functions of an :class:`~servegym.engine.EpisodeLog`."""

from __future__ import annotations

import numpy as np

from servegym.engine.log import STEP_FIELDS, EpisodeLog, State

PERCENTILES = (50, 95, 99)


def ttft(log: EpisodeLog) -> np.ndarray:
    """Time to first token (s) of every request that emitted one."""
    have = ~np.isnan(log.first_token_s)
    return log.first_token_s[have] - log.arrival_s[have]


def e2e_latency(log: EpisodeLog) -> np.ndarray:
    """End-to-end latency (s), arrival to last token, of every finished request."""
    done = log.state == State.FINISHED
    return log.finish_s[done] - log.arrival_s[done]


def inter_token_latencies(log: EpisodeLog) -> list[np.ndarray]:
    """Per request, the gaps (s) between consecutive output tokens (preemption stalls included)."""
    return [np.diff(times) for times in log.all_token_times()]


def itl_cv(gaps: np.ndarray) -> float:
    """Coefficient of variation std/mean of inter-token latencies pooled over all requests.

    The TWP paper reports ITL CV as the dispersion of token-to-token latency; servegym pools every gap of
    every request (population std). NaN when there are no gaps.
    """
    if gaps.size == 0 or gaps.mean() == 0:
        return float("nan")
    return float(gaps.std() / gaps.mean())


def percentiles(values: np.ndarray, prefix: str) -> dict[str, float]:
    if values.size == 0:
        return {f"{prefix}_p{p}": float("nan") for p in PERCENTILES}
    return {f"{prefix}_p{p}": float(v) for p, v in zip(PERCENTILES, np.percentile(values, PERCENTILES),
                                                       strict=True)}


def makespan(log: EpisodeLog) -> float:
    """Seconds from the first arrival to the end of the last iteration."""
    ends = [rows[-1][0] for rows in log.step_rows if rows]
    if not ends or log.num_requests == 0:
        return 0.0
    return float(max(ends) - log.arrival_s[0])


def goodput(log: EpisodeLog, ttft_slo_s: float, itl_slo_s: float) -> float:
    """Finished requests per second that met both SLOs: TTFT and mean inter-token latency (TPOT)."""
    span = makespan(log)
    if span <= 0:
        return 0.0
    done = np.flatnonzero(log.state == State.FINISHED)
    return float(np.count_nonzero(met_slo(log, done, ttft_slo_s, itl_slo_s)) / span)


def met_slo(log: EpisodeLog, ids: np.ndarray, ttft_slo_s: float, itl_slo_s: float) -> np.ndarray:
    """Per finished request in ``ids``: TTFT within ``ttft_slo_s`` and mean inter-token latency (TPOT) within
    ``itl_slo_s``. The one definition of a good request, for the goodput metric and the ``slo_goodput``
    reward."""
    first, finish, out = log.first_token_s[ids], log.finish_s[ids], log.num_output_tokens[ids]
    tpot = np.where(out > 1, (finish - first) / np.maximum(out - 1, 1), 0.0)
    return (first - log.arrival_s[ids] <= ttft_slo_s) & (tpot <= itl_slo_s)


def num_met_slo(log: EpisodeLog, ids: np.ndarray, ttft_slo_s: float, itl_slo_s: float) -> int:
    """How many of ``ids`` :func:`met_slo`. A few requests (one iteration's finishes) are checked one by one in
    plain floats, which give the same IEEE results as the arrays and cost less than a dozen array operations."""
    if len(ids) > 8:
        return int(np.count_nonzero(met_slo(log, ids, ttft_slo_s, itl_slo_s)))
    good = 0
    for r in ids.tolist():
        first, out = float(log.first_token_s[r]), int(log.num_output_tokens[r])
        tpot = (float(log.finish_s[r]) - first) / max(out - 1, 1) if out > 1 else 0.0
        good += first - float(log.arrival_s[r]) <= ttft_slo_s and tpot <= itl_slo_s
    return good


def censored_latency(log: EpisodeLog) -> np.ndarray:
    """Time in the system (s) of every request that arrived and was not rejected: arrival to finish, or to
    the episode's end for requests still waiting or running (right-censored). A policy that leaves requests
    waiting pays for them here, unlike :func:`e2e_latency`, which sees finished requests only."""
    arrived = (log.state != State.PENDING) & (log.state != State.REJECTED)
    end = log.arrival_s[0] + makespan(log) if log.num_requests else 0.0
    finish = np.where(log.state == State.FINISHED, log.finish_s, end)
    return (finish - log.arrival_s)[arrived]


def kv_utilisation(log: EpisodeLog) -> tuple[float, float]:
    """Time-weighted mean and the max of the used KV fraction after each step."""
    mean, _, peak = kv_utilisation_stats(log)
    return mean, peak


def kv_utilisation_stats(log: EpisodeLog) -> tuple[float, float, float]:
    """Time-weighted mean and standard deviation, and the max, of the used KV fraction: each step's
    fraction after it ran holds for that step's duration. The standard deviation measures how steady the
    cache runs (the flow-control paper's "more stable KV cache utilization")."""
    steps = log.steps()
    if steps.size == 0:
        return 0.0, 0.0, 0.0
    used = steps[:, STEP_FIELDS.index("num_used_blocks")] / log.kv_blocks(steps[:, STEP_FIELDS.index("container")])
    dt = steps[:, STEP_FIELDS.index("dt_s")]
    weights = dt if dt.sum() > 0 else np.ones_like(dt)
    # Elementwise products summed by numpy's pairwise sum, not np.dot: BLAS splits long dot products across
    # threads, so their last bits would depend on the thread count (a Ray worker runs one).
    mean = float((used * weights).sum() / weights.sum())
    std = float(np.sqrt(((used - mean) ** 2 * weights).sum() / weights.sum()))
    return mean, std, float(used.max())


def queue_growth_slope(log: EpisodeLog) -> float:
    """Least-squares slope (requests/s) of the waiting-queue length over time, summed over containers;
    about 0 when the system keeps up."""
    total = 0.0
    for container in range(log.num_containers):
        steps = log.steps(container)
        t, q = steps[:, STEP_FIELDS.index("end_s")], steps[:, STEP_FIELDS.index("num_waiting")]
        if t.size >= 2 and np.ptp(t) > 0:
            total += float(np.polyfit(t, q, 1)[0])
    return total


def prefix_hit_ratios(log: EpisodeLog) -> dict[str, float]:
    """Prompt tokens found cached at first admission over prompt tokens of the admitted requests: in all, and the
    host tier's part (NaN before any admission)."""
    admitted = ~np.isnan(log.admit_s)
    prompt = float(log.num_prompt_tokens[admitted].sum())
    if not prompt:
        return {"prefix_hit_ratio": float("nan"), "prefix_host_hit_ratio": float("nan")}
    host = float(log.cached_host_tokens[admitted].sum())
    return {"prefix_hit_ratio": (float(log.cached_gpu_tokens[admitted].sum()) + host) / prompt,
            "prefix_host_hit_ratio": host / prompt}


def summarize(log: EpisodeLog, ttft_slo_s: float = 2.0, itl_slo_s: float = 0.2) -> dict[str, float]:
    """The standard metric set of one episode."""
    gaps_per_request = inter_token_latencies(log)
    gaps = np.concatenate(gaps_per_request) if gaps_per_request else np.zeros(0)
    span = makespan(log)
    finished = int(np.count_nonzero(log.state == State.FINISHED))
    tokens = int(log.num_output_tokens[log.state == State.FINISHED].sum())
    kv_mean, kv_std, kv_max = kv_utilisation_stats(log)
    counts = log.counts()
    censored = censored_latency(log)
    out = {
        "num_requests": float(log.num_requests),
        "num_finished": float(finished),
        "num_rejected": float(counts["num_rejected"]),
        "num_unfinished": float(counts["num_waiting"] + counts["num_running"]),
        "makespan_s": span,
        "throughput_rps": finished / span if span > 0 else 0.0,
        "throughput_tps": tokens / span if span > 0 else 0.0,
        "goodput_rps": goodput(log, ttft_slo_s, itl_slo_s),
        **percentiles(ttft(log), "ttft"),
        "e2e_mean": float(e2e_latency(log).mean()) if finished else float("nan"),
        "e2e_mean_all_s": float(censored.mean()) if censored.size else float("nan"),
        "e2e_p95_all_s": float(np.percentile(censored, 95)) if censored.size else float("nan"),
        "num_arrived": float(counts["num_arrived"]),
        **percentiles(e2e_latency(log), "e2e"),
        "itl_mean": float(gaps.mean()) if gaps.size else float("nan"),
        **{k: v for k, v in percentiles(gaps, "itl").items() if not k.endswith("p95")},
        "itl_cv": itl_cv(gaps),
        "kv_util_mean": kv_mean,
        "kv_util_max": kv_max,
        "kv_util_std": kv_std,
        "num_preemptions": float(log.num_preemptions.sum()),
        **prefix_hit_ratios(log),
        "num_cold_starts": float(np.count_nonzero(log.cold_start)),
        "queue_slope_rps": queue_growth_slope(log),
    }
    return out
