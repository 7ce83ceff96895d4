"""The NVML backend against a fake pynvml: one scenario per hardware quirk."""

from __future__ import annotations

import logging

import pynvml
import pytest

from exporter.backends.base import BackendUnavailable
from exporter.backends.nvml import NvmlBackend
from exporter.backends.nvml_identity import mig_profile
from exporter.config import ExporterConfig
from gpu_audit.model.fields import BY_KEY, CLOCK_EVENT_REASONS
from gpu_audit.nvml_shim import format_cuda_version
from tests.exporter.backends.fake_nvml import FakeGpu, FakeMig, FakeNvml, proc, util

NOW = 1_700_000_000.0


def _config() -> ExporterConfig:
    return ExporterConfig.model_validate({"interval_seconds": 5.0})


def _backend(gpus: list[FakeGpu], missing: set[str] | None = None) -> tuple[NvmlBackend, FakeNvml]:
    fake = FakeNvml(gpus, missing)
    backend = NvmlBackend(_config(), nvml=fake)
    backend.open()
    return backend, fake


def _gpus(n: int) -> list[FakeGpu]:
    return [FakeGpu(uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000", minor=i) for i in range(n)]


def test_all_fields_supported_in_base_units() -> None:
    """Every NVML catalogue key is filled, converted to the catalogue's base unit."""
    gpu = FakeGpu(uuid="GPU-a", links=[1, 0], link_kib={(0, 0): 10, (0, 1): 20})
    backend, _ = _backend([gpu])
    (s,) = backend.sample(NOW, slow=True)
    assert s.up and s.error is None
    assert s.unsupported == frozenset()
    v = s.scalar
    assert v("utilization_gpu") == pytest.approx(0.87)
    assert v("utilization_memory") == pytest.approx(0.41)
    assert v("utilization_encoder") == pytest.approx(0.03)
    assert v("utilization_decoder") == pytest.approx(0.04)
    assert v("memory_total") == 85_899_345_920
    assert v("memory_used") == 32_212_254_720
    assert v("memory_free") == 52_613_349_376
    assert v("memory_reserved") == 1_073_741_824
    assert v("temperature_gpu") == 64
    assert v("temperature_memory") == 71
    assert v("power_usage") == pytest.approx(312.5)
    assert v("power_limit") == pytest.approx(700.0)
    assert v("energy") == pytest.approx(9_876_543.21)
    assert v("clock_sm") == 1980e6
    assert v("clock_memory") == 2619e6
    assert v("fan_speed") == pytest.approx(0.55)
    assert v("performance_state") == 0
    assert v("pcie_replay") == 17
    # nvmlDeviceGetViolationStatus: nanoseconds -> seconds, per policy
    assert s.values["violation_time"] == {("power",): 2.5, ("thermal",): 0.75}
    reasons = s.values["clock_event_reason"]
    assert set(reasons) == {(r,) for r in CLOCK_EVENT_REASONS}
    assert reasons[("gpu_idle",)] == 1.0 and reasons[("hw_thermal_slowdown",)] == 1.0
    assert sum(reasons.values()) == 2.0
    assert s.values["ecc_errors"] == {
        ("corrected", "volatile"): 5.0, ("corrected", "aggregate"): 50.0,
        ("uncorrected", "volatile"): 0.0, ("uncorrected", "aggregate"): 2.0,
    }
    assert s.values["retired_pages"] == {("single_bit_ecc",): 3.0, ("double_bit_ecc",): 1.0}
    assert v("retired_pages_pending") == 0.0
    assert s.values["remapped_rows"] == {("correctable",): 2.0, ("uncorrectable",): 1.0}
    assert v("remapped_rows_pending") == 0.0 and v("remapped_rows_failure") == 0.0
    assert s.values["nvlink_up"] == {("0",): 1.0, ("1",): 0.0}
    # counters are read only for the active link
    assert s.values["nvlink_errors"] == {("0", "replay"): 4.0, ("0", "recovery"): 5.0,
                                         ("0", "crc_flit"): 6.0, ("0", "crc_data"): 7.0}
    assert s.values["nvlink_bytes"] == {("0", "transmit"): 10240.0, ("0", "receive"): 20480.0}
    nvml_keys = {m.key for m in BY_KEY.values() if not m.dcgm_only}
    assert set(s.values) == nvml_keys
    assert not any(k.startswith("prof_") for k in s.values)


def test_identity_and_versions() -> None:
    """Identity comes from NVML once per slow cycle; CUDA is formatted as major.minor."""
    backend, _ = _backend(_gpus(2))
    (a, b) = backend.sample(NOW, slow=True)
    assert a.info.uuid.startswith("GPU-00000000") and b.info.index == 1
    assert a.info.driver_version == "550.54.15" and a.info.cuda_version == "12.4"
    assert a.info.pci_bus_id == "00000000:17:00.0" and b.info.minor_number == 1
    assert a.info.serial == "1650123456789" and a.info.vbios_version == "96.00.89.00.01"
    assert format_cuda_version(11080) == "11.8"


def test_unsupported_fields_are_omitted_listed_and_not_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """NotSupported fields never appear as values, are listed, logged once, asked once."""
    gpu = FakeGpu(uuid="GPU-a")
    gpu.errors["nvmlDeviceGetFanSpeed"] = pynvml.NVMLError_NotSupported()
    gpu.errors["nvmlDeviceGetTotalEccErrors"] = pynvml.NVMLError_NotSupported()
    gpu.errors["nvmlDeviceGetPowerUsage"] = pynvml.NVMLError_NoPermission()
    gpu.mem_temp = -1  # the field-values entry comes back NOT_SUPPORTED
    backend, fake = _backend([gpu])
    with caplog.at_level(logging.INFO, logger="gpu_audit.nvml"):
        samples = [backend.sample(NOW + i, slow=True)[0] for i in range(3)]
    for s in samples:
        assert s.up
        assert {"fan_speed", "ecc_errors", "power_usage", "temperature_memory"} <= s.unsupported
        assert "fan_speed" not in s.values and "ecc_errors" not in s.values
        assert "temperature_memory" not in s.values
        assert not (s.unsupported & set(s.values))
    assert fake.calls["nvmlDeviceGetFanSpeed"] == 1
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] == 1
    fan_logs = [r for r in caplog.records if "nvmlDeviceGetFanSpeed" in r.getMessage()]
    assert len(fan_logs) == 1
    # no NVLink on this board: the keys are unsupported, not zero
    assert {"nvlink_up", "nvlink_errors", "nvlink_bytes"} <= samples[0].unsupported


def _three_with_lost_middle() -> tuple[NvmlBackend, FakeNvml, list[FakeGpu]]:
    gpus = _gpus(3)
    backend, fake = _backend(gpus)
    backend.sample(NOW, slow=True)
    gpus[1].errors["nvmlDeviceGetUtilizationRates"] = pynvml.NVMLError_GpuIsLost()
    gpus[1].errors["nvmlDeviceGetHandleByUUID"] = pynvml.NVMLError_GpuIsLost()
    return backend, fake, gpus


def test_lost_gpu_is_isolated_backed_off_and_recovers_by_uuid() -> None:
    """GpuIsLost on GPU 1 of 3 marks only GPU 1 down; it is retried after 1, 2, 4 cycles
    without touching NVML in between, and recovers with a handle re-acquired by UUID."""
    backend, fake, gpus = _three_with_lost_middle()
    attempts: list[int] = []
    for cycle in range(1, 9):
        before = fake.calls["nvmlDeviceGetHandleByUUID"]
        util_before = fake.calls["nvmlDeviceGetUtilizationRates"]
        a, b, c = backend.sample(NOW + cycle, slow=False)
        assert a.up and c.up and a.scalar("utilization_gpu") is not None
        assert not b.up and b.error == "gpu_lost" and dict(b.values) == {}
        assert b.info.uuid == gpus[1].uuid
        touched = (fake.calls["nvmlDeviceGetHandleByUUID"] - before
                   + fake.calls["nvmlDeviceGetUtilizationRates"] - util_before - 2)
        if touched:
            attempts.append(cycle)
    # cycle 1 fails first; retries follow after 1, 2, 4 cycles
    assert attempts == [1, 2, 4, 8]
    assert backend.error_counts() == {"gpu_lost": 4}
    # the GPU comes back: the next retry re-acquires the handle by UUID and samples it
    gpus[1].errors.clear()
    before = fake.calls["nvmlDeviceGetHandleByUUID"]
    recovered = None
    for cycle in range(9, 30):
        _, b, _ = backend.sample(NOW + cycle, slow=False)
        if b.up:
            recovered = b
            break
    assert recovered is not None and recovered.scalar("utilization_gpu") == pytest.approx(0.87)
    assert fake.calls["nvmlDeviceGetHandleByUUID"] == before + 1
    # identity and slow fields are re-read after recovery
    assert "ecc_errors" in recovered.values


def test_backoff_is_capped_at_about_five_minutes() -> None:
    """The retry delay doubles but never exceeds ~300 s worth of cycles."""
    gpus = _gpus(1)
    backend, _ = _backend(gpus)
    gpus[0].errors["nvmlDeviceGetUtilizationRates"] = pynvml.NVMLError_GpuIsLost()
    gpus[0].errors["nvmlDeviceGetHandleByUUID"] = pynvml.NVMLError_GpuIsLost()
    for cycle in range(400):
        backend.sample(NOW + cycle, slow=False)
    dev = backend._devices[0]
    assert dev.retry_cycle - backend._cycle <= 60  # 300 s / 5 s interval


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (pynvml.NVMLError_Timeout(), "timeout"),
        (pynvml.NVMLError_Unknown(), "unknown"),
        (pynvml.NVMLError_GpuIsLost(), "gpu_lost"),
        (pynvml.NVMLError_Memory(), "nvml_error"),
    ],
)
def test_device_errors_mark_the_gpu_down_by_kind(error: Exception, kind: str) -> None:
    """Timeout / Unknown / other NVML errors on a device mark it down with that kind."""
    gpus = _gpus(2)
    gpus[0].errors["nvmlDeviceGetPowerUsage"] = error
    backend, _ = _backend(gpus)
    a, b = backend.sample(NOW, slow=True)
    assert not a.up and a.error == kind and dict(a.values) == {} and a.processes == ()
    assert b.up and b.scalar("power_usage") == pytest.approx(312.5)
    assert backend.error_counts() == {kind: 1}


