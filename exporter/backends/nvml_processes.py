"""GPU processes through NVML: the running-process lists and per-process utilisation.

The process-info struct changed between drivers (v1 -> v2 -> v3) and a binding/driver
mismatch scrambles pids and memory values, so each list call (compute, graphics, MPS
compute) is a `VersionedCall` (gpu_audit.nvml_shim): probed once, newest
first, the choice logged once on the "gpu_audit.nvml" logger. Utilisation comes from
`nvmlDeviceGetProcessUtilization` with the newest driver timestamp seen on the previous
cycle, so each cycle sees only the samples taken since the last one; NVML's NotFound
there means "no new samples".

Both are read on every cycle for every process (512 at 8 GPUs x 64): the
binding's process objects through their __dict__, its utilisation structs with one
`struct.unpack_from` each, and each ProcessSample built once, positionally.

This module must never decide GPU health (NVML errors other than "not offered" are
raised to the backend, which marks the GPU down), nor read a struct by position
unless its layout was checked against ctypes' own field offsets and size.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Iterable, Mapping
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


# (pid, driver timestamp in us, sm, memory, encoder, decoder percent): a pid's newest
# sample as the driver gave it (the unpacked struct itself: no copy, no object), made a
# ratio when its ProcessSample is built. 512 processes per cycle on a big node.
UtilSample = tuple[int, ...]


def build_processes(lists: Iterable[tuple[ProcessType, list[Any]]],
                    util: Mapping[int, UtilSample], known_names: Mapping[int, str],
                    name_of: Callable[[int], str]) -> tuple[list[ProcessSample], dict[int, str]]:
    """The cycle's ProcessSamples from the binding's process lists, and the names of
    the pids seen (for the next cycle's `known_names`: a pid that left is forgotten, so
    a reused pid is asked again).

    One sample per (pid, GPU instance, compute instance); the first list wins: a
    process doing both compute and graphics ("C+G") appears in both lists with the
    same memory, and counting it once keeps per-GPU totals honest. Each sample is built
    once, with its name (`known_names`, else `name_of(pid)`) and its utilisation ratios
    where the driver had a sample, positionally in ProcessSample's field order - one
    pass, no intermediate entries, no copies: this runs for every process in every
    cycle.
    """
    seen: set[object] = set()
    names: dict[int, str] = {}
    out: list[ProcessSample] = []
    append = out.append
    get_util = util.get
    for kind, entries in lists:
        for p in entries:
            # The binding hands out plain objects (nvmlFriendlyObject): their fields
            # are in __dict__, read there at a fraction of getattr(p, name, None)'s cost.
            # Anything else (a raw struct of an old binding) is read field by field.
            try:
                d = p.__dict__
                pid = int(d["pid"])
            except (AttributeError, KeyError):
                d = _fields_of(p)
                pid = int(d["pid"])
            gi = d.get("gpuInstanceId")
            if gi is not None:
                gi = None if gi == INSTANCE_NOT_AVAILABLE else int(gi)
            ci = d.get("computeInstanceId")
            if ci is not None:
                ci = None if ci == INSTANCE_NOT_AVAILABLE else int(ci)
            # outside MIG the pid alone is the key (no tuple to build and hash)
            key: object = pid if gi is None and ci is None else (pid, gi, ci)
            if key in seen:
                continue
            seen.add(key)
            mem = d.get("usedGpuMemory")
            if mem is not None:
                mem = None if mem == NOT_AVAILABLE else int(mem)
            name = known_names.get(pid)
            if name is None:
                name = names.get(pid)  # listed twice (C+G, MIG): asked once
                if name is None:
                    name = name_of(pid)
            names[pid] = name
            u = get_util(pid)
            if u is None:
                append(ProcessSample(pid, name, None, kind, mem, None, None, None, None,
                                     gi, ci))
            else:
                append(ProcessSample(pid, name, None, kind, mem, u[2] / 100.0, u[3] / 100.0,
                                     u[4] / 100.0, u[5] / 100.0, gi, ci))
    return out, names


def _fields_of(p: Any) -> dict[str, Any]:
    return {"pid": p.pid, "usedGpuMemory": getattr(p, "usedGpuMemory", None),
            "gpuInstanceId": getattr(p, "gpuInstanceId", None),
            "computeInstanceId": getattr(p, "computeInstanceId", None)}


_UTIL_FIELDS = ("pid", "timeStamp", "smUtil", "memUtil", "encUtil", "decUtil")
_CTYPE_CODES: dict[Any, str] = {ctypes.c_uint: "I", ctypes.c_ulonglong: "Q",
                                ctypes.c_int: "i", ctypes.c_longlong: "q"}
# struct class -> an unpacker of its six fields in _UTIL_FIELDS order, or None
_UNPACKERS: dict[type, Callable[[Any], tuple[int, ...]] | None] = {}


def _unpacker(cls: type) -> Callable[[Any], tuple[int, ...]] | None:
    """`struct.unpack_from` for the binding's utilisation-sample struct, when its
    layout is exactly the six integer fields in _UTIL_FIELDS order (offsets and size
    checked against ctypes' own): one C call per sample instead of six attribute reads
    through the binding's Python-level __getattribute__ (~5x faster; 512 samples per
    cycle at 8 GPUs x 64 processes). None: read the fields one by one."""
    try:
        return _UNPACKERS[cls]
    except KeyError:
        pass
    unpack: Callable[[Any], tuple[int, ...]] | None = None
    fields = getattr(cls, "_fields_", None)
    if (isinstance(cls, type) and issubclass(cls, ctypes.Structure) and fields is not None
            and tuple(f[0] for f in fields) == _UTIL_FIELDS
            and all(len(f) == 2 and f[1] in _CTYPE_CODES for f in fields)):
        fmt = "@"
        layout_ok = True
        for name, ctype in fields:
            fmt += _CTYPE_CODES[ctype]
            offset = struct.calcsize(fmt) - ctypes.sizeof(ctype)
            layout_ok = layout_ok and getattr(cls, name).offset == offset
        packed = struct.Struct(fmt)
        if layout_ok and packed.size == ctypes.sizeof(cls):
            unpack = packed.unpack_from
    _UNPACKERS[cls] = unpack
    return unpack


def newest_util_samples(samples: Iterable[Any]) -> tuple[dict[int, UtilSample], int | None]:
    """The newest sample per pid (the driver buffers several per period; see
    UtilSample), and the newest driver timestamp of all (None without samples)."""
    out: dict[int, UtilSample] = {}
    newest: int | None = None
    unpack: Callable[[Any], tuple[int, ...]] | None = None
    kind: type | None = None
    # The binding's structs override __getattribute__ (to decode bytes fields, which
    # these are not): the plain lookup reads the same fields at a third of the cost.
    get = object.__getattribute__
    for s in samples:
        if type(s) is not kind:
            kind = type(s)
            unpack = _unpacker(kind)
        if unpack is not None:
            u = unpack(s)
        else:
            u = (int(get(s, "pid")), int(get(s, "timeStamp")), get(s, "smUtil"),
                 get(s, "memUtil"), get(s, "encUtil"), get(s, "decUtil"))
        pid, ts = u[0], u[1]
        prev = out.get(pid)
        if prev is not None and prev[1] >= ts:
            continue
        out[pid] = u
        if newest is None or ts > newest:
            newest = ts
    return out, newest


def read_process_utilization(nvml: Any, handle: Any, last_seen_us: int) -> list[Any]:
    """Driver samples newer than `last_seen_us`; [] when there are none (NotFound)."""
    try:
        return list(nvml.nvmlDeviceGetProcessUtilization(handle, last_seen_us))
    except nvml.NVMLError_NotFound:
        return []
