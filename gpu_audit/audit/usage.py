"""Usage records of one GPU and cycle: the `gpu` record, one `process` record per
process and the `unattributed` remainder, with the accounting that splits the interval's
energy between them (gpu_audit.audit.accounting).

Two ways to build `process` records, giving the same stored bytes: plain dicts (the
reference), and, when the PartsCache holds pre-serialised parts, copies of templates whose
keys are already in sorted order so seal() need not sort (tests/core/audit/test_golden.py
holds the two equal). Pure: no I/O.
"""

from __future__ import annotations

import itertools
import math
from math import isfinite
from typing import Any

from gpu_audit.audit.accounting import energy_units, energy_weights, joules, split_units
from gpu_audit.audit.canonical import PENDING, SCHEMA_ID
from gpu_audit.audit.parts import (
    MEMORY_USED,
    UTILIZATION,
    Cycle,
    Record,
    gpu_values,
    process_values,
    process_values_sorted,
    processes_of,
)
from gpu_audit.model.mig import process_weights, unowned_slices
from gpu_audit.model.samples import GpuSample
from gpu_audit.model.snapshot import Snapshot


def finite(v: float | None) -> float | None:
    # A non-finite reading is "not measured" (as in `values`), never a number to use.
    return v if v is not None and isfinite(v) else None


def as_float(x: int | None) -> float | None:
    return float(x) if x is not None else None


def energy_of(
    gpu: GpuSample, prev_gpu: GpuSample | None, elapsed: float, counter_share: float
) -> tuple[int, str] | None:
    counter, power = finite(gpu.scalar("energy")), finite(gpu.scalar("power_usage"))
    prev_counter = (finite(prev_gpu.scalar("energy"))
                    if prev_gpu is not None and prev_gpu.up else None)
    return energy_units(counter, prev_counter, power, elapsed, counter_share=counter_share)


def usage_records(
    cyc: Cycle,
    snap: Snapshot,
    gpu: GpuSample,
    *,
    prev_gpu: GpuSample | None,
    elapsed: float,
    counter_share: float,
    gpu_part: Any,
) -> list[Record]:
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
    out = [grec]

    procs = processes_of(snap, gpu)
    owner_of = cyc.parts.get
    owners = [owner_of(ap.attribution) for ap in procs]
    owned = [ap for ap, (f, _) in zip(procs, owners, strict=True) if f]
    unowned = [ap for ap, (f, _) in zip(procs, owners, strict=True) if not f]
    shares: list[int] = []
    if energy is not None:
        weights = energy_weights(
            attributed_sm=[finite(ap.process.sm_util_ratio) for ap in owned],
            attributed_mem=[as_float(ap.process.used_memory_bytes) for ap in owned],
            unattributed_sm=[finite(ap.process.sm_util_ratio) for ap in unowned],
            unattributed_mem=[as_float(ap.process.used_memory_bytes) for ap in unowned],
            gpu_util=finite(gpu.scalar("utilization_gpu")),
            gpu_mem_used=finite(gpu.scalar("memory_used")),
        )
        shares = split_units(energy[0], weights)
    owned_share = iter(shares)

    slices = process_weights(gpu)  # MIG: gpu_instance_id -> weight (None: whole GPU)
    parts = cyc.parts
    templates = presorted_templates(cyc, gpu_part, elapsed) if parts.fragments else None
    prefix = cyc.id_prefix
    for ap, (is_owned, owner_part) in zip(procs, owners, strict=True):
        p = ap.process
        proc_part, tail = parts.process(
            uuid, p, slices.get(p.gpu_instance_id) if slices is not None
            and p.gpu_instance_id is not None else None)
        h = prefix.copy()
        h.update(tail)
        rid: str = h.hexdigest()
        sm = p.sm_util_ratio
        busy = elapsed * max(0.0, sm) if sm is not None and isfinite(sm) else None
        energy_j = joules(next(owned_share)) if is_owned and shares else None
        if templates is not None:
            # A copy of the template keeps its (sorted) key order; then fill it in.
            rec = templates[busy is not None, energy_j is not None, is_owned].copy()
            if is_owned:
                rec["attribution"] = owner_part
            if busy is not None:
                rec["busy_gpu_seconds"] = busy
            if energy_j is not None:
                rec["energy_joules"] = energy_j
            rec["id"] = rid
            rec["process"] = proc_part
            rec["values"] = process_values_sorted(p)
            out.append(rec)
            continue
        rec = dict(cyc.common)
        rec["kind"] = "process"
        rec["id"] = rid
        rec["gpu"] = gpu_part
        rec["process"] = proc_part
        rec["attributed"] = is_owned
        if is_owned:
            rec["attribution"] = owner_part
        rec["values"] = process_values(p)
        rec["gpu_seconds"] = elapsed
        if busy is not None:
            rec["busy_gpu_seconds"] = busy
        if energy_j is not None:
            rec["energy_joules"] = energy_j
        out.append(rec)

    un = cyc.record("unattributed", gpu_uuid=uuid)
    un["gpu"] = gpu_part
    uvals: dict[str, Any] = {"processes": len(unowned)}
    mem_used = finite(gpu.scalar("memory_used"))
    if mem_used is not None:
        explained = sum(ap.process.used_memory_bytes or 0 for ap in owned)
        uvals[MEMORY_USED] = max(0.0, mem_used - explained)
    util = finite(gpu.scalar("utilization_gpu"))
    if util is not None:
        explained_sm = math.fsum(finite(ap.process.sm_util_ratio) or 0.0 for ap in owned)
        uvals[UTILIZATION] = max(0.0, util - explained_sm)
    un["values"] = uvals
    un["gpu_seconds"] = 0.0 if owned else elapsed
    if slices is not None:  # by the slice: the instances only unowned processes run in
        un["gpu_seconds"] = elapsed * unowned_slices(
            slices, (ap.process.gpu_instance_id for ap in owned),
            (ap.process.gpu_instance_id for ap in unowned))
    if shares:
        un["energy_joules"] = joules(shares[-1])
    out.append(un)
    return out


def presorted_templates(
    cyc: Cycle, gpu_part: Any, elapsed: float
) -> dict[tuple[bool, bool, bool], Record]:
    """`process` records of one GPU and cycle, per (has busy_gpu_seconds, has
    energy_joules, attributed), with every member in sorted key order, the per-cycle
    ones filled in and `seq` / `prev_hash` as placeholders (PENDING: seal() relies on
    the order; a test checks it). The per-process members are set on a copy."""
    out: dict[tuple[bool, bool, bool], Record] = {}
    for busy, energy, owned in itertools.product((False, True), repeat=3):
        rec: Record = {"attributed": owned}
        if owned:
            rec["attribution"] = None
        if busy:
            rec["busy_gpu_seconds"] = 0.0
        rec["elapsed_seconds"] = cyc.common["elapsed_seconds"]
        if energy:
            rec["energy_joules"] = 0.0
        rec["exporter_version"] = cyc.exporter_version
        rec["gpu"] = gpu_part
        rec["gpu_seconds"] = elapsed
        rec["host"] = cyc.host
        rec["id"] = ""
        rec["interval_seconds"] = cyc.interval_seconds
        rec["kind"] = "process"
        rec["prev_hash"] = PENDING
        rec["process"] = None
        rec["schema"] = SCHEMA_ID
        rec["seq"] = 0
        rec["simulated"] = cyc.simulated
        rec["stream"] = cyc.stream
        rec["time"] = cyc.time
        rec["time_ns"] = cyc.time_ns
        rec["values"] = None
        out[busy, energy, owned] = rec
    return out