def test_process_call_falls_back_v3_v2_v1_chosen_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without v3 and with v2 unsupported, the plain call is chosen once and logged once."""
    gpus = _gpus(2)
    for g in gpus:
        g.compute = [proc(100, 1 << 30)]
        g.errors["nvmlDeviceGetComputeRunningProcesses_v2"] = pynvml.NVMLError_FunctionNotFound()
    backend, fake = _backend(gpus, missing={"nvmlDeviceGetComputeRunningProcesses_v3"})
    with caplog.at_level(logging.INFO, logger="gpu_audit.nvml"):
        for i in range(3):
            for s in backend.sample(NOW + i, slow=False):
                assert [p.pid for p in s.processes] == [100]
                assert s.processes[0].used_memory_bytes == 1 << 30
    chosen = [r for r in caplog.records if "compute process list: using" in r.getMessage()]
    assert len(chosen) == 1
    assert "nvmlDeviceGetComputeRunningProcesses " in chosen[0].getMessage() + " "
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v2"] == 1
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses"] == 6


def test_processes_merge_kinds_names_and_missing_memory() -> None:
    """C+G processes count once; N/A memory is None; unknown names are ""."""
    gpu = FakeGpu(uuid="GPU-a")
    gpu.compute = [proc(10, 100), proc(90001, (1 << 64) - 1)]
    gpu.graphics = [proc(10, 100), proc(11, None)]
    gpu.mps = [proc(12, 300)]
    backend, fake = _backend([gpu])
    (s,) = backend.sample(NOW, slow=True)
    by_pid = {p.pid: p for p in s.processes}
    assert sorted(by_pid) == [10, 11, 12, 90001]
    assert by_pid[10].type == "compute" and by_pid[11].type == "graphics"
    assert by_pid[12].type == "mps"
    assert by_pid[90001].used_memory_bytes is None and by_pid[11].used_memory_bytes is None
    assert by_pid[10].name == "python10" and by_pid[90001].name == ""
    assert by_pid[10].gpu_instance_id is None and by_pid[10].uid is None
    backend.sample(NOW + 5, slow=False)
    # names are cached while the pid stays on the GPU
    assert fake.calls["nvmlSystemGetProcessName"] == 4


def test_process_utilization_newest_sample_and_not_found() -> None:
    """Utilisation takes the newest sample per pid since the previous one; NotFound means
    no new samples (ratios None), not an error."""
    gpu = FakeGpu(uuid="GPU-a", compute=[proc(10, 100), proc(11, 200)])
    t0 = int(NOW * 1e6)
    gpu.util_samples = [util(10, t0 - 10, 50, 20), util(10, t0 - 5, 90, 30, enc=1, dec=2)]
    backend, fake = _backend([gpu])
    (s,) = backend.sample(NOW, slow=True)
    p10, p11 = s.processes
    assert p10.sm_util_ratio == pytest.approx(0.9) and p10.memory_util_ratio == pytest.approx(0.3)
    assert p10.encoder_util_ratio == pytest.approx(0.01)
    assert p10.decoder_util_ratio == pytest.approx(0.02)
    assert p11.sm_util_ratio is None
    assert fake.process_util_args[0] == int((NOW - 5.0) * 1e6)
    (s2,) = backend.sample(NOW + 5, slow=False)  # no sample newer than t0 - 5: NotFound
    assert s2.up and all(p.sm_util_ratio is None for p in s2.processes)
    assert fake.process_util_args[1] == t0 - 5
    assert backend.error_counts() == {}


def test_memory_v1_fallback_leaves_reserved_unsupported() -> None:
    """A driver without the v2 memory call gives total/used/free and no reserved."""
    gpu = FakeGpu(uuid="GPU-a")
    gpu.errors["nvmlDeviceGetMemoryInfo_v2"] = pynvml.NVMLError_FunctionNotFound()
    backend, _ = _backend([gpu])
    for i in range(2):
        (s,) = backend.sample(NOW + i, slow=i == 0)
        assert "memory_reserved" in s.unsupported and "memory_reserved" not in s.values
        assert s.scalar("memory_used") == 32_212_254_720 + 1_073_741_824


def test_clock_reasons_fall_back_to_throttle_reasons() -> None:
    """Older drivers without ClocksEventReasons use ClocksThrottleReasons."""
    gpu = FakeGpu(uuid="GPU-a", reasons=0x4)
    backend, fake = _backend([gpu], missing={"nvmlDeviceGetCurrentClocksEventReasons"})
    (s,) = backend.sample(NOW, slow=True)
    assert s.values["clock_event_reason"][("sw_power_cap",)] == 1.0
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 1


def test_unknown_pstate_is_omitted() -> None:
    """NVML_PSTATE_UNKNOWN (32) is a sentinel and never exported."""
    backend, _ = _backend([FakeGpu(uuid="GPU-a", pstate=32)])
    (s,) = backend.sample(NOW, slow=True)
    assert "performance_state" not in s.values and "performance_state" in s.unsupported


def test_slow_tier_is_reused_between_slow_cycles() -> None:
    """Slow fields are read on slow cycles only and carried over on fast ones."""
    backend, fake = _backend(_gpus(1))
    backend.sample(NOW, slow=True)
    ecc_calls = fake.calls["nvmlDeviceGetTotalEccErrors"]
    name_calls = fake.calls["nvmlDeviceGetName"]
    (s,) = backend.sample(NOW + 5, slow=False)
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] == ecc_calls
    assert fake.calls["nvmlDeviceGetName"] == name_calls
    assert s.values["ecc_errors"][("corrected", "volatile")] == 5.0
    assert s.scalar("power_limit") == pytest.approx(700.0)


def test_first_cycle_reads_slow_fields_even_when_not_slow() -> None:
    """A backend sampled first on a fast cycle still has its slow fields."""
    backend, _ = _backend(_gpus(1))
    (s,) = backend.sample(NOW, slow=False)
    assert "ecc_errors" in s.values and s.info.name == "NVIDIA H100 80GB HBM3"


def test_mig_instances_are_enumerated_with_memory() -> None:
    """MIG mode lists each MIG device with ids, profile and memory; empty slots skipped."""
    gpu = FakeGpu(uuid="GPU-a", mig_mode=1, mig=[
        FakeMig("MIG-1", 1, 0, "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 20 << 30, 5 << 30),
        None,
        FakeMig("MIG-2", 2, 0, "NVIDIA A100-SXM4-40GB MIG 1g.5gb", 5 << 30, 1 << 30),
    ])
    backend, _ = _backend([gpu])
    (s,) = backend.sample(NOW, slow=True)
    assert s.info.mig_mode
    assert [(m.uuid, m.gpu_instance_id, m.compute_instance_id, m.profile) for m in s.mig] == [
        ("MIG-1", 1, 0, "3g.20gb"), ("MIG-2", 2, 0, "1g.5gb")]
    assert s.mig[0].memory_total_bytes == 20 << 30 and s.mig[1].memory_used_bytes == 1 << 30
    assert mig_profile("Tesla V100") == "Tesla V100"


def test_xid_events_are_drained_into_counters_and_timestamps() -> None:
    """XID events become per-code totals, a last-seen timestamp and this cycle's events."""
    gpus = _gpus(2)
    backend, fake = _backend(gpus)
    fake.events = [(1, 79), (1, 13), (1, 13)]
    a, b = backend.sample(NOW, slow=True)
    assert a.xid_totals == {} and a.new_xids == ()
    assert b.xid_totals == {79: 1, 13: 2} and b.xid_last_timestamp == NOW
    assert [e.xid for e in b.new_xids] == [79, 13, 13]
    assert all(e.uuid == gpus[1].uuid for e in b.new_xids)
    fake.events = [(1, 13)]
    _, b2 = backend.sample(NOW + 5, slow=False)
    assert b2.xid_totals == {79: 1, 13: 3} and b2.xid_last_timestamp == NOW + 5
    assert [e.xid for e in b2.new_xids] == [13]
    _, b3 = backend.sample(NOW + 10, slow=False)
    assert b3.new_xids == () and b3.xid_totals == {79: 1, 13: 3}


