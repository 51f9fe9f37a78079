"""KV capacity arithmetic by hand, and the clear error when the requested cache does not fit."""

from __future__ import annotations

import pytest

from servegym.backends.kv_memory import (
    GIB,
    KVCapacityError,
    blocks_that_fit,
    bytes_per_block,
    check_fits,
    peak_used_bytes,
)

LLAMA_3B_BLOCK = 2 * 28 * 8 * 128 * 16 * 2  # layers, KV heads, head dim, block size, float16 bytes


def test_bytes_per_block_counts_keys_and_values_of_every_layer():
    assert bytes_per_block(layers=3, kv_heads=5, head_dim=7, block_size=11, dtype_bytes=2) == 4620
    assert bytes_per_block(28, 8, 128, 16, 2) == LLAMA_3B_BLOCK == 1_835_008
    assert 8192 * LLAMA_3B_BLOCK == 14 * GIB  # the 8,192 blocks of the 3B model


def test_peak_used_is_other_memory_plus_torch_peak_less_the_profiling_cache():
    # 100k total, 40k free, 50k reserved by torch -> 10k held outside torch; peak 35k allocated, 5k of it the
    # profiling run's own cache.
    assert peak_used_bytes(total=100_000, free=40_000, reserved=50_000, peak_allocated=35_000,
                           profile_cache_bytes=5_000) == 40_000


def test_blocks_fill_utilization_times_total_less_peak_used():
    # 0.9 x 100,000 - 30,000 = 60,000 bytes: 12 blocks of 4,620 (55,440); 13 would need 60,060.
    assert blocks_that_fit(total_bytes=100_000, peak_used_bytes=30_000, utilization=0.9, block_bytes=4620) == 12
    assert blocks_that_fit(100_000, 95_000, 0.9, 4620) == 0  # the budget is already spent
    # An H100's 80 GiB at 0.9, 10 GiB used at peak: 62 GiB / 1.75 MiB = 36,278.9 blocks of the 3B model.
    assert blocks_that_fit(80 * GIB, 10 * GIB, 0.9, LLAMA_3B_BLOCK) == 36_278
    # Utilization 1 is the whole device: 100,000 - 30,000 = 70,000 bytes, 15 blocks (69,300).
    assert blocks_that_fit(100_000, 30_000, 1.0, 4620) == 15
    for bad in (1.5, 0.0):
        with pytest.raises(ValueError, match="utilization"):
            blocks_that_fit(100, 0, bad, 1)


def test_a_cache_that_does_not_fit_names_the_gib_needed_and_available():
    check_fits(5851, LLAMA_3B_BLOCK, 10 * GIB, "cuda:0")  # 5,851 x 1.75 MiB = 9.9993 GiB fits
    check_fits(3, 4620, 13_860, "cpu")  # exactly the bytes available fits
    with pytest.raises(KVCapacityError, match="ask for at most 2 blocks"):
        check_fits(3, 4620, 13_859, "cpu")
    with pytest.raises(KVCapacityError, match=r"8192 blocks needs 14.00 GiB but cuda:0 has 10.00 GiB available; "
                                              r"ask for at most 5851 blocks"):
        check_fits(8192, LLAMA_3B_BLOCK, 10 * GIB, "cuda:0")


def test_the_cpu_backend_checks_its_cache_against_available_memory(monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from servegym.backends import torch_backend

    # tiny-llama: 2 x 4 layers x 4 KV heads x 32 head dim x 16 tokens x 4 bytes = 64 KiB per block.
    monkeypatch.setattr(torch_backend, "available_system_bytes", lambda: 16 << 20)
    with pytest.raises(KVCapacityError, match=r"512 blocks needs 0.03 GiB but this machine has 0.02 GiB available; "
                                              r"ask for at most 256 blocks"):
        torch_backend.TorchBackend("tiny-llama", num_kv_blocks=512)
    assert torch_backend.TorchBackend("tiny-llama", num_kv_blocks=256).num_kv_blocks == 256
