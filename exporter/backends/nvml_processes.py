"""GPU processes through NVML: the running-process lists and per-process utilisation.

The process-info struct changed between drivers (v1 -> v2 -> v3) and a binding/driver
mismatch scrambles pids and memory values, so each list call (compute, graphics, MPS
compute) is probed once, newest first, and the choice is logged once on the
"gpu_audit.nvml" logger. Utilisation comes from `nvmlDeviceGetProcessUtilization`
with the newest driver timestamp seen on the previous cycle, so each cycle sees only
the samples taken since the last one; NVML's NotFound there means "no new samples".

This module must never decide GPU health; NVML errors other than "not offered" are
raised to the backend, which marks the GPU down.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from exporter.backends.nvml_fields import is_unsupported
from gpu_audit.model.samples import ProcessSample, ProcessType

log = logging.getLogger("gpu_audit.nvml")

# Newest first. The plain name is the oldest API on old bindings; on current bindings
# it is an alias of v3, which is harmless as a last resort.
PROCESS_CALLS: dict[ProcessType, tuple[str, ...]] = {
    "compute": (
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetComputeRunningProcesses",
    ),
    "graphics": (
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        "nvmlDeviceGetGraphicsRunningProcesses_v2",
        "nvmlDeviceGetGraphicsRunningProcesses",
    ),
    "mps": (
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
        "nvmlDeviceGetMPSComputeRunningProcesses_v2",
        "nvmlDeviceGetMPSComputeRunningProcesses",
    ),
}

NOT_AVAILABLE = (1 << 64) - 1  # NVML_VALUE_NOT_AVAILABLE as an unsigned long long
INSTANCE_NOT_AVAILABLE = (1 << 32) - 1  # gpuInstanceId / computeInstanceId outside MIG


@dataclass(slots=True)
class ProcessCallProbe:
    """Which versioned process-list call works, chosen once per kind for the library.

    A kind whose every variant is missing or unsupported is switched off for good
    (`chosen` is ""), so the calls are not repeated each cycle.
    """

    chosen: dict[ProcessType, str] = field(default_factory=dict)

    def call(self, nvml: Any, kind: ProcessType, handle: Any) -> list[Any] | None:
        """The process list of one kind, or None when this kind is not available."""
        name = self.chosen.get(kind)
        if name == "":
            return None
        if name is not None:
            return list(getattr(nvml, name)(handle))
        tried: list[str] = []
        for candidate in PROCESS_CALLS[kind]:
            fn = getattr(nvml, candidate, None)
            if fn is None:
                tried.append(f"{candidate} (absent from the binding)")
                continue
            try:
                result = list(fn(handle))
            except nvml.NVMLError as err:
                if is_unsupported(nvml, err):
                    tried.append(f"{candidate} ({type(err).__name__})")
                    continue
                raise
            self.chosen[kind] = candidate
            skipped = f" after {', '.join(tried)}" if tried else ""
            log.info("NVML %s process list: using %s%s", kind, candidate, skipped)
            return result
        self.chosen[kind] = ""
        log.info("NVML %s process list not available: %s", kind, ", ".join(tried))
        return None


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
