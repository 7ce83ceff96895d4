"""XID errors through NVML's event API: one event set for every GPU, drained each cycle.

`XidEvents` creates the event set at start, registers each device for
`nvmlEventTypeXidCriticalError`, and on every cycle drains what is pending without
waiting (timeout 0), at most MAX_EVENTS_PER_CYCLE events so a storm of XIDs cannot
stall the sampling loop. Each event is counted on the device whose handle it names
(`XidState`), also while that GPU is down: an XID is often the reason it went down.

A missing event set or a device that cannot register is logged once and leaves XIDs
uncounted; it must never mark a GPU down or stop the cycle.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpu_audit.model.samples import XidEvent
from gpu_audit.nvml_shim import error_name

log = logging.getLogger("gpu_audit.nvml")

MAX_EVENTS_PER_CYCLE = 1000  # a storm of XIDs must not stall the sampling loop


def handle_key(handle: Any) -> int:
    """A stable key for a device handle (its address for real ctypes handles)."""
    try:
        value = ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)
    return int(value) if value is not None else id(handle)


@dataclass(slots=True)
class XidState:
    """The XIDs one GPU has seen: totals per code, the last time, and this cycle's."""

    totals: dict[int, int] = field(default_factory=dict)
    last: float | None = None
    new: list[XidEvent] = field(default_factory=list)

    def record(self, uuid: str, xid: int, now: float) -> None:
        self.totals[xid] = self.totals.get(xid, 0) + 1
        self.last = now
        self.new.append(XidEvent(uuid=uuid, xid=xid, timestamp=now))


class WatchedDevice(Protocol):
    """What the event reader needs to know about a GPU."""

    index: int
    uuid: str
    handle: Any
    xids: XidState


class XidEvents:
    """The NVML event set and the devices registered on it."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._event_set: Any = None
        self._by_handle: dict[int, WatchedDevice] = {}

    def start(self, devices: list[Any]) -> None:
        """Create the event set and register every device that has a handle."""
        nvml = self._nvml
        try:
            self._event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as err:
            log.warning("NVML event set unavailable (%s): XID errors will not be counted",
                        error_name(err))
            return
        for dev in devices:
            if dev.handle is not None:
                self._register(dev)

    def track(self, dev: WatchedDevice) -> None:
        """Map the device's handle to it, so its events are counted on it."""
        self._by_handle[handle_key(dev.handle)] = dev

    def retrack(self, dev: WatchedDevice, old_handle: Any) -> None:
        """The device has a new handle (re-acquired): map and register it again."""
        if old_handle is not None:
            self._by_handle.pop(handle_key(old_handle), None)
        self.track(dev)
        self._register(dev)

    def _register(self, dev: WatchedDevice) -> None:
        nvml = self._nvml
        if self._event_set is None:
            return
        try:
            nvml.nvmlDeviceRegisterEvents(
                dev.handle, nvml.nvmlEventTypeXidCriticalError, self._event_set)
        except nvml.NVMLError as err:
            log.info("GPU %d (%s): XID events not available (%s)",
                     dev.index, dev.uuid, error_name(err))

    def drain(self, now: float) -> None:
        """Count every pending XID on its device, timestamped `now`."""
        nvml = self._nvml
        if self._event_set is None:
            return
        for _ in range(MAX_EVENTS_PER_CYCLE):
            try:
                data = nvml.nvmlEventSetWait(self._event_set, 0)
            except nvml.NVMLError_Timeout:
                return  # no event pending: the queue is drained
            except nvml.NVMLError as err:
                log.debug("nvmlEventSetWait failed (%s); XIDs read next cycle", error_name(err))
                return
            if not int(data.eventType) & int(nvml.nvmlEventTypeXidCriticalError):
                continue
            dev = self._by_handle.get(handle_key(data.device))
            if dev is None:
                log.warning("XID %d from an unknown device handle ignored", int(data.eventData))
                continue
            xid = int(data.eventData)
            dev.xids.record(dev.uuid, xid, now)
            log.warning("GPU %d (%s): XID %d", dev.index, dev.uuid, xid)

    def close(self) -> None:
        """Free the event set. Safe to call twice."""
        nvml = self._nvml
        if self._event_set is None:
            return
        try:
            nvml.nvmlEventSetFree(self._event_set)
        except nvml.NVMLError:
            log.debug("nvmlEventSetFree failed at close")
        self._event_set = None
