"""The NVML shim: one versioned-call probe for every versioned function, one pynvml import."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pynvml
import pytest

from exporter.backends.nvml import NvmlBackend
from exporter.config import ExporterConfig
from gpu_audit.nvml_shim import Variant, VersionedCall
from tests.exporter.backends.fake_nvml import FakeGpu, FakeNvml

NOW = 1_700_000_000.0
ROOT = Path(__file__).resolve().parents[3]


def _backend(gpus: list[FakeGpu], missing: set[str] | None = None) -> tuple[NvmlBackend, FakeNvml]:
    fake = FakeNvml(gpus, missing)
    backend = NvmlBackend(ExporterConfig.model_validate({"interval_seconds": 5.0}), nvml=fake)
    backend.open()
    return backend, fake


def test_only_the_shim_imports_pynvml() -> None:
    """No production module but gpu_audit/nvml_shim.py imports pynvml."""
    importers = []
    for package in ("exporter", "gpu_audit", "shipper", "launcher", "chargeback", "gpu_audit_app"):
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                if any(n.split(".")[0] == "pynvml" for n in names):
                    importers.append(path.relative_to(ROOT).as_posix())
    assert importers == ["gpu_audit/nvml_shim.py"]


def test_exhausted_call_is_not_asked_again(caplog: pytest.LogCaptureFixture) -> None:
    """When no version answers, the call is switched off: the last error is raised once,
    later calls raise FunctionNotFound without touching the binding, and the outcome is
    logged once."""
    gpu = FakeGpu(uuid="GPU-a")
    gpu.errors["nvmlDeviceGetPowerUsage"] = pynvml.NVMLError_NotSupported()
    fake = FakeNvml([gpu])
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    call = VersionedCall("power", (Variant("nvmlDeviceGetPowerUsage_v9"),
                                   Variant("nvmlDeviceGetPowerUsage")))
    with caplog.at_level(logging.INFO, logger="gpu_audit.nvml"):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call(fake, handle)
        asked = fake.calls["nvmlDeviceGetPowerUsage"]
        for _ in range(3):
            with pytest.raises(pynvml.NVMLError_FunctionNotFound):
                call(fake, handle)
    assert call.exhausted and fake.calls["nvmlDeviceGetPowerUsage"] == asked
    lines = [r.getMessage() for r in caplog.records if "power" in r.getMessage()]
    assert lines == ["NVML power not available: nvmlDeviceGetPowerUsage_v9 (absent from the "
                     "binding), nvmlDeviceGetPowerUsage (NVMLError_NotSupported)"]


def test_errors_of_the_chosen_version_propagate() -> None:
    """Once a version answered, its later errors are the GPU's, not a reason to switch."""
    gpu = FakeGpu(uuid="GPU-a")
    fake = FakeNvml([gpu])
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    call = VersionedCall("power", (Variant("nvmlDeviceGetPowerUsage"),))
    assert call(fake, handle) == gpu.power_mw
    gpu.errors["nvmlDeviceGetPowerUsage"] = pynvml.NVMLError_GpuIsLost()
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        call(fake, handle)
    assert not call.exhausted and call.chosen is not None


def test_version_mismatch_falls_back_only_where_the_variant_allows() -> None:
    """InvalidArgument on the v2 memory struct means "use v1"; on v1 it is a real error
    that marks the GPU down."""
    gpu = FakeGpu(uuid="GPU-a")
    gpu.errors["nvmlDeviceGetMemoryInfo_v2"] = pynvml.NVMLError_InvalidArgument()
    backend, _ = _backend([gpu])
    (s,) = backend.sample(NOW, slow=True)
    assert s.up and "memory_reserved" in s.unsupported
    assert s.scalar("memory_used") == gpu.mem_used + gpu.mem_reserved

    other = FakeGpu(uuid="GPU-b")
    other.errors["nvmlDeviceGetMemoryInfo"] = pynvml.NVMLError_InvalidArgument()
    backend, _ = _backend([other])
    (s,) = backend.sample(NOW, slow=True)
    assert not s.up and s.error == "nvml_error"


def test_memory_and_clock_choices_logged_once_per_device(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The per-device versioned calls log their choice once per device, not per cycle."""
    gpus = [FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b", minor=1)]
    backend, _ = _backend(gpus, missing={"nvmlDeviceGetCurrentClocksEventReasons"})
    with caplog.at_level(logging.INFO, logger="gpu_audit.nvml"):
        for i in range(3):
            backend.sample(NOW + i, slow=i == 0)
    lines = [r.getMessage() for r in caplog.records]
    memory = [m for m in lines if "memory info: using" in m]
    clocks = [m for m in lines if "clock event reasons: using" in m]
    assert memory == ["NVML GPU 0 (GPU-a) memory info: using nvmlDeviceGetMemoryInfo_v2",
                      "NVML GPU 1 (GPU-b) memory info: using nvmlDeviceGetMemoryInfo_v2"]
    assert len(clocks) == 2
    assert clocks[0].endswith("using nvmlDeviceGetCurrentClocksThrottleReasons after "
                              "nvmlDeviceGetCurrentClocksEventReasons (absent from the binding)")


def test_cuda_version_falls_back_to_the_plain_call() -> None:
    """Without the _v2 CUDA version call, the plain one gives the version."""
    fake = FakeNvml([FakeGpu(uuid="GPU-a")], missing={"nvmlSystemGetCudaDriverVersion_v2"})
    fake.nvmlSystemGetCudaDriverVersion = lambda: 11080  # type: ignore[attr-defined]
    backend = NvmlBackend(ExporterConfig.model_validate({"interval_seconds": 5.0}), nvml=fake)
    assert backend.open().cuda_version == "11.8"
