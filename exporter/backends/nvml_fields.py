"""Per-device NVML field readers: one NVML call in, catalogue keys in base units out.

Each `FieldReader` wraps one NVML call (or one batched `nvmlDeviceGetFieldValues`) and
returns the catalogue keys it can fill, already converted to the unit the catalogue
names (mW->W, mJ->J, MHz->Hz, percent->ratio, KiB->bytes). A reader raises the NVML
error it got; deciding what an error means (field unsupported, GPU down) is the
backend's job, so the readers stay small and testable.

A key a reader declares but leaves out of its result is "not supported on this device
this cycle" (for example `memory_reserved` on the v1 memory call, or NVLink keys on a
board without links). Readers never return NaN, 0 or a sentinel for a missing value.

Versioned functions (memory info, clock event reasons) go through the per-device
`VersionedCall`s in `DeviceCtx` (gpu_audit.nvml_shim), which pick the version
once and log the choice.

This module must never decide GPU health, log, or call NVML outside `FieldReader.read`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpu_audit.model.fields import CLOCK_EVENT_REASONS, VIOLATION_POLICIES, Tier
from gpu_audit.model.samples import LabelValues
from gpu_audit.nvml_shim import (
    VersionedCall,
    clock_reasons_call,
    is_one_of,
    memory_info_call,
)

Values = dict[str, dict[LabelValues, float]]

ECC_ERROR_TYPES: tuple[tuple[str, str], ...] = (
    ("corrected", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
    ("uncorrected", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"),
)
ECC_COUNTERS: tuple[tuple[str, str], ...] = (
    ("volatile", "NVML_VOLATILE_ECC"),
    ("aggregate", "NVML_AGGREGATE_ECC"),
)
RETIREMENT_CAUSES: tuple[tuple[str, str], ...] = (
    ("single_bit_ecc", "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS"),
    ("double_bit_ecc", "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR"),
)
NVLINK_ERROR_COUNTERS: tuple[tuple[str, str], ...] = (
    ("replay", "NVML_NVLINK_ERROR_DL_REPLAY"),
    ("recovery", "NVML_NVLINK_ERROR_DL_RECOVERY"),
    ("crc_flit", "NVML_NVLINK_ERROR_DL_CRC_FLIT"),
    ("crc_data", "NVML_NVLINK_ERROR_DL_CRC_DATA"),
)
PSTATE_UNKNOWN = 32  # NVML_PSTATE_UNKNOWN
NVLINK_MAX_LINKS_DEFAULT = 18


@dataclass(slots=True)
class DeviceCtx:
    """What the readers remember about one device between cycles.

    `links` is filled on slow cycles by the NVLink reader and used by the fast
    field-values reader; `memory_info` and `clock_reasons` remember which version of
    their function this device answered (re-probed when the handle is re-acquired,
    because the context is then built anew).
    """

    memory_info: VersionedCall
    clock_reasons: VersionedCall
    links: tuple[int, ...] | None = None

    @classmethod
    def for_device(cls, device: str) -> DeviceCtx:
        """A fresh context; `device` names the GPU in the version-choice log line."""
        return cls(memory_info=memory_info_call(device), clock_reasons=clock_reasons_call(device))


ReadFn = Callable[[Any, Any, DeviceCtx], Values]


@dataclass(frozen=True, slots=True)
class FieldReader:
    """One NVML call and the catalogue keys it fills."""

    call: str
    keys: tuple[str, ...]
    tier: Tier
    read: ReadFn


def _scalar(key: str, value: float) -> Values:
    return {key: {(): float(value)}}


def _utilization(nvml: Any, handle: Any, _: DeviceCtx) -> Values:
    u = nvml.nvmlDeviceGetUtilizationRates(handle)
    return {
        "utilization_gpu": {(): u.gpu / 100.0},
        "utilization_memory": {(): u.memory / 100.0},
    }


def _encoder(nvml: Any, handle: Any, _: DeviceCtx) -> Values:
    util, _period = nvml.nvmlDeviceGetEncoderUtilization(handle)
    return _scalar("utilization_encoder", util / 100.0)


def _decoder(nvml: Any, handle: Any, _: DeviceCtx) -> Values:
    util, _period = nvml.nvmlDeviceGetDecoderUtilization(handle)
    return _scalar("utilization_decoder", util / 100.0)


def _memory(nvml: Any, handle: Any, ctx: DeviceCtx) -> Values:
    memory = ctx.memory_info(nvml, handle)
    out: Values = {
        "memory_total": {(): float(memory.total)},
        "memory_used": {(): float(memory.used)},
        "memory_free": {(): float(memory.free)},
    }
    reserved = getattr(memory, "reserved", None)  # only the v2 struct has it
    if reserved is not None:
        out["memory_reserved"] = {(): float(reserved)}
    return out


def _temperature(nvml: Any, handle: Any, _: DeviceCtx) -> Values:
    celsius = nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
    return _scalar("temperature_gpu", celsius)


def _power_usage(nvml: Any, handle: Any, _: DeviceCtx) -> Values:
    return _scalar("power_usage", nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)


def _power_limit(nvml: Any, handle: Any, _: DeviceCtx) -> Values:
    return _scalar("power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0)


def _energy(nvml: Any, handle: Any, _: DeviceCtx) -> Values:
    return _scalar("energy", nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0)


def _clock_sm(nvml: Any, handle: Any, _: DeviceCtx) -> Values:
    return _scalar("clock_sm", nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM) * 1e6)


def _clock_mem(nvml: Any, handle: Any, _: DeviceCtx) -> Values:
    return _scalar("clock_memory", nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM) * 1e6)


def _fan(nvml: Any, handle: Any, _: DeviceCtx) -> Values:
    return _scalar("fan_speed", nvml.nvmlDeviceGetFanSpeed(handle) / 100.0)


def _pstate(nvml: Any, handle: Any, _: DeviceCtx) -> Values:
    p = int(nvml.nvmlDeviceGetPerformanceState(handle))
    # NVML_PSTATE_UNKNOWN is a sentinel, not a state: leave the key out this cycle.
    return {} if p == PSTATE_UNKNOWN else _scalar("performance_state", p)


def _clock_reasons(nvml: Any, handle: Any, ctx: DeviceCtx) -> Values:
    mask = int(ctx.clock_reasons(nvml, handle))
    return {
        "clock_event_reason": {
            (reason,): 1.0 if mask & bit else 0.0 for reason, bit in CLOCK_EVENT_REASONS.items()
        }
    }


def _ecc(nvml: Any, handle: Any, _: DeviceCtx) -> Values:
    out: dict[LabelValues, float] = {}
    for type_label, type_const in ECC_ERROR_TYPES:
        for counter_label, counter_const in ECC_COUNTERS:
            out[(type_label, counter_label)] = float(
                nvml.nvmlDeviceGetTotalEccErrors(
                    handle, getattr(nvml, type_const), getattr(nvml, counter_const)
                )
            )
    return {"ecc_errors": out}


def _retired_pages(nvml: Any, handle: Any, _: DeviceCtx) -> Values:
    out: dict[LabelValues, float] = {}
    for cause_label, cause_const in RETIREMENT_CAUSES:
        pages = nvml.nvmlDeviceGetRetiredPages(handle, getattr(nvml, cause_const))
        out[(cause_label,)] = float(len(pages))
    return {"retired_pages": out}


def _retired_pending(nvml: Any, handle: Any, _: DeviceCtx) -> Values:
    pending = nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)
    return _scalar("retired_pages_pending", 1.0 if pending else 0.0)


def _remapped_rows(nvml: Any, handle: Any, _: DeviceCtx) -> Values:
    corr, unc, pending, failure = nvml.nvmlDeviceGetRemappedRows(handle)
    return {
        "remapped_rows": {("correctable",): float(corr), ("uncorrectable",): float(unc)},
        "remapped_rows_pending": {(): 1.0 if pending else 0.0},
        "remapped_rows_failure": {(): 1.0 if failure else 0.0},
    }


def _violation(nvml: Any, handle: Any, _: DeviceCtx) -> Values:
    # violationTime is nanoseconds of clock reduction by the policy since driver load.
    out: dict[LabelValues, float] = {}
    for policy, code in VIOLATION_POLICIES.items():
        status = nvml.nvmlDeviceGetViolationStatus(handle, code)
        out[(policy,)] = float(status.violationTime) / 1e9
    return {"violation_time": out}


def _pcie_replay(nvml: Any, handle: Any, _: DeviceCtx) -> Values:
    return _scalar("pcie_replay", nvml.nvmlDeviceGetPcieReplayCounter(handle))


def _link_absent(nvml: Any, err: BaseException) -> bool:
    return is_one_of(nvml, err, ("NVMLError_NotSupported", "NVMLError_InvalidArgument"))


def _nvlink(nvml: Any, handle: Any, ctx: DeviceCtx) -> Values:
    # Links are numbered from 0; the first NotSupported / InvalidArgument marks the end,
    # so a PCIe-only board costs one call and an 18-link H100 costs 18 + counters.
    max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", NVLINK_MAX_LINKS_DEFAULT))
    up: dict[LabelValues, float] = {}
    errors: dict[LabelValues, float] = {}
    links: list[int] = []
    for link in range(max_links):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except nvml.NVMLError as err:
            if _link_absent(nvml, err):
                break
            raise
        links.append(link)
        up[(str(link),)] = 1.0 if state else 0.0
        if not state:
            continue  # an inactive link's counters are not maintained
        for type_label, const in NVLINK_ERROR_COUNTERS:
            try:
                value = nvml.nvmlDeviceGetNvLinkErrorCounter(handle, link, getattr(nvml, const))
            except nvml.NVMLError as err:
                if _link_absent(nvml, err):
                    continue
                raise
            errors[(str(link), type_label)] = float(value)
    ctx.links = tuple(links)
    out: Values = {}
    if up:
        out["nvlink_up"] = up
    if errors:
        out["nvlink_errors"] = errors
    return out


def _field_values(nvml: Any, handle: Any, ctx: DeviceCtx) -> Values:
    # One batched call for every field-id value: memory temperature plus NVLink data
    # counters for each existing link. Each entry carries its own return code.
    ids: list[Any] = [nvml.NVML_FI_DEV_MEMORY_TEMP]
    links = ctx.links or ()
    for link in links:
        ids.append((nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link))
        ids.append((nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link))
    results = nvml.nvmlDeviceGetFieldValues(handle, ids)
    out: Values = {}
    success = getattr(nvml, "NVML_SUCCESS", 0)
    first = results[0]
    if first.nvmlReturn == success:
        out["temperature_memory"] = {(): field_value(nvml, first)}
    data: dict[LabelValues, float] = {}
    for i, link in enumerate(links):
        for j, direction in enumerate(("transmit", "receive")):
            fv = results[1 + 2 * i + j]
            if fv.nvmlReturn == success:
                data[(str(link), direction)] = field_value(nvml, fv) * 1024.0
    if data:
        out["nvlink_bytes"] = data
    return out


def field_value(nvml: Any, fv: Any) -> float:
    """The number inside an nvmlFieldValue_t, whatever its value type."""
    member = {
        getattr(nvml, "NVML_VALUE_TYPE_DOUBLE", 0): "dVal",
        getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_INT", 1): "uiVal",
        getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_LONG", 2): "ulVal",
        getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG", 3): "ullVal",
        getattr(nvml, "NVML_VALUE_TYPE_SIGNED_LONG_LONG", 4): "sllVal",
        getattr(nvml, "NVML_VALUE_TYPE_SIGNED_INT", 5): "siVal",
        getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_SHORT", 6): "usVal",
    }.get(fv.valueType, "ullVal")
    return float(getattr(fv.value, member))


READERS: tuple[FieldReader, ...] = (
    FieldReader("nvmlDeviceGetUtilizationRates", ("utilization_gpu", "utilization_memory"),
                "fast", _utilization),
    FieldReader("nvmlDeviceGetEncoderUtilization", ("utilization_encoder",), "fast", _encoder),
    FieldReader("nvmlDeviceGetDecoderUtilization", ("utilization_decoder",), "fast", _decoder),
    FieldReader("nvmlDeviceGetMemoryInfo",
                ("memory_total", "memory_used", "memory_free", "memory_reserved"),
                "fast", _memory),
    FieldReader("nvmlDeviceGetTemperature", ("temperature_gpu",), "fast", _temperature),
    FieldReader("nvmlDeviceGetPowerUsage", ("power_usage",), "fast", _power_usage),
    FieldReader("nvmlDeviceGetEnforcedPowerLimit", ("power_limit",), "slow", _power_limit),
    FieldReader("nvmlDeviceGetTotalEnergyConsumption", ("energy",), "fast", _energy),
    FieldReader("nvmlDeviceGetClockInfo(SM)", ("clock_sm",), "fast", _clock_sm),
    FieldReader("nvmlDeviceGetClockInfo(MEM)", ("clock_memory",), "fast", _clock_mem),
    FieldReader("nvmlDeviceGetFanSpeed", ("fan_speed",), "fast", _fan),
    FieldReader("nvmlDeviceGetPerformanceState", ("performance_state",), "fast", _pstate),
    FieldReader("nvmlDeviceGetCurrentClocksEventReasons", ("clock_event_reason",), "fast",
                _clock_reasons),
    FieldReader("nvmlDeviceGetViolationStatus", ("violation_time",), "fast", _violation),
    FieldReader("nvmlDeviceGetTotalEccErrors", ("ecc_errors",), "slow", _ecc),
    FieldReader("nvmlDeviceGetRetiredPages", ("retired_pages",), "slow", _retired_pages),
    FieldReader("nvmlDeviceGetRetiredPagesPendingStatus", ("retired_pages_pending",), "slow",
                _retired_pending),
    FieldReader("nvmlDeviceGetRemappedRows",
                ("remapped_rows", "remapped_rows_pending", "remapped_rows_failure"),
                "slow", _remapped_rows),
    FieldReader("nvmlDeviceGetPcieReplayCounter", ("pcie_replay",), "fast", _pcie_replay),
    # The NVLink reader must precede the field-values reader: it discovers the links.
    FieldReader("nvmlDeviceGetNvLinkState", ("nvlink_up", "nvlink_errors"), "slow", _nvlink),
    FieldReader("nvmlDeviceGetFieldValues", ("temperature_memory", "nvlink_bytes"), "fast",
                _field_values),
)
