"""What a tuning trial optimises, computed from episode metrics."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servegym.metrics import metric


@dataclass(frozen=True)
class Objective:
    """A named objective: metric names, optimisation directions, and how to score one episode."""

    name: str
    directions: tuple[str, ...]
    description: str

    def score(self, metrics: dict[str, float]) -> tuple[float, ...]:
        return OBJECTIVE_SCORES[self.name](metrics)

    @property
    def multi(self) -> bool:
        return len(self.directions) > 1


def _finite(value: float, worst: float) -> float:
    return float(value) if np.isfinite(value) else worst


PARETO_METRICS = ("throughput_rps", "ttft_p99", "itl_cv")
"""The ``pareto`` objective's metrics, in order (directions from ``servegym.metrics.METRICS``)."""

OBJECTIVE_SCORES = {
    "goodput": lambda m: (_finite(m["goodput_rps"], 0.0),),
    "cost": lambda m: (_finite(m["ttft_p99"], 1e6) + 10.0 * _finite(m["itl_p99"], 1e5) + 20.0 * m["num_unfinished"],),
    "return": lambda m: (_finite(m["episode_return"], -1e12),),
    "pareto": lambda m: tuple(_finite(m[name], worst) for name, worst in zip(PARETO_METRICS, (0.0, 1e6, 1e3),
                                                                              strict=True)),
}

OBJECTIVES = {
    "goodput": Objective("goodput", (metric("goodput_rps").direction,),
                         "requests/s finishing within the TTFT and ITL SLOs (defaults: 2 s, 0.2 s)"),
    "cost": Objective("cost", ("minimize",),
                      "P99 TTFT (s) + 10 x P99 ITL (s) + 20 per request left unfinished when the episode ends"),
    "return": Objective("return", (metric("episode_return").direction,),
                        "the episode return in the env's reward units (with --task: the leaderboard's ranking)"),
    "pareto": Objective("pareto", tuple(metric(name).direction for name in PARETO_METRICS),
                        " vs ".join(metric(m).header for m in PARETO_METRICS) + ", reported as a Pareto front"),
}


def get_objective(name: str) -> Objective:
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise ValueError(f"unknown objective {name!r}; choose from {sorted(OBJECTIVES)}") from None
