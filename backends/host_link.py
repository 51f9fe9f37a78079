"""Host-to-GPU copy bandwidth per GPU, for the prefix cache's host-memory tier (``EngineConfig.host_kv_tokens``).

Each figure is the GPU's PCIe link rate in one direction, as its data sheet states the link: PCIe 4.0 x16 carries
16 GT/s per lane with 128b/130b coding, 31.5 GB/s each way (the A100 and A40 data sheets' "64 GB/s" is both ways
together); PCIe 5.0 x16 twice that (the H100 SXM5 data sheet's "128 GB/s"); PCIe 3.0 x16 half (V100, "32 GB/s").
These are link rates, not measured copies: pinned-memory copies reach roughly 80-90% of them, so a host hit's
modelled copy time is a lower bound. With tensor parallelism each GPU copies its own shard over its own link, so
the per-GPU KV bytes per token divide by one link's rate.
"""

from __future__ import annotations

PCIE4_X16 = 31.5e9
PCIE5_X16 = 63.0e9
PCIE3_X16 = 15.75e9
LINK_BYTES_S = {"A100": PCIE4_X16, "A40": PCIE4_X16, "H100": PCIE5_X16, "V100": PCIE3_X16}
"""One-direction host-link bytes/s, keyed by the GPU named in a profile's ``provenance.hardware``."""


def host_link_bytes_s(hardware: str) -> float | None:
    """The host link of the GPU ``hardware`` names (``"NVIDIA A100-SXM4-80GB"``), or None for another device."""
    words = hardware.replace("-", " ").split()
    for gpu, rate in LINK_BYTES_S.items():
        if gpu in words:
            return rate
    return None
