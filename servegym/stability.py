"""The flow-control paper's stability conditions, evaluated for a workload on a profile.

A request with prompt ``l`` and output ``o`` holds ``l + t`` KV tokens at its ``t``-th decode step, so it
occupies ``l*o + (o + o**2)/2`` token-steps in all. With ``lambda`` arrivals per step and ``M`` KV tokens:

* necessary for any stable policy: ``lambda * E[l*o + (o + o**2)/2] <= M``;
* sufficient for flow control with budget ``b``: ``b * E[l*o + (o + o**2)/2] <= (1 - eps) * M``.

Arrivals are counted per engine step, so a rate in requests/s is converted with the step latency at the
concurrency the load implies (Little's law on the profile's latency model).

Memory is not the only limit: the GPU must also compute the work. :func:`compute_capacity` is the ideal
throughput (requests/s) at the largest batch memory and ``max_num_seqs`` allow, each request costing its share
of ``E[o]`` decode steps plus its prompt's marginal prefill time. It is an upper bound (real schedulers pack
less perfectly); a rate above it is unstable whatever the memory says.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servegym.backends import LatencyModel, Profile, TokenLatencyModel
from servegym.engine import EngineConfig
from servegym.workloads import Workload


def token_steps(prompt: np.ndarray, output: np.ndarray) -> float:
    """``E[l*o + (o + o**2)/2]``: mean KV token-steps one request occupies."""
    prompt, output = np.asarray(prompt, dtype=np.float64), np.asarray(output, dtype=np.float64)
    return float(np.mean(prompt * output + (output + output**2) / 2.0))


def necessary_condition(rate_per_step: float, mean_token_steps: float, kv_tokens: float) -> bool:
    return rate_per_step * mean_token_steps <= kv_tokens


def sufficient_condition(budget: float, mean_token_steps: float, kv_tokens: float, eps: float) -> bool:
    return budget * mean_token_steps <= (1.0 - eps) * kv_tokens


def suggest_budget(mean_token_steps: float, kv_tokens: float, eps: float) -> float:
    """The largest activation budget ``b`` that meets the sufficient condition."""
    return (1.0 - eps) * kv_tokens / mean_token_steps


def class_budgets(prompts: list[int], outputs: list[int], shares: list[float], kv_tokens: float,
                  eps: float) -> list[tuple[int, float]]:
    """Per-class budgets ``b_k`` for known lengths that meet the sufficient condition with equality:
    ``sum_k b_k c_k = (1 - eps) M`` with ``b_k`` proportional to class ``k``'s share of arrivals, where
    ``c_k = l_k o_k + (o_k + o_k^2)/2``. Returns ``(output length, b_k)`` pairs (flow control's
    ``class_budgets``)."""
    if not (len(prompts) == len(outputs) == len(shares)) or not shares:
        raise ValueError("need one prompt, output and share per class")
    if not 0 <= eps < 1 or any(p <= 0 for p in shares):
        raise ValueError("shares must be > 0 and eps in [0, 1)")
    total = sum(shares)
    cost = sum(share / total * token_steps(np.array([prompt]), np.array([o]))
               for prompt, o, share in zip(prompts, outputs, shares, strict=True))
    scale = (1.0 - eps) * kv_tokens / cost
    return [(int(o), share / total * scale) for o, share in zip(outputs, shares, strict=True)]


def step_time_at_load(rate_per_s: float, mean_output: float, model: LatencyModel | TokenLatencyModel,
                      max_batch: float) -> float:
    """Decode step latency at the concurrency ``B = rate * step * E[o]`` (fixed point, capped at max_batch)."""
    step = model.l_min_s
    for _ in range(100):
        batch = min(max_batch, rate_per_s * step * mean_output)
        new = model.decode_s(round(batch))
        if abs(new - step) < 1e-12:
            break
        step = new
    return step


def compute_capacity(prompt: np.ndarray, output: np.ndarray, model: LatencyModel | TokenLatencyModel,
                     batch: float) -> float:
    """Ideal requests/s at decode batch ``batch``: ``1 / (E[o] * decode_s(B) / B + E[prefill_s(l) - decode_s(1)])``."""
    batch = max(1, round(batch))
    context = float(np.mean(prompt) + np.mean(output) / 2.0)
    decode = float(np.mean(output)) * model.decode_s(batch, context) / batch
    base = model.decode_s(1)
    prefill = float(np.mean([max(0.0, model.prefill_s(int(p)) - base) for p in prompt]))
    return 1.0 / (decode + prefill)


@dataclass(frozen=True)
class StabilityReport:
    rate_per_s: float
    step_s: float
    rate_per_step: float
    mean_token_steps: float
    kv_tokens: int
    eps: float
    capacity_rps: float = float("inf")
    """Ideal compute throughput (:func:`compute_capacity`)."""
    rate_source: str = "estimated from one sampled episode"

    @property
    def compute_load(self) -> float:
        """Arrival rate over the ideal compute throughput: above 1 the queue grows whatever the policy."""
        return self.rate_per_s / self.capacity_rps

    @property
    def stable(self) -> bool:
        """Neither memory nor compute is overloaded (the necessary conditions; not a guarantee)."""
        return self.necessary_ok and self.compute_load <= 1.0

    @property
    def load_ratio(self) -> float:
        """``lambda * E[...] / M``: above 1 no policy keeps the queue bounded."""
        return self.rate_per_step * self.mean_token_steps / self.kv_tokens

    @property
    def necessary_ok(self) -> bool:
        return necessary_condition(self.rate_per_step, self.mean_token_steps, self.kv_tokens)

    @property
    def suggested_budget(self) -> float:
        return suggest_budget(self.mean_token_steps, self.kv_tokens, self.eps)

    def lines(self) -> list[str]:
        return [
            f"arrival rate          {self.rate_per_s:.3f} req/s ({self.rate_source}) = "
            f"{self.rate_per_step:.4f} req/step (step {self.step_s * 1e3:.1f} ms at the implied batch)",
            f"E[l*o + (o+o^2)/2]    {self.mean_token_steps:,.0f} token-steps per request",
            f"KV memory M           {self.kv_tokens:,} tokens",
            f"load ratio            {self.load_ratio:.3f} "
            f"(necessary condition {'met' if self.necessary_ok else 'VIOLATED'})",
            f"compute capacity      {self.capacity_rps:.2f} req/s ideal at full batch; compute load "
            f"{self.compute_load:.3f}",
            f"suggested b           {self.suggested_budget:.3f} activations/step (eps = {self.eps})",
            f"verdict               {'stable' if self.stable else 'UNSTABLE'}: memory load {self.load_ratio:.2f}, "
            f"compute load {self.compute_load:.2f} (both must stay <= 1)",
        ]


def analyse(prompt: np.ndarray, output: np.ndarray, rate_per_s: float, kv_tokens: int,
            model: LatencyModel | TokenLatencyModel,
            max_batch: int, eps: float = 0.1, rate_source: str = "given") -> StabilityReport:
    """Stability report for requests like ``(prompt, output)`` arriving at ``rate_per_s``."""
    if not 0 <= eps < 1:
        raise ValueError(f"eps must be in [0, 1), got {eps}")
    # Concurrency is capped by max_num_seqs and by how many average requests the KV memory holds.
    mean_footprint = float(np.mean(prompt) + np.mean(output) / 2.0)
    batch = min(max_batch, kv_tokens / mean_footprint)
    step = step_time_at_load(rate_per_s, float(np.mean(output)), model, batch)
    return StabilityReport(rate_per_s, step, rate_per_s * step, token_steps(prompt, output), kv_tokens, eps,
                           compute_capacity(prompt, output, model, batch), rate_source)


def workload_stability(workload: Workload, profile: Profile, config: EngineConfig, eps: float = 0.1,
                       seed: int = 0) -> StabilityReport:
    """Stability report of ``workload`` on ``profile`` with ``config``'s KV and caps: lengths from one sampled
    episode, the rate from the workload's nominal ``mean_rate()`` when it has one (else estimated)."""
    spec = workload.sample(np.random.default_rng(seed))
    if len(spec) < 2:
        raise ValueError("the workload needs at least two requests to estimate its rate")
    nominal = getattr(workload, "mean_rate", None)
    if nominal is not None and not getattr(workload, "random_window", False):
        rate, source = float(nominal()), "the workload's nominal rate"
    else:
        span = float(spec.arrival_s[-1] - spec.arrival_s[0])
        rate = (len(spec) - 1) / span if span > 0 else float("inf")
        source = "estimated from one sampled episode"
    kv_tokens = (config.num_kv_blocks or profile.num_kv_blocks) * (config.block_size or profile.block_size)
    output = np.minimum(spec.num_output_tokens, config.max_tokens)
    return analyse(spec.num_prompt_tokens, output, rate, kv_tokens, profile.latency, config.max_num_seqs, eps,
                   source)
