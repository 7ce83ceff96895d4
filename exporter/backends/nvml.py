"""The NVML backend: every GPU on the host through nvidia-ml-py (pynvml).

`NvmlBackend` discovers the devices once, then on each cycle reads every catalogue
field NVML offers (exporter.backends.nvml_fields), the processes on each GPU
(exporter.backends.nvml_processes), identity and MIG instances
(exporter.backends.nvml_identity) and XID events (exporter.backends.nvml_events). The
binding, error classification and versioned calls come from gpu_audit.nvml_shim,
the only module that imports pynvml. Failure handling is per field and per GPU:
- a field the device does not offer (NotSupported, NoPermission, FunctionNotFound) is
  listed in `unsupported`, logged once and never asked for again on that device;
- any other NVML error marks only that GPU down (`up=False`, error kind gpu_lost /
  timeout / unknown / nvml_error); it is retried after 1, 2, 4, ... cycles (capped at
  about five minutes), with its handle re-acquired by UUID, and is reported down
  without touching NVML in between.

These modules (with dcgm.py) are the only ones that talk to a vendor library. It must
never fall back to another backend, never raise from `sample()` because of one GPU,
and never put NaN, 0 or a sentinel in place of a value it could not read.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from exporter.backends.base import BackendUnavailable
from exporter.backends.nvml_events import XidEvents, XidState
from exporter.backends.nvml_fields import READERS, DeviceCtx, Values
from exporter.backends.nvml_identity import MigSlot, enumerate_mig, read_identity, read_mig
from exporter.backends.nvml_processes import (
    UtilSample,
    build_processes,
    newest_util_samples,
    read_process_list,
    read_process_utilization,
)
from exporter.config import ExporterConfig
from gpu_audit.model.fields import MEMORY_ERROR_KEYS, MEMORY_ERROR_XIDS
from gpu_audit.model.samples import (
    BackendInfo,
    GpuInfo,
    GpuSample,
    MigInstance,
    ProcessSample,
    ProcessType,
)
from gpu_audit.nvml_shim import (
    cuda_version_call,
    error_kind,
    error_name,
    format_cuda_version,
    is_unsupported,
    load_binding,
    process_list_calls,
    text,
)

log = logging.getLogger("gpu_audit.nvml")

DRIVER_HINT = (
    "is the NVIDIA driver installed, and does this container have GPU access "
    "(--gpus / nvidia runtime)?"
)
BACKOFF_CAP_SECONDS = 300.0
PROCESS_KINDS: tuple[ProcessType, ...] = ("compute", "graphics", "mps")


@dataclass(slots=True)
class _Device:
    """Everything remembered about one physical GPU between cycles."""

    index: int
    uuid: str
    handle: Any
    info: GpuInfo
    ctx: DeviceCtx = field(init=False)
    unsupported_calls: set[str] = field(default_factory=set)
    slow_values: Values = field(default_factory=dict)
    slow_missing: frozenset[str] = frozenset()
    slow_done: bool = False
    mig: list[MigSlot] = field(default_factory=list)
    failures: int = 0
    retry_cycle: int = 0
    error: str | None = None
    util_last_seen_us: int | None = None
    util_supported: bool = True
    names: dict[int, str] = field(default_factory=dict)
    xids: XidState = field(default_factory=XidState)

    def __post_init__(self) -> None:
        self.new_context()

    def new_context(self) -> None:
        """Forget what the readers learnt about the handle (re-probe versioned calls)."""
        self.ctx = DeviceCtx.for_device(f"GPU {self.index} ({self.uuid})")


class NvmlBackend:
    """GPU samples read through NVML. See the module docstring for the error rules."""

    name = "nvml"

    def __init__(self, config: ExporterConfig, nvml: Any = None) -> None:
        self._config = config
        self._nvml_override = nvml
        self._nvml: Any = None
        self._devices: list[_Device] = []
        self._xid_events: XidEvents | None = None
        self._process_calls = process_list_calls()
        self._errors: dict[str, int] = {}
        self._cycle = 0
        self._prev_now: float | None = None
        self._open = False
        self._backoff_cap = max(1, math.ceil(BACKOFF_CAP_SECONDS / config.interval_seconds))

    # --- lifecycle -----------------------------------------------------------------------
    def open(self) -> BackendInfo:
        nvml = load_binding(self._nvml_override)
        self._nvml = nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as err:
            raise self._init_error(nvml, err) from err
        self._open = True
        try:
            driver = text(nvml.nvmlSystemGetDriverVersion())
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
            library = text(nvml.nvmlSystemGetNVMLVersion())
        except nvml.NVMLError:
            log.debug("nvmlSystemGetNVMLVersion failed; library version left blank")
        for index in range(count):
            self._devices.append(self._discover(index, driver, cuda))
        self._xid_events = XidEvents(nvml)
        for dev in self._devices:
            if dev.handle is not None:
                self._xid_events.track(dev)
        self._xid_events.start(self._devices)
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
        if self._xid_events is not None:
            self._xid_events.close()
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            log.debug("nvmlShutdown failed at close")

    def error_counts(self) -> Mapping[str, int]:
        return dict(self._errors)

    # --- sampling ------------------------------------------------------------------------
    def sample(self, now: float, slow: bool) -> Sequence[GpuSample]:
        self._cycle += 1
        if self._xid_events is not None:
            self._xid_events.drain(now)
        out: list[GpuSample] = []
        for dev in self._devices:
            # a memory-error XID changes ECC and row-remap counts now: read them now
            memory = any(ev.xid in MEMORY_ERROR_XIDS for ev in dev.xids.new)
            out.append(self._sample_or_down(dev, now, slow, memory))
            dev.xids.new = []
        self._prev_now = now
        return out

    def _sample_or_down(self, dev: _Device, now: float, slow: bool,
                        memory_xid: bool = False) -> GpuSample:
        nvml = self._nvml
        if dev.failures and self._cycle < dev.retry_cycle:
            return self._down(dev)
        try:
            if dev.failures:
                self._reacquire(dev)
            sample = self._sample_device(dev, now, slow, memory_xid)
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
            xid_totals=dict(dev.xids.totals),
            xid_last_timestamp=dev.xids.last,
            new_xids=tuple(dev.xids.new),
        )

    def _sample_device(self, dev: _Device, now: float, slow: bool,
                       memory_xid: bool = False) -> GpuSample:
        """Read one device; `memory_xid`: re-read the slow memory-error fields (ECC,
        retired pages, remapped rows) now, because a memory-error XID just arrived."""
        nvml = self._nvml
        run_slow = slow or not dev.slow_done
        info = read_identity(nvml, dev.handle, dev.info) if run_slow else dev.info
        values: Values = {}
        slow_values: Values = {}
        missing: set[str] = set()
        slow_missing: set[str] = set()
        reread: set[str] = set()  # slow keys read again this cycle
        for reader in READERS:
            is_slow = reader.tier == "slow"
            if is_slow and not run_slow and not (
                    memory_xid and MEMORY_ERROR_KEYS.intersection(reader.keys)):
                continue
            if is_slow:
                reread.update(reader.keys)
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
            target.update(got)
            for key in reader.keys:  # a loop, not a generator: ~14 readers x 8 GPUs a cycle
                if key not in got:
                    gaps.add(key)
        mig = self._mig(dev, info, run_slow)
        processes = self._processes(dev, now)
        # Commit slow-tier state only once the whole device read has succeeded.
        dev.info = info
        if run_slow:
            dev.slow_values = slow_values
            dev.slow_missing = frozenset(slow_missing)
            dev.slow_done = True
        elif reread:  # only the memory-error fields were read again
            kept = {k: v for k, v in dev.slow_values.items() if k not in reread}
            dev.slow_values = {**kept, **slow_values}
            dev.slow_missing = frozenset((dev.slow_missing - reread) | slow_missing)
        merged: Values = {**dev.slow_values, **values}
        return GpuSample(
            info=info,
            values=merged,
            unsupported=frozenset(missing | dev.slow_missing),
            processes=tuple(processes),
            mig=mig,
            xid_totals=dict(dev.xids.totals),
            xid_last_timestamp=dev.xids.last,
            new_xids=tuple(dev.xids.new),
        )

    def _mig(self, dev: _Device, info: GpuInfo, run_slow: bool) -> tuple[MigInstance, ...]:
        if not info.mig_mode:
            dev.mig = []
            return ()
        if run_slow:
            dev.mig = enumerate_mig(self._nvml, dev.handle)
        return read_mig(self._nvml, dev.mig)

    # --- processes -----------------------------------------------------------------------
    def _processes(self, dev: _Device, now: float) -> list[ProcessSample]:
        nvml = self._nvml
        lists: list[tuple[ProcessType, list[Any]]] = []
        for kind in PROCESS_KINDS:
            got = read_process_list(nvml, self._process_calls[kind], dev.handle)
            if got:
                lists.append((kind, got))
        newest: dict[int, UtilSample] = {}
        if lists and dev.util_supported:
            newest = self._utilization(dev, now)
        processes, dev.names = build_processes(lists, newest, dev.names, self._process_name)
        return processes

    def _utilization(self, dev: _Device, now: float) -> dict[int, UtilSample]:
        """Each pid's newest utilisation sample since the last cycle's; {} when none,
        or when the device does not offer per-process utilisation (then never again)."""
        nvml = self._nvml
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
            return {}
        newest, newest_ts = newest_util_samples(samples)
        if newest_ts is not None:
            dev.util_last_seen_us = newest_ts
        return newest

    def _process_name(self, pid: int) -> str:
        nvml = self._nvml
        try:
            return text(nvml.nvmlSystemGetProcessName(pid))
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
        try:
            return format_cuda_version(int(cuda_version_call()(nvml)))
        except nvml.NVMLError as err:
            if not is_unsupported(nvml, err):
                raise
        return ""

    def _discover(self, index: int, driver: str, cuda: str) -> _Device:
        nvml = self._nvml
        base = GpuInfo(uuid="", index=index, driver_version=driver, cuda_version=cuda)
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = text(nvml.nvmlDeviceGetUUID(handle))
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
        return _Device(index=index, uuid=uuid, handle=handle, info=_replace_uuid(base, uuid))

    def _reacquire(self, dev: _Device) -> None:
        nvml = self._nvml
        old_handle = dev.handle
        if old_handle is None:
            handle = nvml.nvmlDeviceGetHandleByIndex(dev.index)
            uuid = text(nvml.nvmlDeviceGetUUID(handle))
            dev.uuid = uuid
            dev.info = _replace_uuid(dev.info, uuid)
        else:
            handle = nvml.nvmlDeviceGetHandleByUUID(dev.uuid)
        dev.handle = handle
        dev.slow_done = False  # re-read identity and slow fields on recovery
        dev.new_context()
        if self._xid_events is not None:
            self._xid_events.retrack(dev, old_handle)


def _replace_uuid(info: GpuInfo, uuid: str) -> GpuInfo:
    return replace(info, uuid=uuid)


def create(config: ExporterConfig) -> NvmlBackend:
    """The NVML backend for this configuration (not opened yet)."""
    return NvmlBackend(config)
