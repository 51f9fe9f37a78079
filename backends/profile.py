"""Latency profiles: versioned JSON files with the calibrated model's parameters and their provenance."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from servegym.backends.base import BatchTotals, StepBatch, batch_totals
from servegym.backends.profile_limits import (
    ProfileValueError,
    check_capacity,
    check_hardware,
    check_noise,
    check_term_seconds,
)
from servegym.backends.runtimes import LEGACY_RUNTIME, RUNTIMES
from servegym.backends.token_model import TokenLatencyModel

PROFILES_DIR = Path(__file__).parent / "profiles"
"""The profiles bundled with the package (a folder on disk: the package installs unzipped)."""
SCHEMA_VERSIONS = (1, 2)
"""Schema 1: the batch-keyed model (:class:`LatencyModel`); schema 2: the token-keyed
:class:`~servegym.backends.token_model.TokenLatencyModel`. Both load."""


class ProfileError(ValueError):
    """A profile file is missing, malformed, or holds an invalid value."""


_UNITS = {"l_min_s": "iteration", "alpha_s": "decoding request beyond B0", "prefill_s_per_token": "prompt token",
          "prefill_s_per_token_context": "query-key pair", "decode_s_per_context_token": "KV token read"}
"""What each schema-1 coefficient charges for: each is bounded by ``profile_limits.MAX_TERM_S``."""


@dataclass(frozen=True)
class LatencyModel:
    """Step latency ``l(B) + prefill + context terms``, ``l(B) = l_min + alpha * max(0, B - B0)``."""

    l_min_s: float = field(metadata={"help": "flat decode step latency up to the saturation batch"})
    saturation_batch: int = field(metadata={"help": "B0: decode batch size up to which latency stays l_min"})
    alpha_s: float = field(metadata={"help": "added seconds per decoding request beyond B0"})
    prefill_s_per_token: float = field(metadata={"help": "seconds per prompt token ingested in the step"})
    prefill_s_per_token_context: float = field(
        default=0.0, metadata={"help": "seconds per (chunk token x attention context token)"}
    )
    decode_s_per_context_token: float = field(
        default=0.0, metadata={"help": "seconds per KV token read by the decoding requests"}
    )
    noise_cv: float = field(default=0.0, metadata={"help": "coefficient of variation of multiplicative noise"})

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ProfileError(f"latency.{name} must be a finite number, got {value!r}")
            if value < 0:
                raise ProfileError(f"latency.{name} must be >= 0, got {value!r}")
        if self.l_min_s <= 0:
            raise ProfileError(f"latency.l_min_s must be > 0, got {self.l_min_s}")
        if not isinstance(self.saturation_batch, int) or self.saturation_batch < 1:
            raise ProfileError(f"latency.saturation_batch must be an int >= 1, got {self.saturation_batch!r}")
        try:
            for name, unit in _UNITS.items():
                check_term_seconds(name, getattr(self, name), unit)
            check_noise(self.noise_cv)
        except ProfileValueError as err:
            raise ProfileError(f"latency.{err}") from None

    def step_s(self, decode_batch: int, prefill_tokens: float = 0.0, prefill_attention: float = 0.0,
               decode_context: float = 0.0) -> float:
        """Noise-free latency of one iteration.

        ``l(B) = l_min + alpha * max(0, B - B0)`` for ``B`` decoding requests, plus
        ``prefill_s_per_token * prefill_tokens``, plus ``prefill_s_per_token_context * prefill_attention``
        (the sum over chunk tokens of the context each attends to), plus
        ``decode_s_per_context_token * decode_context`` (KV tokens read by the decodes).
        """
        excess = decode_batch - self.saturation_batch
        latency = self.l_min_s + (self.alpha_s * excess if excess > 0 else 0.0)
        return (
            latency
            + self.prefill_s_per_token * prefill_tokens
            + self.prefill_s_per_token_context * prefill_attention
            + self.decode_s_per_context_token * decode_context
        )

    def iteration_s(self, batch: StepBatch) -> float:
        return self.totals_s(batch_totals(batch))

    def totals_s(self, t: BatchTotals) -> float:
        """:meth:`iteration_s` of any batch with these totals."""
        attention = t.prefill_pairs if self.prefill_s_per_token_context else 0.0
        context = t.decode_context if self.decode_s_per_context_token else 0.0
        return self.step_s(t.num_decodes, t.prefill_tokens, attention, context)

    def decode_s(self, batch: int, context: float = 0.0) -> float:
        """An iteration of ``batch`` decoding requests, each holding ``context`` KV tokens."""
        return self.step_s(batch, 0.0, 0.0, batch * context)

    def prefill_s(self, prompt: int, batch: int = 1) -> float:
        """An iteration that prefills ``batch`` whole prompts of ``prompt`` tokens, no decodes."""
        return self.step_s(0, batch * prompt, batch * prompt * (prompt + 1) / 2.0)


@dataclass(frozen=True)
class Profile:
    """A calibrated-backend profile: the latency model, the KV cache size and where they came from."""

    name: str
    latency: LatencyModel | TokenLatencyModel
    num_kv_blocks: int
    block_size: int
    cold_start_s: float
    provenance: dict[str, Any]
    runtime: str | None = None
    """The serving runtime the terms model (:mod:`servegym.backends.runtimes`); None for schema 1, whose single
    model is whatever its source measured or stated."""

    def to_json(self) -> dict[str, Any]:
        token = isinstance(self.latency, TokenLatencyModel)
        latency = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self.latency).items()
                   if not (k == "cpu_tail_s_per_row" and v is None) and not (k in LONG_CONTEXT and v == 0.0)}
        data = {
            "schema_version": 2 if token else 1,
            "name": self.name,
            "provenance": self.provenance,
            "latency": latency,
            "kv_cache": {"num_blocks": self.num_kv_blocks, "block_size": self.block_size},
            "cold_start_s": self.cold_start_s,
        }
        if self.runtime is not None:
            data["runtime"] = self.runtime
        return data

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")


LONG_CONTEXT = ("long_context_tokens", "long_context_s_per_token", "long_context_s_per_row_token")
"""The long-context term's fields: written only where calibration fitted one (0: absent from the file)."""
_TOP_KEYS = {"schema_version", "name", "provenance", "latency", "kv_cache", "cold_start_s"}
_OPTIONAL_TOP_KEYS = {"runtime"}
_PROVENANCE_KEYS = {"hardware", "model", "method", "date"}