def test_xids_still_reported_for_a_down_gpu() -> None:
    """A GPU that fell off the bus keeps its XID counters while it is down."""
    gpus = _gpus(1)
    backend, fake = _backend(gpus)
    gpus[0].errors["nvmlDeviceGetUtilizationRates"] = pynvml.NVMLError_GpuIsLost()
    fake.events = [(0, 79)]
    (s,) = backend.sample(NOW, slow=True)
    assert not s.up and s.xid_totals == {79: 1}


def test_devices_without_xid_events_are_skipped() -> None:
    """A device that refuses event registration is still sampled."""
    gpus = _gpus(2)
    gpus[0].errors["nvmlDeviceRegisterEvents"] = pynvml.NVMLError_NotSupported()
    backend, fake = _backend(gpus)
    fake.events = [(1, 48)]
    a, b = backend.sample(NOW, slow=True)
    assert a.up and b.xid_totals == {48: 1}


@pytest.mark.parametrize(
    ("error", "text"),
    [
        (pynvml.NVMLError_LibraryNotFound(), "libnvidia-ml.so.1 not found"),
        (pynvml.NVMLError_DriverNotLoaded(), "driver is not loaded"),
        (pynvml.NVMLError_Unknown(), "NVML initialisation failed"),
    ],
)
def test_init_failure_raises_backend_unavailable_with_hint(error: Exception, text: str) -> None:
    """NVML that cannot start gives one clear error with the driver/container hint."""
    fake = FakeNvml(_gpus(1))
    fake.init_error = error
    with pytest.raises(BackendUnavailable) as info:
        NvmlBackend(_config(), nvml=fake).open()
    message = str(info.value)
    assert text in message
    assert "is the NVIDIA driver installed" in message and "--gpus" in message


