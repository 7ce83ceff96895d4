"""What the launcher knows about the GPUs: measured state through one interface.

`GpuStateSource.read(now)` returns one `GpuInfo` per GPU. Placement and the release
barrier trust only this measured state, never the launcher's own bookkeeping alone.

Implementations:
- `ExporterStatusSource`: the node exporter's published state (its `/status` for the GPU
  list and health, its `/metrics` for memory, temperature, throttling, XIDs and per-pid
  process memory; the per-pid series need the exporter's `pid_label` option).
- `NvmlSource`: NVML directly (through core's nvml_shim), where no exporter runs.

Simulated GPUs (`gpus: sim:N`, tests, replay) live in launcher/sim/, never here.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client.parser import text_string_to_metric_families

from gpu_audit.model.fields import CLOCK_EVENT_REASONS

GIB = 2**30
# Clock event reasons that mean the GPU is slowed by heat or power, not by idleness or a
# clocks setting: a GPU held down by one of these is "throttling".
THROTTLE_REASONS = frozenset({"hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                              "hw_power_brake_slowdown"})
THROTTLE_MASK = sum(CLOCK_EVENT_REASONS[r] for r in THROTTLE_REASONS)


@dataclass(slots=True)
class GpuInfo:
    """One GPU as measured at one moment. `processes` are (pid, used GPU memory bytes);
    `utilization` the busy ratio 0..1 when known; `recent_xid` True when the GPU reported
    an XID error within the source's window; `up` False when it could not be read (lost)."""

    uuid: str
    index: int
    pci_bus_id: str = ""
    name: str = ""
    memory_total_bytes: int = 0
    memory_used_bytes: int = 0
    temperature_c: float | None = None
    throttling: bool = False
    recent_xid: bool = False
    up: bool = True
    processes: list[tuple[int, int]] = field(default_factory=list)
    utilization: float | None = None

    def memory_of(self, pids: Iterable[int]) -> int:
        """GPU memory held on this GPU by any of `pids`."""
        wanted = set(pids)
        return sum(used for pid, used in self.processes if pid in wanted)


class GpuStateSource(Protocol):
    """Measured GPU state. `now` is the caller's clock (virtual in replay)."""

    def read(self, now: float) -> list[GpuInfo]: ...


# ---------------------------------------------------------------------------------- exporter

Fetch = Callable[[str, float], bytes]


def _http_get(url: str, timeout: float) -> bytes:
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"not an http(s) URL: {url}")
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (checked above)
        body: bytes = resp.read()
        return body