def _check_keys(where: str, obj: Any, required: set[str], optional: set[str] = frozenset()) -> None:
    if not isinstance(obj, dict):
        raise ProfileError(f"{where}: expected an object, got {type(obj).__name__}")
    unknown = set(obj) - required - optional
    if unknown:
        raise ProfileError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(required | optional)}")
    missing = required - set(obj)
    if missing:
        raise ProfileError(f"{where}: missing key(s) {sorted(missing)}")


def profile_from_dict(data: Any, source: str = "<dict>") -> Profile:
    """Validate a parsed profile; every error names ``source`` and the offending key."""
    try:
        _check_keys(source, data, _TOP_KEYS, _OPTIONAL_TOP_KEYS)
        version = data["schema_version"]
        if isinstance(version, bool) or version not in SCHEMA_VERSIONS:
            raise ProfileError(f"schema_version {version!r} unsupported (supported: {list(SCHEMA_VERSIONS)})")
        prov = data["provenance"]
        if not isinstance(prov, dict) or not set(prov) >= _PROVENANCE_KEYS:
            raise ProfileError(f"provenance must be an object with at least {sorted(_PROVENANCE_KEYS)}")
        lat = data["latency"]
        if version == 1:
            _check_keys("latency", lat, {"l_min_s", "saturation_batch", "alpha_s", "prefill_s_per_token"},
                        {"prefill_s_per_token_context", "decode_s_per_context_token", "noise_cv"})
            latency: LatencyModel | TokenLatencyModel = LatencyModel(**lat)
        else:
            names = {f.name for f in fields(TokenLatencyModel)}
            optional = {"noise_cv", "launch_floor_s", "cpu_tail_s_per_row", "cpu_s_mixed_step", *LONG_CONTEXT}
            _check_keys("latency", lat, names - optional, optional)
            try:
                latency = TokenLatencyModel(**lat)
                check_hardware(latency.memory_bandwidth_bytes_s, latency.decode_bandwidth_bytes_s,
                               latency.peak_flops_s, latency.prefill_flops_s)
            except ProfileValueError as err:
                raise ProfileError(f"latency.{err}") from None
        kv = data["kv_cache"]
        _check_keys("kv_cache", kv, {"num_blocks", "block_size"})
        for key in ("num_blocks", "block_size"):
            value = kv[key]
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ProfileError(f"kv_cache.{key} must be a positive int, got {value!r}")
        cold = data["cold_start_s"]
        if isinstance(cold, bool) or not isinstance(cold, int | float) or not math.isfinite(cold) or cold < 0:
            raise ProfileError(f"cold_start_s must be a finite number >= 0, got {cold!r}")
        if not isinstance(data["name"], str) or not data["name"]:
            raise ProfileError("name must be a non-empty string")
        try:
            check_capacity(kv["num_blocks"], kv["block_size"], cold)
        except ProfileValueError as err:
            raise ProfileError(str(err)) from None
        runtime = data.get("runtime", LEGACY_RUNTIME if version == 2 else None)
        if version == 1 and runtime is not None:
            raise ProfileError("runtime: a schema-1 profile has one model and names no runtime")
        if version == 2 and runtime not in RUNTIMES:
            raise ProfileError(f"runtime {runtime!r} unknown; known: {sorted(RUNTIMES)}")
        return Profile(
            name=data["name"],
            latency=latency,
            num_kv_blocks=kv["num_blocks"],
            block_size=kv["block_size"],
            cold_start_s=float(cold),
            provenance=dict(prov),
            runtime=runtime,
        )
    except ProfileError as err:
        if str(err).startswith(source):
            raise
        raise ProfileError(f"{source}: {err}") from None


