"""What a latency profile may hold: the physical ranges its values must lie in, stated once.

Two kinds of check. :func:`check_term_seconds` holds for every latency model, built in code or loaded: no term
may charge more than :data:`MAX_TERM_S` for one unit of work, so a typo such as ``l_min_s: 1e300`` cannot run to
makespans of 1e300 s and observations far outside their space. :func:`check_hardware` and :func:`check_capacity`
hold for profile files, which describe real machines: bandwidths and FLOP rates within what hardware reaches, an
effective rate no higher than the data sheet's, a KV cache the observation can encode, a cold start under an
hour. (Latency models built in code, as tests do, may use toy hardware numbers.)
"""

from __future__ import annotations

MAX_TERM_S = 60.0
"""Most seconds an iteration's fixed time, or one term's cost of one unit of work (a request, a token, a KV token
read, a query-key pair, an emitting row), may be. A one-minute iteration is far beyond any GPU or CPU serving
setup (the slowest shipped profile's largest measured iteration, 32,768 tokens on an A100, takes 2.2 s)."""
MAX_NOISE_CV = 1.0
"""Largest coefficient of variation of the iteration-time noise: beyond it the spread exceeds the mean (measured
profiles show a few percent)."""
BANDWIDTH_BYTES_S = (1e6, 1e14)
"""Memory bandwidth range (bytes/s): 1 MB/s to 100 TB/s (over 10x an H200's 4.8 TB/s). The floor is far below a
CPU socket's ~10 GB/s because a calibrated profile's rate is effective: a CPU backend's cost per KV token read
includes gathers and kernel calls, so a tiny model's few bytes per token come out at 0.5 GB/s."""
FLOPS_S = (1e6, 1e17)
"""FLOP/s range: 1 MFLOP/s to 100 PFLOP/s (over 10x any GPU's dense fp16 peak); the floor, as the bandwidth's, leaves
room for a calibrated CPU backend's effective rates."""
MAX_KV_TOKENS = 10**9
"""Largest KV cache (blocks x block size, tokens): the observation encodes capacity in float32 boxes bounded by
``servegym.envs.observation.BIG`` (1e9)."""
MAX_COLD_START_S = 3600.0
"""Longest cold start (s): loading any model's weights takes minutes, not hours."""


class ProfileValueError(ValueError):
    """A latency field is invalid (the loader prefixes the file and key)."""


def check_term_seconds(name: str, seconds: float, unit: str = "iteration") -> None:
    """Refuse a term that charges more than :data:`MAX_TERM_S` for one ``unit``."""
    if seconds > MAX_TERM_S:
        raise ProfileValueError(f"{name} gives {seconds:.4g} s per {unit}, over the {MAX_TERM_S:g} s limit of "
                                "any one term")


def check_noise(cv: float) -> None:
    if cv > MAX_NOISE_CV:
        raise ProfileValueError(f"noise_cv {cv!r} is over {MAX_NOISE_CV:g} (the noise's spread would exceed its mean)")


def check_range(name: str, value: float, bounds: tuple[float, float], unit: str) -> None:
    low, high = bounds
    if not low <= value <= high:
        raise ProfileValueError(f"{name} {value:.4g} {unit} is outside the physical range [{low:g}, {high:g}]")


def check_hardware(memory_bandwidth: float, decode_bandwidth: float, peak_flops: float, prefill_flops: float) -> None:
    """A profile file's hardware numbers: within :data:`BANDWIDTH_BYTES_S` and :data:`FLOPS_S`, and each
    effective rate (data sheet x efficiency) no higher than its data-sheet figure."""
    check_range("memory_bandwidth_bytes_s", memory_bandwidth, BANDWIDTH_BYTES_S, "bytes/s")
    check_range("decode_bandwidth_bytes_s", decode_bandwidth, BANDWIDTH_BYTES_S, "bytes/s")
    check_range("peak_flops_s", peak_flops, FLOPS_S, "FLOP/s")
    check_range("prefill_flops_s", prefill_flops, FLOPS_S, "FLOP/s")
    if decode_bandwidth > memory_bandwidth:
        raise ProfileValueError(f"decode_bandwidth_bytes_s {decode_bandwidth:.4g} exceeds memory_bandwidth_bytes_s "
                                f"{memory_bandwidth:.4g} (an effective rate cannot beat the data sheet)")
    if prefill_flops > peak_flops:
        raise ProfileValueError(f"prefill_flops_s {prefill_flops:.4g} exceeds peak_flops_s {peak_flops:.4g} (an "
                                "effective rate cannot beat the data sheet)")


def check_capacity(num_blocks: int, block_size: int, cold_start_s: float) -> None:
    """A profile file's KV cache and cold start: at most :data:`MAX_KV_TOKENS` and :data:`MAX_COLD_START_S`."""
    tokens = num_blocks * block_size
    if tokens > MAX_KV_TOKENS:
        raise ProfileValueError(f"kv_cache: {num_blocks:,} blocks x {block_size} tokens = {tokens:,} tokens, over "
                                f"the {MAX_KV_TOKENS:,} an observation can encode")
    if cold_start_s > MAX_COLD_START_S:
        raise ProfileValueError(f"cold_start_s {cold_start_s:g} is over {MAX_COLD_START_S:g} s")
