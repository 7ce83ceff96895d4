"""Event records of one GPU and cycle: `gpu_lost` / `gpu_recovered`, `process_end` /
`process_start` and `xid` (schema 2, as every event).

A record kind: the builder decides what happened (which processes came and went, by the
visible keys of gpu_audit.audit.parts) and calls this module with everything a record
needs (each changed process's `process` part and owner); it calls only the encoding leaf
(gpu_audit.audit.canonical), never back up.

A `process_start` also carries `software`, the libraries the process has loaded, when the
resolver found any (AttributedProcess.software); no other record does, so what a process
runs costs one record's bytes per process lifetime.

Pure: no I/O. Records carry only the allow-listed attribution parts they are given; this
module must never copy a process's environ or cgroup text into a record.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpu_audit.audit.canonical import (
    Cycle,
    Record,
    format_time_ns,
    process_key_str,
    to_time_ns,
)
from gpu_audit.model.attribution import AttributedProcess
from gpu_audit.model.samples import GpuSample

# A process that started or ended: (the process, its `process` part, attributed, its
# owner's record part or None), as the builder found them in its parts cache.
Changed = tuple[AttributedProcess, dict[str, Any], bool, Any]


def process_event(cyc: Cycle, event: str, gpu_part: Any, changed: Changed) -> Record:
    """A `process_start` or `process_end` record."""
    ap, process_part, owned, owner_part = changed
    rec = cyc.record(
        "event", event=event, gpu_uuid=ap.gpu_uuid, process_key=process_key_str(ap.process)
    )
    rec["gpu"] = gpu_part
    rec["process"] = process_part
    rec["attributed"] = owned
    if owned:
        rec["attribution"] = owner_part
    if ap.software is not None and event == "process_start":
        rec["software"] = ap.software.record_part()
    return rec


def gpu_events(  # noqa: PLR0917 - one call per GPU and cycle
    cyc: Cycle,
    gpu: GpuSample,
    prev_gpu: GpuSample | None,
    gpu_part: Any,
    prev_part: Any,
    ended: Sequence[Changed],
    started: Sequence[Changed],
) -> list[Record]:
    """The events of a GPU in the snapshot, in this order: lost / recovered (its up
    state changed, or it is down on the first snapshot), the processes that ended
    (`prev_part`: the GPU part of the previous sample), those that started, its XIDs."""
    out: list[Record] = []
    uuid = gpu.info.uuid
    was_up = prev_gpu.up if prev_gpu is not None else True
    if gpu.up != was_up or (not gpu.up and prev_gpu is None):
        ev = "gpu_recovered" if gpu.up else "gpu_lost"
        rec = cyc.record("event", event=ev, gpu_uuid=uuid)
        rec["gpu"] = gpu_part
        out.append(rec)
    for changed in ended:
        out.append(process_event(cyc, "process_end", prev_part, changed))
    for changed in started:
        out.append(process_event(cyc, "process_start", gpu_part, changed))
    for x in gpu.new_xids:
        xid_ns = to_time_ns(x.timestamp)
        rec = cyc.record("event", event="xid", gpu_uuid=uuid, xid_key=f"{x.xid}@{xid_ns}")
        rec["gpu"] = gpu_part
        rec["xid"] = {"code": x.xid, "time": format_time_ns(xid_ns), "time_ns": xid_ns}
        out.append(rec)
    return out


def missing_gpu_events(
    cyc: Cycle,
    uuid: str,
    *,
    was_up: bool,
    missing_part: Any,
    prev_part: Any,
    ended: Sequence[Changed],
) -> list[Record]:
    """The events of a GPU gone from the snapshot: lost (unless it was already down,
    `missing_part` saying why), and every process it listed ended (`prev_part`: its
    GPU part as last read)."""
    out: list[Record] = []
    if was_up:
        rec = cyc.record("event", event="gpu_lost", gpu_uuid=uuid)
        rec["gpu"] = missing_part
        out.append(rec)
    for changed in ended:
        out.append(process_event(cyc, "process_end", prev_part, changed))
    return out