def shipped_profiles() -> list[str]:
    """Names of the profiles bundled with the package."""
    return sorted(p.name.removesuffix(".json") for p in PROFILES_DIR.iterdir() if p.name.endswith(".json"))


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a bundled profile by name, or any profile file by path. ``NAME@RUNTIME`` (say
    ``h100-llama2-70b-tp4@eager``) is the same GPU, model and TP built for another serving runtime."""
    if isinstance(name_or_path, str) and "@" in name_or_path:
        base, runtime = name_or_path.rsplit("@", 1)
        return with_runtime(load_profile(base), runtime)
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        if not path.is_file():
            raise ProfileError(f"profile file {path} does not exist")
        text, source = path.read_text(), str(path)
    else:
        resource = PROFILES_DIR / f"{name_or_path}.json"
        if not resource.is_file():
            raise ProfileError(f"unknown profile {name_or_path!r}; shipped: {shipped_profiles()}")
        text, source = resource.read_text(), f"profile {name_or_path!r}"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ProfileError(f"{source}: invalid JSON at line {err.lineno} column {err.colno}: {err.msg}") from None
    return profile_from_dict(data, source)


def with_runtime(profile: Profile, runtime: str) -> Profile:
    """``profile`` as the serving runtime ``runtime`` would run it: rebuilt from the bundled tables for profiles
    that ``servegym profile build`` made (their provenance names the GPU, model and TP); any other profile
    describes only its own runtime."""
    if runtime not in RUNTIMES:
        raise ProfileError(f"runtime {runtime!r} unknown; known: {sorted(RUNTIMES)}")
    if profile.runtime == runtime:
        return profile
    build = profile.provenance.get("build")
    if not isinstance(build, dict):
        raise ProfileError(f"profile {profile.name!r} was not built from tables (its provenance names no build): it "
                           f"describes the {profile.runtime or 'schema-1'} runtime only, not {runtime!r}")
    from servegym.backends.build import build_profile  # the build reads the tables: only when asked

    return build_profile(build["gpu"], build["model"], int(build["tp"]), runtime=runtime)


def measured_range(profile: Profile) -> dict[str, float]:
    """The largest shape the profile's tables measured: ``rows`` (requests per iteration), ``tokens`` (tokens per
    iteration) and ``context`` (tokens per request), as far as the profile states them. Schema 2 takes them from
    its knots (beyond them the stated CPU tail and the linear term's last segment), and a calibrated profile's
    sweep the context per request; a profile read off a paper states none."""
    lat = profile.latency
    sweep = profile.provenance.get("sweep", {})
    limits = {"rows": sweep.get("max_batch"), "context": sweep.get("max_context")}
    if isinstance(lat, TokenLatencyModel):
        limits.update(rows=lat.cpu_rows[-1], tokens=lat.linear_tokens[-1])
    return {key: float(value) for key, value in limits.items() if isinstance(value, int | float)}


def engine_range_warnings(profile: Profile, max_rows: int, max_tokens: int) -> list[str]:
    """What an engine allowed ``max_rows`` requests and ``max_tokens`` tokens per iteration may ask of ``profile``
    beyond what its tables measured (the time there is extrapolated)."""
    lines = []
    for key, asked, what in (("rows", max_rows, "max_num_seqs"), ("tokens", max_tokens, "max_num_batched_tokens")):
        top = measured_range(profile).get(key)
        if top is not None and asked > top:
            lines.append(f"profile {profile.name!r} was measured up to {top:,.0f} {key} per iteration; the engine's "
                         f"{what} = {asked:,} lets iterations go past it, where its times are extrapolated")
    return lines
