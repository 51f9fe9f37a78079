"""Routers: which container of a serverless pool receives an arriving request."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

import numpy as np


class Router(StrEnum):
    LEAST_LOADED = "least_loaded"
    """Fewest queued + running requests, warm or not (a cold pick pays a cold start)."""
    ROUND_ROBIN = "round_robin"
    """Containers in rotation, whatever their load or warmth."""
    WARM_FIRST = "warm_first"
    """ServerlessLLM-style locality: the least loaded container that holds the model (warm or loading);
    a cold one only when none does."""


RouteFn = Callable[[np.ndarray, np.ndarray, int], int]


def least_loaded(load: np.ndarray, holds_model: np.ndarray, turn: int) -> int:
    return int(np.argmin(load))


def round_robin(load: np.ndarray, holds_model: np.ndarray, turn: int) -> int:
    return turn % load.size


def warm_first(load: np.ndarray, holds_model: np.ndarray, turn: int) -> int:
    if holds_model.any():
        return int(np.argmin(np.where(holds_model, load, np.iinfo(np.int64).max)))
    return int(np.argmin(load))


ROUTERS: dict[Router, RouteFn] = {
    Router.LEAST_LOADED: least_loaded,
    Router.ROUND_ROBIN: round_robin,
    Router.WARM_FIRST: warm_first,
}
