"""GPU processes through NVML: the running-process lists and per-process utilisation.

The process-info struct changed between drivers (v1 -> v2 -> v3) and a binding/driver
mismatch scrambles pids and memory values, so each list call (compute, graphics, MPS
compute) is a `VersionedCall` (gpu_audit.nvml_shim): probed once, newest
first, the choice logged once on the "gpu_audit.nvml" logger. Utilisation comes from
`nvmlDeviceGetProcessUtilization` with the newest driver timestamp seen on the previous
cycle, so each cycle sees only the samples taken since the last one; NVML's NotFound
there means "no new samples".

This module must never decide GPU health; NVML errors other than "not offered" are
raised to the backend, which marks the GPU down.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpu_audit.model.samples import ProcessSample, ProcessType
from gpu_audit.nvml_shim import VersionedCall

NOT_AVAILABLE = (1 << 64) - 1  # NVML_VALUE_NOT_AVAILABLE as an unsigned long long
INSTANCE_NOT_AVAILABLE = (1 << 32) - 1  # gpuInstanceId / computeInstanceId outside MIG


def read_process_list(nvml: Any, call: VersionedCall, handle: Any) -> list[Any] | None:
    """The process list of one kind, or None when no version of its call is offered."""
    try:
        return list(call(nvml, handle))
    except nvml.NVMLError:
        if call.exhausted:
            return None  # no version is offered: this kind is off for good, unasked
        raise


def _optional_instance(value: Any) -> int | None:
    if value is None:
        return None
    v = int(value)
    return None if v == INSTANCE_NOT_AVAILABLE else v


def _memory(value: Any) -> int | None:
    if value is None:
        return None
    v = int(value)
    return None if v == NOT_AVAILABLE else v


# (pid, kind, used memory, GPU instance, compute instance): one merged list entry.
Entry = tuple[int, ProcessType, int | None, int | None, int | None]
# (driver timestamp in us, sm, memory, encoder, decoder ratios): a pid's newest sample.
# Plain tuples, not objects: 512 processes per cycle on a big node (issue 27).
UtilSample = tuple[int, float, float, float, float]


def merge_process_lists(lists: Iterable[tuple[ProcessType, list[Any]]]) -> list[Entry]:
    """One entry per (pid, GPU instance, compute instance); the first list wins.

    A process doing both compute and graphics ("C+G") appears in both lists with the
    same memory; counting it once keeps per-GPU totals honest.
    """
    seen: set[tuple[int, int | None, int | None]] = set()
    out: list[Entry] = []
    for kind, entries in lists:
        for p in entries:
            gi = _optional_instance(getattr(p, "gpuInstanceId", None))
            ci = _optional_instance(getattr(p, "computeInstanceId", None))
            pid = int(p.pid)
            key = (pid, gi, ci)
            if key in seen:
                continue
            seen.add(key)
            out.append((pid, kind, _memory(getattr(p, "usedGpuMemory", None)), gi, ci))
    return out


def newest_util_samples(samples: Iterable[Any]) -> dict[int, UtilSample]:
    """Keep the newest sample per pid (the driver buffers several per period)."""
    out: dict[int, UtilSample] = {}
    # The binding's structs override __getattribute__ (to decode bytes fields, which
    # these are not): the plain lookup reads the same fields at a third of the cost.
    get = object.__getattribute__
    for s in samples:
        pid = int(get(s, "pid"))
        ts = int(get(s, "timeStamp"))
        prev = out.get(pid)
        if prev is not None and prev[0] >= ts:
            continue
        out[pid] = (ts, get(s, "smUtil") / 100.0, get(s, "memUtil") / 100.0,
                    get(s, "encUtil") / 100.0, get(s, "decUtil") / 100.0)
    return out


def build_processes(entries: Iterable[Entry], names: Mapping[int, str],
                    util: Mapping[int, UtilSample]) -> list[ProcessSample]:
    """The cycle's ProcessSamples, each built once with its name and utilisation ratios
    (where the driver had a sample) - never copied field by field."""
    out: list[ProcessSample] = []
    for pid, kind, mem, gi, ci in entries:
        u = util.get(pid)
        if u is None:
            out.append(ProcessSample(pid=pid, name=names.get(pid, ""), type=kind,
                                     used_memory_bytes=mem, gpu_instance_id=gi,
                                     compute_instance_id=ci))
        else:
            out.append(ProcessSample(pid=pid, name=names.get(pid, ""), type=kind,
                                     used_memory_bytes=mem, sm_util_ratio=u[1],
                                     memory_util_ratio=u[2], encoder_util_ratio=u[3],
                                     decoder_util_ratio=u[4], gpu_instance_id=gi,
                                     compute_instance_id=ci))
    return out


def read_process_utilization(nvml: Any, handle: Any, last_seen_us: int) -> list[Any]:
    """Driver samples newer than `last_seen_us`; [] when there are none (NotFound)."""
    try:
        return list(nvml.nvmlDeviceGetProcessUtilization(handle, last_seen_us))
    except nvml.NVMLError_NotFound:
        return []
