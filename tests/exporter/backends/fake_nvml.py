"""A fake pynvml module for the NVML/DCGM backend tests.

It exposes the functions the backend calls, with the real pynvml constants and
exception classes (those import without a driver), and lets each test configure GPUs,
failures per call and per GPU, missing (versioned) functions, processes, utilisation
samples, MIG devices, NVLink links and XID events. Every call is counted so tests can
check what was (not) asked of NVML.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml


@dataclass
class FakeMig:
    uuid: str
    gi: int
    ci: int
    name: str
    total: int
    used: int


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    serial: str = "1650123456789"
    bus_id: str = "00000000:17:00.0"
    minor: int = 0
    util_gpu: int = 87
    util_mem: int = 41
    enc: int = 3
    dec: int = 4
    mem_total: int = 85_899_345_920
    mem_used: int = 32_212_254_720
    mem_free: int = 52_613_349_376
    mem_reserved: int = 1_073_741_824
    temp: int = 64
    mem_temp: int = 71
    power_mw: int = 312_500
    limit_mw: int = 700_000
    energy_mj: int = 9_876_543_210
    sm_mhz: int = 1980
    mem_mhz: int = 2619
    fan: int = 55
    pstate: int = 0
    reasons: int = 0x1 | 0x40
    ecc: dict[tuple[int, int], int] = field(
        default_factory=lambda: {(0, 0): 5, (0, 1): 50, (1, 0): 0, (1, 1): 2})
    retired: dict[int, int] = field(default_factory=lambda: {0: 3, 1: 1})
    retired_pending: int = 0
    remapped: tuple[int, int, int, int] = (2, 1, 0, 0)
    replay: int = 17
    # policy (0 power, 1 thermal) -> nanoseconds of violation
    violation_ns: dict[int, int] = field(
        default_factory=lambda: {0: 2_500_000_000, 1: 750_000_000})
    links: list[int] = field(default_factory=list)  # state per existing link
    link_errors: int = 4
    link_kib: dict[tuple[int, int], int] = field(default_factory=dict)
    compute: list[Any] = field(default_factory=list)
    graphics: list[Any] = field(default_factory=list)
    mps: list[Any] = field(default_factory=list)
    util_samples: list[Any] = field(default_factory=list)
    mig_mode: int = 0
    mig: list[FakeMig | None] = field(default_factory=list)
    # function name -> exception raised for this GPU
    errors: dict[str, BaseException] = field(default_factory=dict)


def proc(pid: int, mem: int | None, gi: int = 0xFFFFFFFF, ci: int = 0xFFFFFFFF) -> Any:
    return SimpleNamespace(pid=pid, usedGpuMemory=mem, gpuInstanceId=gi, computeInstanceId=ci)


def util(pid: int, ts: int, sm: int, mem: int, *, enc: int = 0, dec: int = 0) -> Any:
    return SimpleNamespace(pid=pid, timeStamp=ts, smUtil=sm, memUtil=mem, encUtil=enc,
                           decUtil=dec)


class Handle:
    """A device handle: an object, as real ctypes handles are (compared by identity)."""

    def __init__(self, gpu: FakeGpu, generation: int, mig: FakeMig | None = None) -> None:
        self.gpu = gpu
        self.generation = generation
        self.mig = mig


_PASSTHROUGH_PREFIXES = ("NVML_", "NVMLError", "nvmlEventType", "nvmlMemory_v", "NVMLError_")


class FakeNvml:
    """Looks like the pynvml module to the backend."""

    def __init__(self, gpus: list[FakeGpu], missing: set[str] | None = None) -> None:
        self.gpus = gpus
        self.missing = set(missing or ())
        self.calls: Counter[str] = Counter()
        self.init_error: BaseException | None = None
        self.events: list[tuple[int, int]] = []  # (gpu index, xid) pending
        self.handles_issued = 0
        self.global_errors: dict[str, BaseException] = {}
        self.process_util_args: list[int] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith(_PASSTHROUGH_PREFIXES):
            return getattr(pynvml, name)
        raise AttributeError(name)

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml") and not name.startswith(("nvmlEventType", "nvmlMemory_v")):
            if name in object.__getattribute__(self, "missing"):
                raise AttributeError(name)
            object.__getattribute__(self, "calls")[name] += 1
        return object.__getattribute__(self, name)

    # --- helpers -------------------------------------------------------------------------
    def _check(self, fn: str, h: Handle | None = None) -> FakeGpu:
        if fn in self.global_errors:
            raise self.global_errors[fn]
        assert h is not None
        err = h.gpu.errors.get(fn)
        if err is not None:
            raise err
        return h.gpu

    # --- library -------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        return None

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return 12040

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "12.550.54.15"

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        if pid >= 90000:
            raise pynvml.NVMLError_NotFound()
        return f"python{pid}"

    def nvmlDeviceGetCount(self) -> int:
        self._check_global("nvmlDeviceGetCount")
        return len(self.gpus)

    def _check_global(self, fn: str) -> None:
        if fn in self.global_errors:
            raise self.global_errors[fn]

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Handle:
        self.handles_issued += 1
        return Handle(self.gpus[i], self.handles_issued)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Handle:
        for g in self.gpus:
            if g.uuid == uuid:
                err = g.errors.get("nvmlDeviceGetHandleByUUID")
                if err is not None:
                    raise err
                self.handles_issued += 1
                return Handle(g, self.handles_issued)
        raise pynvml.NVMLError_NotFound()

    # --- identity ------------------------------------------------------------------------
    def nvmlDeviceGetUUID(self, h: Handle) -> str:
        return h.mig.uuid if h.mig else h.gpu.uuid

    def nvmlDeviceGetName(self, h: Handle) -> str:
        if h.mig:
            return h.mig.name
        return self._check("nvmlDeviceGetName", h).name

    def nvmlDeviceGetSerial(self, h: Handle) -> str:
        return self._check("nvmlDeviceGetSerial", h).serial

    def nvmlDeviceGetPciInfo(self, h: Handle) -> Any:
        return SimpleNamespace(busId=self._check("nvmlDeviceGetPciInfo", h).bus_id.encode())

    def nvmlDeviceGetVbiosVersion(self, h: Handle) -> str:
        self._check("nvmlDeviceGetVbiosVersion", h)
        return "96.00.89.00.01"

    def nvmlDeviceGetMinorNumber(self, h: Handle) -> int:
        return self._check("nvmlDeviceGetMinorNumber", h).minor

    def nvmlDeviceGetMigMode(self, h: Handle) -> list[int]:
        g = self._check("nvmlDeviceGetMigMode", h)
        return [g.mig_mode, g.mig_mode]

    # --- fields --------------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, h: Handle) -> Any:
        g = self._check("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=g.util_gpu, memory=g.util_mem)

    def nvmlDeviceGetEncoderUtilization(self, h: Handle) -> list[int]:
        return [self._check("nvmlDeviceGetEncoderUtilization", h).enc, 167000]

    def nvmlDeviceGetDecoderUtilization(self, h: Handle) -> list[int]:
        return [self._check("nvmlDeviceGetDecoderUtilization", h).dec, 167000]

    def nvmlDeviceGetMemoryInfo(self, h: Handle, version: Any = None) -> Any:
        if h.mig:
            m = h.mig
            return SimpleNamespace(total=m.total, used=m.used, free=m.total - m.used)
        g = self._check("nvmlDeviceGetMemoryInfo", h)
        if version is not None:
            err = g.errors.get("nvmlDeviceGetMemoryInfo_v2")
            if err is not None:
                raise err
            return SimpleNamespace(total=g.mem_total, used=g.mem_used, free=g.mem_free,
                                   reserved=g.mem_reserved)
        return SimpleNamespace(total=g.mem_total, used=g.mem_used + g.mem_reserved,
                               free=g.mem_free)

    def nvmlDeviceGetTemperature(self, h: Handle, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._check("nvmlDeviceGetTemperature", h).temp

    def nvmlDeviceGetPowerUsage(self, h: Handle) -> int:
        return self._check("nvmlDeviceGetPowerUsage", h).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: Handle) -> int:
        return self._check("nvmlDeviceGetEnforcedPowerLimit", h).limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h: Handle) -> int:
        return self._check("nvmlDeviceGetTotalEnergyConsumption", h).energy_mj

    def nvmlDeviceGetClockInfo(self, h: Handle, clock: int) -> int:
        g = self._check("nvmlDeviceGetClockInfo", h)
        return g.sm_mhz if clock == pynvml.NVML_CLOCK_SM else g.mem_mhz

    def nvmlDeviceGetFanSpeed(self, h: Handle) -> int:
        return self._check("nvmlDeviceGetFanSpeed", h).fan

    def nvmlDeviceGetPerformanceState(self, h: Handle) -> int:
        return self._check("nvmlDeviceGetPerformanceState", h).pstate

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Handle) -> int:
        return self._check("nvmlDeviceGetCurrentClocksEventReasons", h).reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: Handle) -> int:
        return self._check("nvmlDeviceGetCurrentClocksThrottleReasons", h).reasons

    def nvmlDeviceGetTotalEccErrors(self, h: Handle, etype: int, counter: int) -> int:
        return self._check("nvmlDeviceGetTotalEccErrors", h).ecc[(etype, counter)]

    def nvmlDeviceGetRetiredPages(self, h: Handle, cause: int) -> list[int]:
        n = self._check("nvmlDeviceGetRetiredPages", h).retired[cause]
        return [0x1000 * i for i in range(n)]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: Handle) -> int:
        return self._check("nvmlDeviceGetRetiredPagesPendingStatus", h).retired_pending

    def nvmlDeviceGetRemappedRows(self, h: Handle) -> tuple[int, int, int, int]:
        return self._check("nvmlDeviceGetRemappedRows", h).remapped

    def nvmlDeviceGetViolationStatus(self, h: Handle, policy: int) -> Any:
        g = self._check("nvmlDeviceGetViolationStatus", h)
        return SimpleNamespace(referenceTime=0, violationTime=g.violation_ns[policy])

    def nvmlDeviceGetPcieReplayCounter(self, h: Handle) -> int:
        return self._check("nvmlDeviceGetPcieReplayCounter", h).replay

    def nvmlDeviceGetNvLinkState(self, h: Handle, link: int) -> int:
        g = self._check("nvmlDeviceGetNvLinkState", h)
        if link >= len(g.links):
            raise pynvml.NVMLError_NotSupported() if not g.links else \
                pynvml.NVMLError_InvalidArgument()
        return g.links[link]

    def nvmlDeviceGetNvLinkErrorCounter(self, h: Handle, link: int, counter: int) -> int:
        return self._check("nvmlDeviceGetNvLinkErrorCounter", h).link_errors + counter

    def nvmlDeviceGetFieldValues(self, h: Handle, ids: list[Any]) -> list[Any]:
        g = self._check("nvmlDeviceGetFieldValues", h)
        out = []
        for fid in ids:
            if isinstance(fid, tuple):
                field_id, link = fid
                direction = 0 if field_id == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX else 1
                v = g.link_kib.get((link, direction))
                out.append(_fv(pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal", v))
            else:
                assert fid == pynvml.NVML_FI_DEV_MEMORY_TEMP
                out.append(_fv(pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal",
                               g.mem_temp if g.mem_temp >= 0 else None))
        return out

    # --- processes -----------------------------------------------------------------------
    def _procs(self, fn: str, h: Handle, kind: str) -> list[Any]:
        g = self._check(fn, h)
        return list(getattr(g, kind))

    def nvmlDeviceGetComputeRunningProcesses_v3(self, h: Handle) -> list[Any]:
        return self._procs("nvmlDeviceGetComputeRunningProcesses_v3", h, "compute")

    def nvmlDeviceGetComputeRunningProcesses_v2(self, h: Handle) -> list[Any]:
        return self._procs("nvmlDeviceGetComputeRunningProcesses_v2", h, "compute")

    def nvmlDeviceGetComputeRunningProcesses(self, h: Handle) -> list[Any]:
        return self._procs("nvmlDeviceGetComputeRunningProcesses", h, "compute")

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, h: Handle) -> list[Any]:
        return self._procs("nvmlDeviceGetGraphicsRunningProcesses_v3", h, "graphics")

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, h: Handle) -> list[Any]:
        return self._procs("nvmlDeviceGetGraphicsRunningProcesses_v2", h, "graphics")

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: Handle) -> list[Any]:
        return self._procs("nvmlDeviceGetGraphicsRunningProcesses", h, "graphics")

    def nvmlDeviceGetMPSComputeRunningProcesses_v3(self, h: Handle) -> list[Any]:
        return self._procs("nvmlDeviceGetMPSComputeRunningProcesses_v3", h, "mps")

    def nvmlDeviceGetMPSComputeRunningProcesses_v2(self, h: Handle) -> list[Any]:
        return self._procs("nvmlDeviceGetMPSComputeRunningProcesses_v2", h, "mps")

    def nvmlDeviceGetMPSComputeRunningProcesses(self, h: Handle) -> list[Any]:
        return self._procs("nvmlDeviceGetMPSComputeRunningProcesses", h, "mps")

    def nvmlDeviceGetProcessUtilization(self, h: Handle, ts: int) -> list[Any]:
        g = self._check("nvmlDeviceGetProcessUtilization", h)
        self.process_util_args.append(ts)
        newer = [s for s in g.util_samples if s.timeStamp > ts]
        if not newer:
            raise pynvml.NVMLError_NotFound()
        return newer

    # --- MIG -----------------------------------------------------------------------------
    def nvmlDeviceGetMaxMigDeviceCount(self, h: Handle) -> int:
        return len(self._check("nvmlDeviceGetMaxMigDeviceCount", h).mig)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Handle, i: int) -> Handle:
        m = h.gpu.mig[i]
        if m is None:
            raise pynvml.NVMLError_NotFound()
        return Handle(h.gpu, h.generation, m)

    def nvmlDeviceGetGpuInstanceId(self, h: Handle) -> int:
        assert h.mig is not None
        return h.mig.gi

    def nvmlDeviceGetComputeInstanceId(self, h: Handle) -> int:
        assert h.mig is not None
        return h.mig.ci

    # --- events --------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> object:
        self._check_global("nvmlEventSetCreate")
        self.event_handles: dict[int, Handle] = {}
        return object()

    def nvmlDeviceRegisterEvents(self, h: Handle, types: int, event_set: object) -> None:
        self._check("nvmlDeviceRegisterEvents", h)
        self.event_handles[self.gpus.index(h.gpu)] = h

    def nvmlEventSetWait(self, event_set: object, timeout_ms: int) -> Any:
        assert timeout_ms == 0
        if not self.events:
            raise pynvml.NVMLError_Timeout()
        index, xid = self.events.pop(0)
        return SimpleNamespace(device=self.event_handles[index],
                               eventType=pynvml.nvmlEventTypeXidCriticalError,
                               eventData=xid, gpuInstanceId=0, computeInstanceId=0)

    def nvmlEventSetFree(self, event_set: object) -> None:
        return None


def _fv(value_type: int, member: str, v: int | None) -> Any:
    if v is None:
        return SimpleNamespace(nvmlReturn=pynvml.NVML_ERROR_NOT_SUPPORTED, valueType=value_type,
                               value=SimpleNamespace(**{member: 0}))
    return SimpleNamespace(nvmlReturn=pynvml.NVML_SUCCESS, valueType=value_type,
                           value=SimpleNamespace(**{member: v}))
