"""The NVML backend: every GPU on the host through nvidia-ml-py (pynvml).

`NvmlBackend` discovers the devices once, then on each cycle reads every catalogue
field NVML offers (exporter.backends.nvml_fields), the processes on each GPU
(exporter.backends.nvml_processes), MIG instances and XID events. Failure handling is
per field and per GPU:
- a field the device does not offer (NotSupported, NoPermission, FunctionNotFound) is
  listed in `unsupported`, logged once and never asked for again on that device;
- any other NVML error marks only that GPU down (`up=False`, error kind gpu_lost /
  timeout / unknown / nvml_error); it is retried after 1, 2, 4, ... cycles (capped at
  about five minutes), with its handle re-acquired by UUID, and is reported down
  without touching NVML in between.

This module (with its nvml_* helpers and dcgm.py) is the only place that imports a
vendor library. It must never fall back to another backend, never raise from
`sample()` because of one GPU, and never put NaN, 0 or a sentinel in place of a value
it could not read.
"""

from __future__ import annotations

import ctypes
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pynvml

from exporter.backends.base import BackendUnavailable
from exporter.backends.nvml_fields import (
    READERS,
    DeviceCtx,
    Values,
    error_name,
    is_unsupported,
)
from exporter.backends.nvml_processes import (
    ProcessCallProbe,
    apply_utilization,
    merge_process_lists,
    newest_util_samples,
    read_process_utilization,
)
from exporter.config import ExporterConfig
from exporter.model import (
    BackendInfo,
    GpuInfo,
    GpuSample,
    MigInstance,
    ProcessSample,
    ProcessType,
    XidEvent,
)

log = logging.getLogger("gpu_audit.nvml")

DRIVER_HINT = (
    "is the NVIDIA driver installed, and does this container have GPU access "
    "(--gpus / nvidia runtime)?"
)
BACKOFF_CAP_SECONDS = 300.0
MAX_EVENTS_PER_CYCLE = 1000  # a storm of XIDs must not stall the sampling loop
PROCESS_KINDS: tuple[ProcessType, ...] = ("compute", "graphics", "mps")


def error_kind(nvml: Any, err: BaseException) -> str:
    """The error kind a failed GPU is reported and counted under."""
    for cls_name, kind in (
        ("NVMLError_GpuIsLost", "gpu_lost"),
        ("NVMLError_Timeout", "timeout"),
        ("NVMLError_Unknown", "unknown"),
    ):
        cls = getattr(nvml, cls_name, None)
        if cls is not None and isinstance(err, cls):
            return kind
    return "nvml_error"


def format_cuda_version(v: int) -> str:
    """NVML's integer CUDA driver version (12040) as "12.4"."""
    return f"{v // 1000}.{(v % 1000) // 10}"


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def _handle_key(handle: Any) -> int:
    """A stable key for a device handle (its address for real ctypes handles)."""
    try:
        value = ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)
    return int(value) if value is not None else id(handle)


def mig_profile(name: str) -> str:
    """The MIG profile ("1g.5gb") from a MIG device name ("NVIDIA A100 MIG 1g.5gb")."""
    _head, sep, tail = name.rpartition(" MIG ")
    return tail.strip() if sep else name


@dataclass(slots=True)
class _MigSlot:
    handle: Any
    instance: MigInstance


@dataclass(slots=True)
class _Device:
    """Everything remembered about one physical GPU between cycles."""

    index: int
    uuid: str
    handle: Any
    info: GpuInfo
    ctx: DeviceCtx = field(default_factory=DeviceCtx)
    unsupported_calls: set[str] = field(default_factory=set)
    slow_values: Values = field(default_factory=dict)
    slow_missing: frozenset[str] = frozenset()
    slow_done: bool = False
    mig: list[_MigSlot] = field(default_factory=list)
    failures: int = 0
    retry_cycle: int = 0
    error: str | None = None
    util_last_seen_us: int | None = None
    util_supported: bool = True
    names: dict[int, str] = field(default_factory=dict)
    xid_totals: dict[int, int] = field(default_factory=dict)
    xid_last: float | None = None
    new_xids: list[XidEvent] = field(default_factory=list)