def test_real_pynvml_without_driver_is_unavailable() -> None:
    """On this GPU-less machine the real pynvml fails to init and we say why."""
    with pytest.raises(BackendUnavailable, match="is the NVIDIA driver installed"):
        NvmlBackend(_config()).open()


def test_close_is_idempotent() -> None:
    """close() may be called twice."""
    backend, _ = _backend(_gpus(1))
    backend.close()
    backend.close()


@pytest.mark.parametrize("xid", [48, 63, 64, 92, 94, 95])
def test_a_memory_xid_rereads_ecc_and_row_remapping_in_the_same_cycle(xid: int) -> None:
    """A memory-error XID arriving on a fast cycle makes that cycle read ECC, retired
    pages and remapped rows again (the values it reports are the new ones), instead of
    carrying the previous slow cycle's until the next one, up to a minute later. Other
    slow fields (power limit, NVLink) and other GPUs are not read again."""
    gpus = _gpus(2)
    backend, fake = _backend(gpus)
    backend.sample(NOW, slow=True)
    calls = dict(fake.calls)
    gpus[1].ecc[(1, 0)] = 1  # uncorrected, volatile
    gpus[1].remapped = (2, 2, 1, 0)  # one more uncorrectable row, a remap pending
    gpus[1].retired_pending = 1
    fake.events = [(1, xid)]
    a, b = backend.sample(NOW + 5, slow=False)
    assert b.values["ecc_errors"][("uncorrected", "volatile")] == 1.0
    assert b.values["remapped_rows"][("uncorrectable",)] == 2.0
    assert b.scalar("remapped_rows_pending") == 1.0 and b.scalar("retired_pages_pending") == 1.0
    assert a.values["ecc_errors"][("uncorrected", "volatile")] == 0.0
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] == calls["nvmlDeviceGetTotalEccErrors"] + 4
    assert fake.calls["nvmlDeviceGetEnforcedPowerLimit"] == calls["nvmlDeviceGetEnforcedPowerLimit"]
    assert fake.calls["nvmlDeviceGetName"] == calls["nvmlDeviceGetName"]
    assert b.scalar("power_limit") == pytest.approx(700.0)  # the slow values are all kept
    # the next fast cycle carries the fresh values over without reading them again
    _, b2 = backend.sample(NOW + 10, slow=False)
    assert b2.values["ecc_errors"][("uncorrected", "volatile")] == 1.0
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] == calls["nvmlDeviceGetTotalEccErrors"] + 4


def test_an_application_xid_does_not_reread_memory_errors() -> None:
    """XID 13 (an application fault) says nothing about memory: ECC waits for the slow
    tier as usual."""
    gpus = _gpus(1)
    backend, fake = _backend(gpus)
    backend.sample(NOW, slow=True)
    calls = fake.calls["nvmlDeviceGetTotalEccErrors"]
    gpus[0].ecc[(1, 0)] = 1
    fake.events = [(0, 13)]
    (s,) = backend.sample(NOW + 5, slow=False)
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] == calls
    assert s.values["ecc_errors"][("uncorrected", "volatile")] == 0.0
