"""Usage records of one GPU and cycle: the `gpu` record, one `process` record per
process and the `unattributed` remainder, with the accounting that splits the interval's
energy between them (gpu_audit.audit.accounting), and the values they carry.

A record kind: the builder calls it with everything it needs (each process's owner and
cached `process` part, from gpu_audit.audit.parts); it calls only the leaves
(gpu_audit.audit.canonical, gpu_audit.audit.accounting), never back up.

Two ways to build `process` records, giving the same stored bytes: plain dicts (the
reference), and, for the producer, canonical.Encoded bytes assembled from members
serialised once per cycle, GPU, owner and process (tests/core/audit/test_golden.py and
test_node_cycle_bytes.py hold the two equal). Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from math import isfinite
from typing import TYPE_CHECKING, Any

import orjson

from gpu_audit.audit.accounting import (
    energy_of,
    energy_weights,
    finite,
    joules,
    split_units,
)
from gpu_audit.audit.canonical import Cycle, Encoded, Record, id_from_tail
from gpu_audit.model.attribution import AttributedProcess
from gpu_audit.model.fields import CATALOGUE
from gpu_audit.model.mig import unowned_slices
from gpu_audit.model.samples import GpuSample, ProcessSample

if TYPE_CHECKING:  # the owners the builder found in its cache: data, never a call
    from gpu_audit.audit.parts import Owner

# Catalogue key -> record value name: the metric name without its `gpu_` prefix.
VALUE_NAMES: dict[str, str] = {m.key: m.name.removeprefix("gpu_") for m in CATALOGUE}

# Value names shared by every record kind: one name per quantity, the name the gpu
# record uses (the catalogue metric name without `gpu_`), so one query charts them all.
MEMORY_USED = "memory_used_bytes"
UTILIZATION = "utilization_ratio"  # process: its SM share of the GPU's busy time
MEMORY_CONTROLLER_UTILIZATION = "memory_controller_utilization_ratio"
ENCODER_UTILIZATION = "encoder_utilization_ratio"
DECODER_UTILIZATION = "decoder_utilization_ratio"


def gpu_values(gpu: GpuSample) -> dict[str, Any]:
    """Measured values in base units: scalars as numbers, labelled values as an object
    keyed by the label values joined with "/" in the catalogue's label order."""
    out: dict[str, Any] = {}
    for key, series in gpu.values.items():
        name = VALUE_NAMES.get(key)
        if name is None:
            continue  # not a catalogue field: nothing downstream could name its unit
        if len(series) == 1 and () in series:
            v = series[()]
            if isfinite(v):
                out[name] = v
            continue
        labelled = {"/".join(lv): v for lv, v in series.items() if lv and isfinite(v)}
        if labelled:
            out[name] = labelled
    return out


def process_values(p: ProcessSample) -> dict[str, Any]:
    """A process's measured values, NaN/Inf left out as "not measured". The keys are
    inserted in sorted order, so the encoded records dump it without sorting (written
    out field by field: this runs once per process per cycle)."""
    out: dict[str, Any] = {}
    v = p.decoder_util_ratio
    if v is not None and isfinite(v):
        out[DECODER_UTILIZATION] = v
    v = p.encoder_util_ratio
    if v is not None and isfinite(v):
        out[ENCODER_UTILIZATION] = v
    v = p.memory_util_ratio
    if v is not None and isfinite(v):
        out[MEMORY_CONTROLLER_UTILIZATION] = v
    if p.used_memory_bytes is not None:
        out[MEMORY_USED] = p.used_memory_bytes
    v = p.sm_util_ratio
    if v is not None and isfinite(v):
        out[UTILIZATION] = v
    return out


def usage_records(  # noqa: PLR0917 - one call per GPU and cycle
    cyc: Cycle,
    gpu: GpuSample,
    procs: Sequence[AttributedProcess],
    owners: Sequence[Owner],
    proc_parts: Sequence[tuple[Any, bytes]],
    slices: dict[int, float] | None,
    *,
    prev_gpu: GpuSample | None,
    elapsed: float,
    counter_share: float,
    gpu_part: Any,
    gpu_bytes: bytes | None = None,
) -> list[Record | Encoded]:
    """The GPU's usage records of one cycle: `gpu`, one `process` per process (Encoded
    when `gpu_bytes`, the GPU part's canonical bytes, is given: the producer's path),
    `unattributed`.

    For an up GPU, `procs` are its processes (Snapshot.processes_of), `owners` and
    `proc_parts` what PartsCache.owner() and PartsCache.process() gave for each, and
    `slices` its MIG weights (gpu_audit.model.mig.process_weights; None: whole GPU)."""
    uuid = gpu.info.uuid
    grec = cyc.record("gpu", gpu_uuid=uuid)
    grec["gpu"] = gpu_part
    if not gpu.up:
        grec["values"] = {}
        grec["gpu_seconds"] = 0.0
        return [grec]
    grec["values"] = gpu_values(gpu)
    grec["gpu_seconds"] = elapsed
    energy = energy_of(gpu, prev_gpu, elapsed, counter_share)
    if energy is not None:
        grec["energy_joules"] = joules(energy[0])
        grec["energy_source"] = energy[1]
    out: list[Record | Encoded] = [grec]

    # One pass (this runs for every GPU and cycle): each process's SM ratio (finite,
    # else None) and used memory, apart for owned and unowned processes.
    own_sm: list[float | None] = []
    own_mem: list[int | None] = []
    un_sm: list[float | None] = []
    un_mem: list[int | None] = []
    for ap, o in zip(procs, owners, strict=True):
        p = ap.process
        sm = p.sm_util_ratio
        if sm is not None and not isfinite(sm):
            sm = None
        if o[1]:
            own_sm.append(sm)
            own_mem.append(p.used_memory_bytes)
        else:
            un_sm.append(sm)
            un_mem.append(p.used_memory_bytes)
    shares: list[int] = []
    if energy is not None:
        weights = energy_weights(
            attributed_sm=own_sm,
            attributed_mem=[float(m) if m is not None else None for m in own_mem],
            unattributed_sm=un_sm,
            unattributed_mem=[float(m) if m is not None else None for m in un_mem],
            gpu_util=finite(gpu.scalar("utilization_gpu")),
            gpu_mem_used=finite(gpu.scalar("memory_used")),
        )
        shares = split_units(energy[0], weights)

    if gpu_bytes is not None:
        out += encoded_process_records(cyc, procs, owners, proc_parts, shares, elapsed,
                                       gpu_bytes)
    else:
        out += process_records(cyc, procs, owners, proc_parts, shares, elapsed, gpu_part)

    un = cyc.record("unattributed", gpu_uuid=uuid)
    un["gpu"] = gpu_part
    uvals: dict[str, Any] = {"processes": len(un_sm)}
    mem_used = finite(gpu.scalar("memory_used"))
    if mem_used is not None:
        explained = sum(filter(None, own_mem))  # (None and 0 add nothing)
        uvals[MEMORY_USED] = max(0.0, mem_used - explained)
    util = finite(gpu.scalar("utilization_gpu"))
    if util is not None:
        # fsum is exact, so leaving out the None and zero ratios changes nothing
        explained_sm = math.fsum(filter(None, own_sm))
        uvals[UTILIZATION] = max(0.0, util - explained_sm)
    un["values"] = uvals
    un["gpu_seconds"] = 0.0 if own_sm else elapsed
    if slices is not None:  # by the slice: the instances only unowned processes run in
        gis = [(ap.process.gpu_instance_id, o[1])
               for ap, o in zip(procs, owners, strict=True)]
        un["gpu_seconds"] = elapsed * unowned_slices(
            slices, (gi for gi, owned in gis if owned), (gi for gi, owned in gis if not owned))
    if shares:
        un["energy_joules"] = joules(shares[-1])
    out.append(un)
    return out