class NvmlBackend:
    """GPU samples read through NVML. See the module docstring for the error rules."""

    name = "nvml"

    def __init__(self, config: ExporterConfig, nvml: Any = None) -> None:
        self._config = config
        self._nvml_override = nvml
        self._nvml: Any = None
        self._devices: list[_Device] = []
        self._by_handle: dict[int, _Device] = {}
        self._event_set: Any = None
        self._probe = ProcessCallProbe()
        self._errors: dict[str, int] = {}
        self._cycle = 0
        self._prev_now: float | None = None
        self._open = False
        self._backoff_cap = max(1, math.ceil(BACKOFF_CAP_SECONDS / config.interval_seconds))

    # --- lifecycle -----------------------------------------------------------------------
    def open(self) -> BackendInfo:
        nvml = self._nvml_override if self._nvml_override is not None else pynvml
        self._nvml = nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as err:
            raise self._init_error(nvml, err) from err
        self._open = True
        try:
            driver = _text(nvml.nvmlSystemGetDriverVersion())
            cuda = self._cuda_version()
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as err:
            self.close()
            raise BackendUnavailable(f"NVML device discovery failed: {err}", DRIVER_HINT) from err
        if count == 0:
            self.close()
            raise BackendUnavailable("NVML sees no GPU on this host", DRIVER_HINT)
        library = ""
        try:
            library = _text(nvml.nvmlSystemGetNVMLVersion())
        except nvml.NVMLError:
            log.debug("nvmlSystemGetNVMLVersion failed; library version left blank")
        for index in range(count):
            self._devices.append(self._discover(index, driver, cuda))
        self._register_events()
        up = sum(1 for d in self._devices if d.failures == 0)
        log.info("NVML %s, driver %s, CUDA %s: %d GPU(s), %d readable",
                 library, driver, cuda, count, up)
        return BackendInfo(
            name=self.name,
            driver_version=driver,
            cuda_version=cuda,
            library_version=library,
            detail=f"{count} GPU(s) through NVML",
        )

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        nvml = self._nvml
        if self._event_set is not None:
            try:
                nvml.nvmlEventSetFree(self._event_set)
            except nvml.NVMLError:
                log.debug("nvmlEventSetFree failed at close")
            self._event_set = None
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            log.debug("nvmlShutdown failed at close")

    def error_counts(self) -> Mapping[str, int]:
        return dict(self._errors)

    # --- sampling ------------------------------------------------------------------------
    def sample(self, now: float, slow: bool) -> Sequence[GpuSample]:
        self._cycle += 1
        self._drain_xids(now)
        out: list[GpuSample] = []
        for dev in self._devices:
            out.append(self._sample_or_down(dev, now, slow))
            dev.new_xids = []
        self._prev_now = now
        return out

    def _sample_or_down(self, dev: _Device, now: float, slow: bool) -> GpuSample:
        nvml = self._nvml
        if dev.failures and self._cycle < dev.retry_cycle:
            return self._down(dev)
        try:
            if dev.failures:
                self._reacquire(dev)
            sample = self._sample_device(dev, now, slow)
        except nvml.NVMLError as err:
            kind = error_kind(nvml, err)
            self._errors[kind] = self._errors.get(kind, 0) + 1
            dev.failures += 1
            delay = min(2 ** (dev.failures - 1), self._backoff_cap)
            dev.retry_cycle = self._cycle + delay
            dev.error = kind
            log.warning("GPU %d (%s) down: %s (%s); next retry in %d cycle(s)",
                        dev.index, dev.uuid, kind, error_name(err), delay)
            return self._down(dev)
        if dev.failures:
            log.warning("GPU %d (%s) readable again after %d failure(s)",
                        dev.index, dev.uuid, dev.failures)
        dev.failures = 0
        dev.error = None
        return sample

    def _down(self, dev: _Device) -> GpuSample:
        return GpuSample(
            info=dev.info,
            up=False,
            error=dev.error,
            xid_totals=dict(dev.xid_totals),
            xid_last_timestamp=dev.xid_last,
            new_xids=tuple(dev.new_xids),
        )

    def _sample_device(self, dev: _Device, now: float, slow: bool) -> GpuSample:
        nvml = self._nvml
        run_slow = slow or not dev.slow_done
        info = self._identity(dev) if run_slow else dev.info
        values: Values = {}
        slow_values: Values = {}
        missing: set[str] = set()
        slow_missing: set[str] = set()
        for reader in READERS:
            is_slow = reader.tier == "slow"
            if is_slow and not run_slow:
                continue
            target, gaps = (slow_values, slow_missing) if is_slow else (values, missing)
            if reader.call in dev.unsupported_calls:
                gaps.update(reader.keys)
                continue
            try:
                got = reader.read(nvml, dev.handle, dev.ctx)
            except nvml.NVMLError as err:
                if not is_unsupported(nvml, err):
                    raise
                dev.unsupported_calls.add(reader.call)
                log.info("GPU %d (%s): %s not available (%s); omitting %s",
                         dev.index, dev.uuid, reader.call, error_name(err),
                         ", ".join(reader.keys))
                gaps.update(reader.keys)
                continue
            self._flush_notes(dev)
            target.update(got)
            gaps.update(k for k in reader.keys if k not in got)
        mig = self._mig(dev, info, run_slow)
        processes = self._processes(dev, now)
        # Commit slow-tier state only once the whole device read has succeeded.
        dev.info = info
        if run_slow:
            dev.slow_values = slow_values
            dev.slow_missing = frozenset(slow_missing)
            dev.slow_done = True
        merged: Values = {**dev.slow_values, **values}
        return GpuSample(
            info=info,
            values=merged,
            unsupported=frozenset(missing | dev.slow_missing),
            processes=tuple(processes),
            mig=mig,
            xid_totals=dict(dev.xid_totals),
            xid_last_timestamp=dev.xid_last,
            new_xids=tuple(dev.new_xids),
        )

    def _flush_notes(self, dev: _Device) -> None:
        for note in dev.ctx.notes:
            log.info("GPU %d (%s): %s", dev.index, dev.uuid, note)
        dev.ctx.notes.clear()

    # --- identity and MIG ----------------------------------------------------------------
    def _optional(self, fn: str, *args: Any) -> Any:
        """Call an identity getter; None when the device does not offer it."""
        nvml = self._nvml
        try:
            return getattr(nvml, fn)(*args)
        except nvml.NVMLError as err:
            if is_unsupported(nvml, err):
                return None
            raise

    def _identity(self, dev: _Device) -> GpuInfo:
        h = dev.handle
        name = self._optional("nvmlDeviceGetName", h)
        serial = self._optional("nvmlDeviceGetSerial", h)
        pci = self._optional("nvmlDeviceGetPciInfo", h)
        vbios = self._optional("nvmlDeviceGetVbiosVersion", h)
        minor = self._optional("nvmlDeviceGetMinorNumber", h)
        mig_mode = self._optional("nvmlDeviceGetMigMode", h)
        enabled = getattr(self._nvml, "NVML_DEVICE_MIG_ENABLE", 1)
        return GpuInfo(
            uuid=dev.uuid,
            index=dev.index,
            name=_text(name) if name is not None else "",
            serial=_text(serial) if serial is not None else "",
            pci_bus_id=_text(pci.busId) if pci is not None else "",
            driver_version=dev.info.driver_version,
            cuda_version=dev.info.cuda_version,
            vbios_version=_text(vbios) if vbios is not None else "",
            minor_number=int(minor) if minor is not None else None,
            mig_mode=bool(mig_mode is not None and mig_mode[0] == enabled),
        )

    def _mig(self, dev: _Device, info: GpuInfo, run_slow: bool) -> tuple[MigInstance, ...]:
        nvml = self._nvml
        if not info.mig_mode:
            dev.mig = []
            return ()
        if run_slow:
            dev.mig = self._enumerate_mig(dev)
        out: list[MigInstance] = []
        for slot in dev.mig:
            total = used = None
            try:
                mem = nvml.nvmlDeviceGetMemoryInfo(slot.handle)
                total, used = int(mem.total), int(mem.used)
            except nvml.NVMLError as err:
                if not is_unsupported(nvml, err):
                    raise
            inst = slot.instance
            out.append(MigInstance(
                uuid=inst.uuid, gpu_instance_id=inst.gpu_instance_id,
                compute_instance_id=inst.compute_instance_id, profile=inst.profile,
                memory_total_bytes=total, memory_used_bytes=used,
            ))
        return tuple(out)

    def _enumerate_mig(self, dev: _Device) -> list[_MigSlot]:
        nvml = self._nvml
        count = self._optional("nvmlDeviceGetMaxMigDeviceCount", dev.handle) or 0
        slots: list[_MigSlot] = []
        for i in range(int(count)):
            try:
                mh = nvml.nvmlDeviceGetMigDeviceHandleByIndex(dev.handle, i)
            except (nvml.NVMLError_NotFound, nvml.NVMLError_InvalidArgument):
                continue  # an empty slot: not every index holds a MIG device
            name = self._optional("nvmlDeviceGetName", mh)
            slots.append(_MigSlot(mh, MigInstance(
                uuid=_text(nvml.nvmlDeviceGetUUID(mh)),
                gpu_instance_id=int(nvml.nvmlDeviceGetGpuInstanceId(mh)),
                compute_instance_id=int(nvml.nvmlDeviceGetComputeInstanceId(mh)),
                profile=mig_profile(_text(name)) if name is not None else "",
            )))
        return slots

    # --- processes -----------------------------------------------------------------------
    def _processes(self, dev: _Device, now: float) -> list[ProcessSample]:
        nvml = self._nvml
        lists: list[tuple[ProcessType, list[Any]]] = []
        for kind in PROCESS_KINDS:
            got = self._probe.call(nvml, kind, dev.handle)
            if got is not None:
                lists.append((kind, got))
        procs = merge_process_lists(lists)
        names: dict[int, str] = {}
        for p in procs:
            cached = dev.names.get(p.pid)
            if cached is None:
                cached = self._process_name(p.pid)
            names[p.pid] = cached
        dev.names = names  # drop pids that left, so a reused pid is asked again
        procs = [_with_name(p, names[p.pid]) for p in procs]
        if not procs or not dev.util_supported:
            return procs
        last_seen = dev.util_last_seen_us
        if last_seen is None:
            since = self._prev_now if self._prev_now is not None else (
                now - self._config.interval_seconds)
            last_seen = int(since * 1e6)
        try:
            samples = read_process_utilization(nvml, dev.handle, last_seen)
        except nvml.NVMLError as err:
            if not is_unsupported(nvml, err):
                raise
            dev.util_supported = False
            log.info("GPU %d (%s): nvmlDeviceGetProcessUtilization not available (%s); "
                     "per-process utilisation omitted", dev.index, dev.uuid, error_name(err))
            return procs
        newest = newest_util_samples(samples)
        if newest:
            dev.util_last_seen_us = max(u.timestamp_us for u in newest.values())
        return apply_utilization(procs, newest)

    def _process_name(self, pid: int) -> str:
        nvml = self._nvml
        try:
            return _text(nvml.nvmlSystemGetProcessName(pid))
        except nvml.NVMLError:
            # The process may have exited, or live in a namespace we cannot see.
            return ""

    # --- discovery, recovery, events -----------------------------------------------------
    def _init_error(self, nvml: Any, err: BaseException) -> BackendUnavailable:
        if isinstance(err, nvml.NVMLError_LibraryNotFound):
            return BackendUnavailable("libnvidia-ml.so.1 not found", DRIVER_HINT)
        if isinstance(err, nvml.NVMLError_DriverNotLoaded):
            return BackendUnavailable("the NVIDIA kernel driver is not loaded", DRIVER_HINT)
        if isinstance(err, nvml.NVMLError_NoPermission):
            return BackendUnavailable(
                "NVML initialisation denied", "run with access to /dev/nvidia* " + DRIVER_HINT)
        return BackendUnavailable(
            f"NVML initialisation failed ({error_name(err)}: {err})", DRIVER_HINT)

    def _cuda_version(self) -> str:
        nvml = self._nvml
        for call in ("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"):
            fn = getattr(nvml, call, None)
            if fn is None:
                continue
            try:
                return format_cuda_version(int(fn()))
            except nvml.NVMLError as err:
                if not is_unsupported(nvml, err):
                    raise
        return ""

    def _discover(self, index: int, driver: str, cuda: str) -> _Device:
        nvml = self._nvml
        base = GpuInfo(uuid="", index=index, driver_version=driver, cuda_version=cuda)
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        except nvml.NVMLError as err:
            # Without a handle there is no UUID: report the slot under a placeholder
            # so the failure is visible, and keep retrying it by index.
            kind = error_kind(nvml, err)
            self._errors[kind] = self._errors.get(kind, 0) + 1
            placeholder = f"unknown-index-{index}"
            log.warning("GPU %d: no handle at start (%s); reported down as %s",
                        index, error_name(err), placeholder)
            dev = _Device(index=index, uuid=placeholder, handle=None,
                          info=_replace_uuid(base, placeholder))
            dev.failures, dev.retry_cycle, dev.error = 1, 1, kind
            return dev
        dev = _Device(index=index, uuid=uuid, handle=handle, info=_replace_uuid(base, uuid))
        self._by_handle[_handle_key(handle)] = dev
        return dev

    def _reacquire(self, dev: _Device) -> None:
        nvml = self._nvml
        if dev.handle is None:
            handle = nvml.nvmlDeviceGetHandleByIndex(dev.index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            dev.uuid = uuid
            dev.info = _replace_uuid(dev.info, uuid)
        else:
            handle = nvml.nvmlDeviceGetHandleByUUID(dev.uuid)
            self._by_handle.pop(_handle_key(dev.handle), None)
        dev.handle = handle
        dev.slow_done = False  # re-read identity and slow fields on recovery
        dev.ctx = DeviceCtx()
        self._by_handle[_handle_key(handle)] = dev
        self._register(dev)

    def _register_events(self) -> None:
        nvml = self._nvml
        try:
            self._event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as err:
            log.warning("NVML event set unavailable (%s): XID errors will not be counted",
                        error_name(err))
            return
        for dev in self._devices:
            if dev.handle is not None:
                self._register(dev)

    def _register(self, dev: _Device) -> None:
        nvml = self._nvml
        if self._event_set is None:
            return
        try:
            nvml.nvmlDeviceRegisterEvents(
                dev.handle, nvml.nvmlEventTypeXidCriticalError, self._event_set)
        except nvml.NVMLError as err:
            log.info("GPU %d (%s): XID events not available (%s)",
                     dev.index, dev.uuid, error_name(err))

    def _drain_xids(self, now: float) -> None:
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
            dev = self._by_handle.get(_handle_key(data.device))
            if dev is None:
                log.warning("XID %d from an unknown device handle ignored", int(data.eventData))
                continue
            xid = int(data.eventData)
            dev.xid_totals[xid] = dev.xid_totals.get(xid, 0) + 1
            dev.xid_last = now
            dev.new_xids.append(XidEvent(uuid=dev.uuid, xid=xid, timestamp=now))
            log.warning("GPU %d (%s): XID %d", dev.index, dev.uuid, xid)


def _replace_uuid(info: GpuInfo, uuid: str) -> GpuInfo:
    return replace(info, uuid=uuid)


def _with_name(p: ProcessSample, name: str) -> ProcessSample:
    return replace(p, name=name)


def create(config: ExporterConfig) -> NvmlBackend:
    """The NVML backend for this configuration (not opened yet)."""
    return NvmlBackend(config)
