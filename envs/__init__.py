"""Gymnasium environments over the serving engine."""

from servegym.envs.observation import (
    ENGINE_FEATURES,
    ENGINE_INDEX,
    POOL_FEATURES,
    POOL_INDEX,
    QUEUE_FEATURES,
    QUEUE_INDEX,
    RUNNING_INDEX,
    queue_matrix,
    running_matrix,
)
from servegym.envs.serving import REWARDS, ServingEnv

__all__ = [
    "ENGINE_FEATURES",
    "ENGINE_INDEX",
    "POOL_FEATURES",
    "POOL_INDEX",
    "QUEUE_FEATURES",
    "QUEUE_INDEX",
    "REWARDS",
    "RUNNING_INDEX",
    "ServingEnv",
    "queue_matrix",
    "running_matrix",
]
