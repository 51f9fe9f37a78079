"""Building a pool's backends from the env's arguments: a calibrated profile per container, a real model, or a
given instance."""

from __future__ import annotations

import warnings
from typing import Any

from servegym.backends.base import Backend
from servegym.backends.calibrated import CalibratedBackend
from servegym.backends.profile import Profile, engine_range_warnings, load_profile
from servegym.engine import EngineConfig

BACKENDS = ("calibrated", "torch")
"""The backends a name can ask for; anything else is a ``Backend`` instance."""


def make_backends(backend: Backend | str | None, profile: str | Profile, engine: EngineConfig, containers: int,
                  backend_options: dict[str, Any] | None = None,
                  latency_noise_cv: float | None = None, profiles: tuple[str, ...] = ()) -> tuple[list[Backend], float]:
    """One backend per container and the pool's cold start (s).

    ``backend``: None or ``"calibrated"`` prices iterations with ``profile`` (one :class:`CalibratedBackend`
    per container, or ``profiles[c]`` for container ``c`` when given: a heterogeneous cluster; warns where the
    engine's limits exceed a profile's measured range); ``"torch"`` runs a real
    model (``TorchBackend(**backend_options)``, sized by the engine's KV settings); an instance serves one
    container as it is.
    """
    if isinstance(backend, str) and backend not in BACKENDS:
        raise ValueError(f"backend must be 'calibrated', 'torch' or a Backend instance, got {backend!r}")
    if backend == "torch":
        from servegym.backends.torch_backend import TorchBackend

        backend = TorchBackend(**{"num_kv_blocks": engine.num_kv_blocks or 2048, "block_size": engine.block_size or 16,
                                  **(backend_options or {})})
    if backend is not None and backend != "calibrated":
        if containers != 1:
            raise ValueError("a backend instance serves one container; use profile= for a pool")
        return [backend], 0.0
    if profiles and len(profiles) != containers:
        raise ValueError(f"{len(profiles)} profiles for {containers} containers")
    chosen = {name: load_profile(name) for name in dict.fromkeys(profiles)} if profiles else \
        {"": profile if isinstance(profile, Profile) else load_profile(profile)}
    for prof in chosen.values():
        for line in engine_range_warnings(prof, engine.max_num_seqs, engine.max_num_batched_tokens):
            warnings.warn(line, RuntimeWarning, stacklevel=3)
    per_container = [chosen[name] for name in profiles] if profiles else [chosen[""]] * containers
    return ([CalibratedBackend(prof, noise_cv=latency_noise_cv) for prof in per_container],
            max(prof.cold_start_s for prof in chosen.values()))