def process_records(  # noqa: PLR0917 - one call per GPU and cycle
    cyc: Cycle, procs: Sequence[AttributedProcess], owners: Sequence[Owner],
    proc_parts: Sequence[tuple[Any, bytes]], shares: list[int], elapsed: float,
    gpu_part: Any,
) -> list[Record]:
    """The `process` records of one GPU and cycle as plain dicts (the reference)."""
    out: list[Record] = []
    owned_share = iter(shares)
    for ap, (_a, is_owned, owner_part, _head), (proc_part, tail) in zip(
            procs, owners, proc_parts, strict=True):
        p = ap.process
        sm = p.sm_util_ratio
        rec = dict(cyc.common)
        rec["kind"] = "process"
        rec["id"] = id_from_tail(cyc.id_prefix, tail)
        rec["gpu"] = gpu_part
        rec["process"] = proc_part
        rec["attributed"] = is_owned
        if is_owned:
            rec["attribution"] = owner_part
        rec["values"] = process_values(p)
        rec["gpu_seconds"] = elapsed
        if sm is not None and isfinite(sm):
            rec["busy_gpu_seconds"] = elapsed * max(0.0, sm)
        if is_owned and shares:
            rec["energy_joules"] = joules(next(owned_share))
        out.append(rec)
    return out


def encoded_process_records(  # noqa: PLR0917 - one call per GPU and cycle
    cyc: Cycle, procs: Sequence[AttributedProcess], owners: Sequence[Owner],
    proc_parts: Sequence[tuple[Any, bytes]], shares: list[int], elapsed: float,
    gpu_bytes: bytes,
) -> list[Encoded]:
    """The same records as process_records(), as canonical.Encoded bytes: the members
    shared by the cycle, the GPU, the owner and the process are serialised once (Cycle,
    PartsCache); per record only its id, busy seconds, energy and values are, each by
    orjson as in a whole record (tests/core/audit/test_node_cycle_bytes.py pins the
    bytes). This loop makes most of a cycle's records: it is kept lean on purpose
    (the values in sorted key order). `proc_parts`: with a fragments cache, each
    process's `mid` (its encoded members around the `process` part) and id tail."""
    elapsed_m, pre, pre_end, end = cyc.encoded_members()
    gpu_m = cyc.gpu_members(gpu_bytes, elapsed)
    dumps = orjson.dumps
    prefix, time_ns = cyc.id_prefix, cyc.time_ns
    owned_share = iter(shares)
    out: list[Encoded] = []
    for ap, (_a, is_owned, _part, owner_head), (mid, tail) in zip(
            procs, owners, proc_parts, strict=True):
        p = ap.process
        h = prefix.copy()
        h.update(tail)
        x = p.sm_util_ratio
        if x is not None and not isfinite(x):
            x = None  # not measured
        busy_m = busy = energy_m = energy = b""  # absent members
        if x is not None:
            busy_m, busy = _BUSY, dumps(elapsed * (x if x > 0.0 else 0.0))  # max(0.0, x)
        if is_owned and shares:
            energy_m, energy = _ENERGY, dumps(joules(next(owned_share)))
        head = b"".join((owner_head, busy_m, busy, elapsed_m, energy_m, energy, gpu_m))
        # right-sized (orjson's result keeps its ~4 KB output buffer, and a cycle's
        # records all live until they are sealed: ~2 MB of peak heap at 8 x 64)
        values = bytes(memoryview(dumps(process_values(p))))
        out.append((head, pre, h.hexdigest().encode(), pre_end, mid, end, values, time_ns))
    return out


_BUSY = b',"busy_gpu_seconds":'
_ENERGY = b',"energy_joules":'
