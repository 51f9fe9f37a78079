"""Backends execute engine iterations: a calibrated latency model, or (extra ``torch``) a real model."""

from servegym.backends.base import Backend, StepBatch
from servegym.backends.calibrated import CalibratedBackend, step_latency
from servegym.backends.profile import LatencyModel, Profile, ProfileError, load_profile, shipped_profiles
from servegym.backends.token_model import TokenLatencyModel

DEFAULT_PROFILE = "a100-llama3-8b"
"""Llama-3-8B on one A100-80GB, built from measured tables (``servegym profile show a100-llama3-8b``)."""

__all__ = [
    "DEFAULT_PROFILE",
    "Backend",
    "CalibratedBackend",
    "LatencyModel",
    "Profile",
    "ProfileError",
    "StepBatch",
    "TokenLatencyModel",
    "load_profile",
    "shipped_profiles",
    "step_latency",
]
