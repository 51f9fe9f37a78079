"""Gymnasium environments over the serving engine."""

from servegym.envs.mixture import MixtureEnv, make_serving_env
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
from servegym.envs.tasks import TASKS, TEST_SEEDS, TRAIN_SEEDS, VALIDATION_SEEDS, Task, get_task

__all__ = [
    "ENGINE_FEATURES",
    "ENGINE_INDEX",
    "POOL_FEATURES",
    "POOL_INDEX",
    "QUEUE_FEATURES",
    "QUEUE_INDEX",
    "REWARDS",
    "RUNNING_INDEX",
    "TASKS",
    "TEST_SEEDS",
    "TRAIN_SEEDS",
    "VALIDATION_SEEDS",
    "MixtureEnv",
    "ServingEnv",
    "Task",
    "get_task",
    "make_serving_env",
    "queue_matrix",
    "running_matrix",
]
