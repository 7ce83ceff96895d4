"""GPU state sources: the exporter's published state, NVML (through a fake binding) and
the simulator."""

from __future__ import annotations

import json

import pytest

from launcher.gpustate import ExporterStatusSource, NvmlSource
from launcher.sim.gpus import SimGpuSource
from tests.exporter.backends.fake_nvml import FakeGpu, FakeNvml, proc

NOW = 1_700_000_000.0
STATUS = {"gpus": [
    {"index": 0, "uuid": "GPU-a", "name": "NVIDIA H100", "up": True, "processes": 2},
    {"index": 1, "uuid": "GPU-b", "name": "NVIDIA H100", "up": False, "error": "gpu_lost"},
]}
METRICS = """# HELP gpu_memory_total_bytes Total device memory.
# TYPE gpu_memory_total_bytes gauge
gpu_memory_total_bytes{gpu="0",uuid="GPU-a"} 8.589934592e+10
gpu_memory_used_bytes{gpu="0",uuid="GPU-a"} 2.147483648e+10
gpu_temperature_celsius{gpu="0",uuid="GPU-a"} 71
gpu_utilization_ratio{gpu="0",uuid="GPU-a"} 0.5
gpu_clock_event_reason_active{gpu="0",uuid="GPU-a",reason="gpu_idle"} 1
gpu_clock_event_reason_active{gpu="0",uuid="GPU-a",reason="sw_thermal_slowdown"} 1
gpu_xid_last_timestamp_seconds{gpu="0",uuid="GPU-a"} 1699999000
gpu_info{gpu="0",uuid="GPU-a",name="NVIDIA H100",pci_bus_id="00000000:17:00.0"} 1
gpu_up{gpu="0",uuid="GPU-a"} 1
gpu_up{gpu="1",uuid="GPU-b"} 0
gpu_process_memory_used_bytes{gpu="0",uuid="GPU-a",user="alice",pid="4242",process_name="py"} 2e10
gpu_process_memory_used_bytes{gpu="0",uuid="GPU-a",user="bob",process_name="python"} 1e9
"""


def _fetch(url: str, timeout: float) -> bytes:
    assert timeout == 5.0
    if url.endswith("/status"):
        return json.dumps(STATUS).encode()
    assert url.endswith("/metrics")
    return METRICS.encode()


def test_exporter_source_reads_status_and_metrics() -> None:
    a, b = ExporterStatusSource("http://node:9835/", fetch=_fetch).read(NOW)
    assert (a.uuid, a.index, a.pci_bus_id) == ("GPU-a", 0, "00000000:17:00.0")
    assert a.memory_total_bytes == 80 * 2**30 and a.memory_used_bytes == 20 * 2**30
    assert a.temperature_c == 71 and a.utilization == 0.5
    assert a.throttling and a.recent_xid and a.up
    assert a.processes == [(4242, 20_000_000_000)]  # series without a pid are not processes
    assert not b.up
    older = ExporterStatusSource("http://node:9835", fetch=_fetch, xid_window_seconds=600)
    assert not older.read(NOW)[0].recent_xid


def test_exporter_source_refuses_non_http() -> None:
    with pytest.raises(ValueError, match="not an http"):
        ExporterStatusSource("file:///etc/passwd").read(NOW)


def test_nvml_source_reads_memory_processes_health_and_xids() -> None:
    hot = FakeGpu(uuid="GPU-0", temp=64, reasons=0x1 | 0x40, compute=[proc(17, 2**30)])
    cool = FakeGpu(uuid="GPU-1", bus_id="00000000:18:00.0", reasons=0x1, temp=40)
    fake = FakeNvml([hot, cool])
    source = NvmlSource(nvml=fake, xid_window_seconds=100)
    g0, g1 = source.read(NOW)
    assert g0.uuid == "GPU-0" and g0.pci_bus_id == "00000000:17:00.0"
    assert g0.memory_total_bytes == hot.mem_total and g0.memory_used_bytes == hot.mem_used
    assert g0.throttling and not g1.throttling  # hw thermal slowdown vs idle only
    assert g0.processes == [(17, 2**30)] and g0.utilization == 0.87
    assert not g0.recent_xid
    fake.events.append((1, 79))
    assert [g.recent_xid for g in source.read(NOW + 1)] == [False, True]
    assert [g.recent_xid for g in source.read(NOW + 200)] == [False, False]
    hot.errors["nvmlDeviceGetTemperature"] = fake.NVMLError_NotSupported()
    g0 = source.read(NOW + 250)[0]
    assert g0.up and g0.temperature_c is None  # not offered is not broken
    cool.errors["nvmlDeviceGetMemoryInfo"] = fake.NVMLError_GpuIsLost()
    assert [g.up for g in source.read(NOW + 300)] == [True, False]
    source.close()


def test_sim_source_reflects_processes_and_faults() -> None:
    sim = SimGpuSource(2, memory_total_bytes=100)
    sim.add_process(0, 7, 30, utilization=0.5)
    sim.add_process("GPU-sim-0000", 8, 10, utilization=0.0)
    sim.gpu(1).foreign_used_bytes = 5
    sim.xid(1, NOW - 10)
    g0, g1 = sim.read(NOW)
    assert g0.memory_used_bytes == 40 and g0.memory_of({7}) == 30 and g0.utilization == 0.5
    assert g1.memory_used_bytes == 5 and g1.recent_xid
    sim.remove_pids({7, 8})
    sim.set_up(1, False)
    g0, g1 = sim.read(NOW)
    assert g0.memory_used_bytes == 0 and not g1.up
