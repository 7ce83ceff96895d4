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
from dataclasses import dataclass, replace
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


def merge_process_lists(lists: Iterable[tuple[ProcessType, list[Any]]]) -> list[ProcessSample]:
    """One entry per (pid, GPU instance, compute instance); the first list wins.

    A process doing both compute and graphics ("C+G") appears in both lists with the
    same memory; counting it once keeps per-GPU totals honest.
    """
    seen: set[tuple[int, int | None, int | None]] = set()
    out: list[ProcessSample] = []
    for kind, entries in lists:
        for p in entries:
            gi = _optional_instance(getattr(p, "gpuInstanceId", None))
            ci = _optional_instance(getattr(p, "computeInstanceId", None))
            key = (int(p.pid), gi, ci)
            if key in seen:
                continue
            seen.add(key)
            out.append(
                ProcessSample(
                    pid=int(p.pid),
                    type=kind,
                    used_memory_bytes=_memory(getattr(p, "usedGpuMemory", None)),
                    gpu_instance_id=gi,
                    compute_instance_id=ci,
                )
            )
    return out


@dataclass(frozen=True, slots=True)
class UtilSample:
    """The newest process-utilisation sample of one pid, as ratios."""

    timestamp_us: int
    sm: float
    memory: float
    encoder: float
    decoder: float


def newest_util_samples(samples: Iterable[Any]) -> dict[int, UtilSample]:
    """Keep the newest sample per pid (the driver buffers several per period)."""
    out: dict[int, UtilSample] = {}
    for s in samples:
        pid = int(s.pid)
        ts = int(s.timeStamp)
        prev = out.get(pid)
        if prev is not None and prev.timestamp_us >= ts:
            continue
        out[pid] = UtilSample(
            timestamp_us=ts,
            sm=s.smUtil / 100.0,
            memory=s.memUtil / 100.0,
            encoder=s.encUtil / 100.0,
            decoder=s.decUtil / 100.0,
        )
    return out


def read_process_utilization(nvml: Any, handle: Any, last_seen_us: int) -> list[Any]:
    """Driver samples newer than `last_seen_us`; [] when there are none (NotFound)."""
    try:
        return list(nvml.nvmlDeviceGetProcessUtilization(handle, last_seen_us))
    except nvml.NVMLError_NotFound:
        return []


def apply_utilization(
    processes: list[ProcessSample], util: Mapping[int, UtilSample]
) -> list[ProcessSample]:
    """Processes with their utilisation ratios filled where a sample exists."""
    out: list[ProcessSample] = []
    for p in processes:
        u = util.get(p.pid)
        if u is None:
            out.append(p)
            continue
        out.append(
            replace(
                p,
                sm_util_ratio=u.sm,
                memory_util_ratio=u.memory,
                encoder_util_ratio=u.encoder,
                decoder_util_ratio=u.decoder,
            )
        )
    return out
