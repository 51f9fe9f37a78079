"""The real backend's device handling: default dtypes, presets built straight in the target dtype, the CUDA
device index, what ``load_s``/``cold_start_s`` mean, and host time in the engine clock."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from servegym.backends.base import StepBatch  # noqa: E402
from servegym.backends.torch_backend import TorchBackend, default_dtype, resolve_device  # noqa: E402
from servegym.backends.torch_model import build_preset  # noqa: E402

EMPTY = np.zeros(0, dtype=np.int64)


@pytest.mark.parametrize(("device_type", "capability", "expected"), [
    ("cpu", None, "float32"), ("cuda", (7, 0), "float16"), ("cuda", (7, 5), "float16"), ("cuda", (8, 0), "bfloat16"),
    ("cuda", (9, 0), "bfloat16")])
def test_default_dtype_is_float16_where_bfloat16_is_not_native(device_type, capability, expected):
    assert default_dtype(device_type, capability) == expected


def fake_torch(cuda_available: bool, current: int = 0) -> SimpleNamespace:
    return SimpleNamespace(device=torch.device, cuda=SimpleNamespace(is_available=lambda: cuda_available,
                                                                     current_device=lambda: current,
                                                                     device_count=lambda: 4))


def test_device_resolution_makes_the_cuda_index_explicit():
    assert resolve_device(fake_torch(True, current=1), "cuda") == torch.device("cuda", 1)
    assert resolve_device(fake_torch(True, current=1), "cuda:3") == torch.device("cuda", 3)
    assert resolve_device(fake_torch(True, current=2), None) == torch.device("cuda", 2)
    assert resolve_device(fake_torch(False), None) == torch.device("cpu")
    with pytest.raises(ValueError, match="torch sees no CUDA device"):
        resolve_device(fake_torch(False), "cuda")
    with pytest.raises(ValueError, match="device must be"):
        resolve_device(fake_torch(False), "meta")
    with pytest.raises(ValueError, match="device must be"):
        resolve_device(fake_torch(False), "tpu")
    with pytest.raises(ValueError, match="has 4 CUDA device"):
        resolve_device(fake_torch(True), "cuda:4")


class Float32Allocations(TorchDispatchMode):
    """Records every float32 tensor of 1024+ elements an op produces (tiny-llama's smallest weight has 256)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.numel() >= 1024:
                self.seen.append((str(func), tuple(t.shape)))
        return out


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_preset_is_built_in_its_dtype_without_a_float32_copy(monkeypatch, dtype):
    original_to = torch.nn.Module.to

    def no_cast(self, *args, **kwargs):
        if any(isinstance(a, torch.dtype) for a in (*args, *kwargs.values())):
            raise AssertionError("the preset was cast after it was built")
        return original_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "to", no_cast)
    allocations = Float32Allocations()
    with allocations:
        model = build_preset("tiny-llama", torch.device("cpu"), dtype, seed=0)
    assert {p.dtype for p in model.parameters()} == {dtype}
    assert allocations.seen == []
    assert torch.get_default_dtype() == torch.float32  # the default dtype is restored


def test_same_seed_gives_same_preset_weights():
    def weights(seed):
        return build_preset("tiny-llama", torch.device("cpu"), torch.bfloat16, seed).state_dict()

    a, b, c = weights(0), weights(0), weights(1)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_a_half_precision_backend_runs_a_step_in_its_dtype():
    backend = TorchBackend("tiny-llama", dtype="bfloat16", num_kv_blocks=16, keep_logits=True)
    assert backend.k_cache[0].dtype == torch.bfloat16 and backend.model.dtype == torch.bfloat16
    backend.execute(StepBatch(EMPTY, EMPTY, np.array([0]), np.array([0]), np.array([5]), np.array([5])))
    assert np.isfinite(backend.last_logits[0]).all()


def test_a_preset_reports_initialisation_not_a_load():
    backend = TorchBackend("tiny-llama", num_kv_blocks=16)
    assert backend.load_s > 0 and backend.cold_start_s is None
    assert backend.load_kind == "random initialisation (preset)"


class ScriptedClock:
    """Returns the given readings in order; a reading more than scripted fails the test."""

    def __init__(self, readings: list[float]) -> None:
        self.readings = iter(readings)

    def __call__(self) -> float:
        return next(self.readings)


@pytest.mark.parametrize(("count_host_time", "expected"), [(True, 2.75), (False, 2.0)])
def test_host_time_is_counted_in_the_step_latency_when_asked(count_host_time, expected):
    # Readings: step start 10, inputs on the device 10.5 (packing 0.5 s), forward done 12.5 (2 s), sampled 12.75.
    backend = TorchBackend("tiny-llama", num_kv_blocks=16, count_host_time=count_host_time,
                           clock=ScriptedClock([10.0, 10.5, 12.5, 12.75]))
    latency = backend.execute(StepBatch(EMPTY, EMPTY, np.array([0]), np.array([0]), np.array([5]), np.array([5])))
    assert latency == expected
    assert backend.forward_s == [2.0] and backend.overhead_s == [0.75]
