"""The DCGM backend: profiling fields merged onto NVML samples, or NVML-only without DCGM."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import pynvml
import pytest

from exporter.backends.base import BackendUnavailable
from exporter.backends.dcgm import (
    FP64_BLANK,
    INT64_BLANK,
    PROF_FIELDS,
    PROF_KEYS,
    DcgmBackend,
    PyDcgmAdapter,
    is_blank,
)
from exporter.backends.nvml import NvmlBackend
from exporter.config import ExporterConfig
from gpu_audit.model.fields import CATALOGUE
from tests.exporter.backends.fake_nvml import FakeGpu, FakeNvml

NOW = 1_700_000_000.0


class FakeDcgm:
    """A DCGM adapter returning canned latest values by UUID."""

    def __init__(self, values: dict[str, dict[int, float | int | None]],
                 fail_connect: bool = False) -> None:
        self.values = values
        self.fail_connect = fail_connect
        self.watched: tuple[list[int], float] | None = None
        self.host: str | None = "unset"
        self.closed = False
        self.fail_read = False

    def connect(self, host: str | None) -> None:
        if self.fail_connect:
            raise BackendUnavailable("DCGM Python bindings not importable", "install DCGM")
        self.host = host

    def watch(self, field_ids: Sequence[int], interval_seconds: float) -> None:
        self.watched = (list(field_ids), interval_seconds)

    def latest(self) -> Mapping[str, Mapping[int, float | int | None]]:
        if self.fail_read:
            raise RuntimeError("host engine went away")
        return self.values

    def close(self) -> None:
        self.closed = True


def _backend(adapter: FakeDcgm, gpus: list[FakeGpu] | None = None,
             **cfg: object) -> DcgmBackend:
    config = ExporterConfig.model_validate({"backend": "dcgm", **cfg})
    fake = FakeNvml(gpus or [FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b", minor=1)])
    return DcgmBackend(config, nvml_backend=NvmlBackend(config, nvml=fake),
                       adapter_factory=lambda: adapter)


def test_prof_fields_cover_the_catalogue() -> None:
    """Every dcgm_only catalogue key has a DCGM field id, and only those."""
    assert {m.key for m in CATALOGUE if m.dcgm_only} == set(PROF_FIELDS)
    assert sorted(PROF_FIELDS.values()) == list(range(1001, 1011))


def test_dcgm_present_merges_prof_fields_by_uuid_and_omits_blanks() -> None:
    """Profiling values land on the GPU with the same UUID; blank ones are unsupported."""
    adapter = FakeDcgm({
        "GPU-b": {1001: 0.75, 1002: 0.5, 1004: FP64_BLANK, 1009: 123456789,
                  1010: INT64_BLANK + 2, 1003: None},
        "GPU-a": {1001: 0.25},
    })
    backend = _backend(adapter, dcgm_host="10.0.0.5:5555", interval_seconds=2.0)
    info = backend.open()
    assert info.name == "dcgm" and backend.dcgm_active
    assert adapter.host == "10.0.0.5:5555"
    assert adapter.watched == (list(range(1001, 1011)), 2.0)
    a, b = backend.sample(NOW, slow=True)
    assert a.scalar("prof_gr_engine_active") == 0.25
    assert b.scalar("prof_gr_engine_active") == 0.75
    assert b.scalar("prof_sm_active") == 0.5
    assert b.scalar("prof_pcie_tx_bytes") == 123456789.0
    for key in ("prof_pipe_tensor_active", "prof_pcie_rx_bytes", "prof_sm_occupancy",
                "prof_dram_active"):
        assert key not in b.values and key in b.unsupported
    # NVML fields are still there
    assert b.scalar("utilization_gpu") is not None
    assert PROF_KEYS - {"prof_gr_engine_active"} <= a.unsupported


def test_dcgm_absent_warns_once_and_runs_nvml_only(caplog: pytest.LogCaptureFixture) -> None:
    """Without DCGM the backend logs one warning and lists prof_* keys as unsupported."""
    adapter = FakeDcgm({}, fail_connect=True)
    backend = _backend(adapter)
    with caplog.at_level(logging.WARNING, logger="gpu_audit.dcgm"):
        info = backend.open()
        for i in range(3):
            samples = backend.sample(NOW + i, slow=i == 0)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "NVML-only" in warnings[0].getMessage()
    assert not backend.dcgm_active and "DCGM unavailable" in info.detail
    for s in samples:
        assert s.up and s.scalar("power_usage") is not None
        assert s.unsupported >= PROF_KEYS and not PROF_KEYS & set(s.values)


def test_real_bindings_absent_here_fall_back_to_nvml_only() -> None:
    """The real adapter, with no DCGM installed here, makes the backend NVML-only."""
    config = ExporterConfig.model_validate({"backend": "dcgm"})
    backend = DcgmBackend(config, nvml_backend=NvmlBackend(
        config, nvml=FakeNvml([FakeGpu(uuid="GPU-a")])), adapter_factory=PyDcgmAdapter)
    backend.open()
    assert not backend.dcgm_active
    (s,) = backend.sample(NOW, slow=True)
    assert s.unsupported >= PROF_KEYS


def test_nvml_unavailable_is_fatal_for_dcgm_backend() -> None:
    """Without NVML the DCGM backend cannot start either."""
    config = ExporterConfig.model_validate({"backend": "dcgm"})
    fake = FakeNvml([])
    fake.init_error = pynvml.NVMLError_LibraryNotFound()
    backend = DcgmBackend(config, nvml_backend=NvmlBackend(config, nvml=fake),
                          adapter_factory=lambda: FakeDcgm({}))
    with pytest.raises(BackendUnavailable, match=r"libnvidia-ml\.so\.1"):
        backend.open()


def test_dcgm_read_failure_keeps_nvml_samples_and_counts_error() -> None:
    """A failing DCGM read omits prof fields for that cycle only and is counted."""
    adapter = FakeDcgm({"GPU-a": {1001: 0.5}})
    backend = _backend(adapter, gpus=[FakeGpu(uuid="GPU-a")])
    backend.open()
    adapter.fail_read = True
    (s,) = backend.sample(NOW, slow=True)
    assert s.up and "prof_gr_engine_active" in s.unsupported
    assert backend.error_counts() == {"dcgm_error": 1}
    adapter.fail_read = False
    (s,) = backend.sample(NOW + 1, slow=False)
    assert s.scalar("prof_gr_engine_active") == 0.5
    backend.close()
    assert adapter.closed


def test_down_gpu_gets_no_prof_values() -> None:
    """A GPU that NVML reports down stays down with empty values under DCGM too."""
    gpu = FakeGpu(uuid="GPU-a")
    gpu.errors["nvmlDeviceGetPowerUsage"] = pynvml.NVMLError_GpuIsLost()
    adapter = FakeDcgm({"GPU-a": {1001: 0.5}})
    backend = _backend(adapter, gpus=[gpu])
    backend.open()
    (s,) = backend.sample(NOW, slow=True)
    assert not s.up and dict(s.values) == {}


@pytest.mark.parametrize(
    ("value", "blank"),
    [(None, True), (0, False), (0.0, False), (INT64_BLANK, True), (INT64_BLANK - 1, False),
     (FP64_BLANK, True), (float("nan"), True), (0.999, False)],
)
def test_blank_detection(value: float | int | None, blank: bool) -> None:
    """DCGM blank sentinels and missing values are recognised; real zeros are not blank."""
    assert is_blank(value) is blank