class ExporterStatusSource:
    """The node exporter's published state: `/status` (GPU list, up) plus `/metrics`.

    `base_url` is the exporter's endpoint (http://127.0.0.1:9835). `xid_window_seconds`:
    an XID newer than this counts as recent. `fetch` is injectable for tests. An exporter
    that cannot be reached raises (OSError): the caller must not place jobs blind.
    """

    def __init__(self, base_url: str, *, timeout_seconds: float = 5.0,
                 xid_window_seconds: float = 3600.0, fetch: Fetch | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout_seconds
        self.xid_window = xid_window_seconds
        self._fetch = fetch or _http_get

    def read(self, now: float) -> list[GpuInfo]:
        status = json.loads(self._fetch(self.base_url + "/status", self.timeout))
        metrics = self._fetch(self.base_url + "/metrics", self.timeout).decode("utf-8")
        gpus: dict[str, GpuInfo] = {}
        for g in status.get("gpus", []):
            gpus[g["uuid"]] = GpuInfo(uuid=g["uuid"], index=int(g["index"]),
                                      name=g.get("name", ""), up=bool(g.get("up", True)))
        for family in text_string_to_metric_families(metrics):
            for s in family.samples:
                info = gpus.get(s.labels.get("uuid", ""))
                if info is None:
                    continue
                _apply_sample(info, s.name, s.labels, s.value, now=now,
                              xid_window=self.xid_window)
        return sorted(gpus.values(), key=lambda g: g.index)


def _apply_sample(info: GpuInfo, name: str, labels: dict[str, str], value: float, *,
                  now: float, xid_window: float) -> None:
    if name == "gpu_memory_total_bytes":
        info.memory_total_bytes = int(value)
    elif name == "gpu_memory_used_bytes":
        info.memory_used_bytes = int(value)
    elif name == "gpu_temperature_celsius":
        info.temperature_c = value
    elif name == "gpu_utilization_ratio":
        info.utilization = value
    elif name == "gpu_clock_event_reason_active":
        if value >= 1 and labels.get("reason") in THROTTLE_REASONS:
            info.throttling = True
    elif name == "gpu_xid_last_timestamp_seconds":
        info.recent_xid = value > 0 and now - value <= xid_window
    elif name == "gpu_info":
        info.pci_bus_id = labels.get("pci_bus_id", info.pci_bus_id)
        info.name = labels.get("name", info.name)
    elif name == "gpu_up":
        info.up = value >= 1
    elif name == "gpu_process_memory_used_bytes" and labels.get("pid", "").isdigit():
        info.processes.append((int(labels["pid"]), int(value)))


# -------------------------------------------------------------------------------------- NVML

class NvmlSource:
    """NVML directly (where no exporter runs). `nvml` overrides the binding (a fake in
    tests); NVML is initialised on the first read and kept open. A GPU that fails to
    answer is reported `up=False`; an XID seen by the event set within `xid_window_seconds`
    marks it `recent_xid`."""

    def __init__(self, *, nvml: Any = None, xid_window_seconds: float = 3600.0) -> None:
        from gpu_audit import nvml_shim  # noqa: PLC0415 (only where NVML is used)

        self._shim = nvml_shim
        self._nvml = nvml_shim.load_binding(nvml)
        self._opened = False
        self._xid_window = xid_window_seconds
        self._last_xid: dict[str, float] = {}
        self._events: Any = None
        self._memory = nvml_shim.memory_info_call("gpu")
        self._reasons = nvml_shim.clock_reasons_call("gpu")
        self._procs = nvml_shim.process_list_calls()

    def _open(self) -> None:
        nvml = self._nvml
        nvml.nvmlInit()
        self._opened = True
        try:
            self._events = nvml.nvmlEventSetCreate()
            for i in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                try:
                    nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError,
                                                  self._events)
                except nvml.NVMLError:
                    continue  # no XID events on this device: health then rests on `up`
        except (nvml.NVMLError, AttributeError):
            self._events = None

    def close(self) -> None:
        if self._opened:
            self._nvml.nvmlShutdown()
            self._opened = False

    def _drain_xids(self, now: float) -> None:
        nvml = self._nvml
        if self._events is None:
            return
        while True:
            try:
                event = nvml.nvmlEventSetWait_v2(self._events, 0) \
                    if hasattr(nvml, "nvmlEventSetWait_v2") else \
                    nvml.nvmlEventSetWait(self._events, 0)
            except nvml.NVMLError:
                return  # timeout: nothing pending
            uuid = self._shim.text(nvml.nvmlDeviceGetUUID(event.device))
            self._last_xid[uuid] = now

    def read(self, now: float) -> list[GpuInfo]:
        if not self._opened:
            self._open()
        nvml, shim = self._nvml, self._shim
        self._drain_xids(now)
        out: list[GpuInfo] = []
        for i in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                uuid = shim.text(nvml.nvmlDeviceGetUUID(handle))
            except nvml.NVMLError:
                out.append(GpuInfo(uuid=f"index-{i}", index=i, up=False))
                continue
            info = GpuInfo(uuid=uuid, index=i)
            try:
                name = shim.call_optional(nvml, "nvmlDeviceGetName", handle)
                info.name = shim.text(name) if name is not None else ""
                pci = shim.call_optional(nvml, "nvmlDeviceGetPciInfo", handle)
                info.pci_bus_id = shim.text(pci.busId) if pci is not None else ""
                mem = self._memory(nvml, handle)
                info.memory_total_bytes, info.memory_used_bytes = int(mem.total), int(mem.used)
                temp = shim.call_optional(nvml, "nvmlDeviceGetTemperature", handle,
                                          nvml.NVML_TEMPERATURE_GPU)
                info.temperature_c = float(temp) if temp is not None else None
                util = shim.call_optional(nvml, "nvmlDeviceGetUtilizationRates", handle)
                info.utilization = util.gpu / 100.0 if util is not None else None
                try:
                    info.throttling = bool(int(self._reasons(nvml, handle)) & THROTTLE_MASK)
                except nvml.NVMLError as err:
                    if not shim.is_unsupported(nvml, err):
                        raise
                for call in self._procs.values():
                    try:
                        for p in call(nvml, handle):
                            used = p.usedGpuMemory
                            info.processes.append((int(p.pid), int(used) if used else 0))
                    except nvml.NVMLError as err:
                        if not shim.is_unsupported(nvml, err):
                            raise
            except nvml.NVMLError:
                info.up = False
            last = self._last_xid.get(uuid)
            info.recent_xid = last is not None and now - last <= self._xid_window
            out.append(info)
        return out
