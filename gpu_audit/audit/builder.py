"""Turn one sampling cycle (a Snapshot, and the one before it) into audit records.

Pure: a snapshot in, a list of plain dicts out, without `seq`, `prev_hash` and `hash`
(the producer chains them). Records follow schema version 2: one value name per
quantity in every kind, unknown fields absent (never ""). Per cycle, in this order, for
each GPU of the snapshot (usage records only when the cycle measured an interval, i.e.
not on the first snapshot after a start):

- one `gpu` record (down GPUs too, with `gpu.up` false, no values, 0 GPU-seconds);
- for an up GPU, one `process` record per process NVML reports (attributed or not:
  `attributed` says which; an unowned process keeps its pid and name as evidence) and
  one `unattributed` record for the usage no attributed process explains;
- events: `gpu_lost` / `gpu_recovered` (up transitions; a GPU missing from the snapshot
  counts as lost), `process_end` / `process_start` (the set of visible (GPU, pid, start
  time) keys changed), `xid` (GpuSample.new_xids). A `process_start` also carries
  `software`, the libraries the process has loaded, when the resolver found any
  (AttributedProcess.software); no other record does, so what a process runs costs one
  record's bytes per process lifetime.

Records of one cycle share nested objects (the GPU part, an owner's attribution part):
treat them as read-only; the producer only ever sets top-level `seq` / `prev_hash` /
`hash`.

This module orders a cycle and makes its events; the usage records and their accounting
are gpu_audit.audit.usage, the parts they share and their cache gpu_audit.audit.parts.

Records carry only the allow-listed attribution fields (IDENTITY_FIELDS and their
sources); this module must never copy a process's environ or cgroup text into a record,
and never do I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from gpu_audit.audit.accounting import elapsed_for
from gpu_audit.audit.canonical import (
    SCHEMA_ID,
    Encoded,
    canonical_bytes,
    format_time_ns,
    record_id,
    to_time_ns,
)
from gpu_audit.audit.parts import (
    VALUE_NAMES,
    Cycle,
    PartsCache,
    Record,
    gpu_part_of,
    gpu_values,
    process_key_str,
    process_part_of,
    visible_processes,
)
from gpu_audit.audit.usage import usage_records
from gpu_audit.model.attribution import AttributedProcess
from gpu_audit.model.samples import GpuSample
from gpu_audit.model.snapshot import Snapshot


def _process_event(
    cyc: Cycle, event: str, gpu_part: Any, ap: AttributedProcess
) -> Record:
    p = ap.process
    rec = cyc.record(
        "event", event=event, gpu_uuid=ap.gpu_uuid, process_key=process_key_str(p)
    )
    rec["gpu"] = gpu_part
    rec["process"] = process_part_of(p)
    owned, part = cyc.attribution(ap)
    rec["attributed"] = owned
    if owned:
        rec["attribution"] = part
    if ap.software is not None and event == "process_start":
        rec["software"] = ap.software.record_part()
    return rec


def _event_records(
    cyc: Cycle,
    snap: Snapshot,
    prev: Snapshot | None,
    *,
    gpu: GpuSample,
    prev_gpu: GpuSample | None,
    gpu_part: Any,
) -> list[Record]:
    out: list[Record] = []
    uuid = gpu.info.uuid
    was_up = prev_gpu.up if prev_gpu is not None else True
    if gpu.up != was_up or (not gpu.up and prev_gpu is None):
        ev = "gpu_recovered" if gpu.up else "gpu_lost"
        rec = cyc.record("event", event=ev, gpu_uuid=uuid)
        rec["gpu"] = gpu_part
        out.append(rec)
    now_keys, now_procs = cyc.parts.visible(snap, gpu)
    before_keys, before_procs = cyc.parts.visible(prev, prev_gpu, now=False)
    # Most cycles change no process: equal key lists (compared in C, no dict built) have
    # no event; otherwise the dicts say which keys came and went, in the lists' order.
    if now_keys != before_keys:
        now = dict(zip(now_keys, now_procs, strict=True))
        before = dict(zip(before_keys, before_procs, strict=True))
        prev_part = gpu_part_of(prev_gpu) if prev_gpu is not None else gpu_part
        for key, ap in before.items():
            if key not in now:
                out.append(_process_event(cyc, "process_end", prev_part, ap))
        for key, ap in now.items():
            if key not in before:
                out.append(_process_event(cyc, "process_start", gpu_part, ap))
    for x in gpu.new_xids:
        xid_ns = to_time_ns(x.timestamp)
        rec = cyc.record("event", event="xid", gpu_uuid=uuid, xid_key=f"{x.xid}@{xid_ns}")
        rec["gpu"] = gpu_part
        rec["xid"] = {"code": x.xid, "time": format_time_ns(xid_ns), "time_ns": xid_ns}
        out.append(rec)
    return out


def build_records(
    snap: Snapshot,
    prev: Snapshot | None,
    *,
    stream: str,
    exporter_version: str,
    host: str | None = None,
    simulated: bool | None = None,
    max_elapsed_intervals: float = 3.0,
    parts: PartsCache | None = None,
    usage: bool = True,
) -> list[Record]:
    """All audit records of one cycle, unchained (no seq / prev_hash / hash).

    `prev` is the previous snapshot of this exporter run (None for the first): it gives
    the energy baseline, the elapsed time and the event diffs. Without it (or when no
    time passed) only events are built: no interval was measured. `host` defaults to the
    snapshot's host; `simulated` to what the backend says (the producer may only turn
    it on, never off). `parts`: a cache kept by the caller across cycles (speed only;
    the records are the same without it; one with fragments is build_cycle's). `usage=False`:
    the events only (the interval trail accounts usage in gpu_audit.audit.interval).
    """
    if parts is not None and parts.fragments:
        raise ValueError("a PartsCache with fragments builds records for build_cycle()")
    return _build(snap, prev, stream=stream, exporter_version=exporter_version, host=host,
                  simulated=simulated, max_elapsed_intervals=max_elapsed_intervals,
                  parts=parts if parts is not None else PartsCache(), usage=usage)


def build_cycle(
    snap: Snapshot,
    prev: Snapshot | None,
    *,
    stream: str,
    exporter_version: str,
    parts: PartsCache,
    host: str | None = None,
    simulated: bool | None = None,
    max_elapsed_intervals: float = 3.0,
    usage: bool = True,
) -> list[Record | Encoded]:
    """build_records() for the producer: the same records, to be sealed with
    canonical.seal_chain() (or seal_any()); with a `parts` cache that has fragments, the
    `process` records are canonical.Encoded bytes and the others hold pre-serialised
    parts."""
    return _build(snap, prev, stream=stream, exporter_version=exporter_version, host=host,
                  simulated=simulated, max_elapsed_intervals=max_elapsed_intervals,
                  parts=parts, usage=usage)


def _build(
    snap: Snapshot,
    prev: Snapshot | None,
    *,
    stream: str,
    exporter_version: str,
    host: str | None,
    simulated: bool | None,
    max_elapsed_intervals: float,
    parts: PartsCache,
    usage: bool,
) -> list[Any]:
    elapsed = elapsed_for(
        snap.timestamp,
        prev.timestamp if prev is not None else None,
        snap.interval_seconds,
        max_elapsed_intervals,
    )
    # After a capped pause only the accounted part of the counter delta is billed; the
    # raw counter stays in values.energy_joules_total for fleet totals.
    real = snap.timestamp - prev.timestamp if prev is not None else 0.0
    counter_share = elapsed / real if 0 < elapsed < real else 1.0
    cyc = Cycle(
        snap,
        host=host if host is not None else snap.host,
        stream=stream,
        exporter_version=exporter_version,
        simulated=snap.backend.simulated if simulated is None else simulated,
        elapsed=elapsed,
        parts=parts,
    )
    prev_gpus: Mapping[str, GpuSample] = (
        {g.info.uuid: g for g in prev.gpus} if prev is not None else {}
    )
    out: list[Record | Encoded] = []
    events: list[Record] = []
    fragments = parts.fragments
    for gpu in snap.gpus:
        prev_gpu = prev_gpus.get(gpu.info.uuid)
        gpu_bytes: bytes | None = None
        if fragments:  # one cycle's: not kept, so not right-sized (parts.kept_bytes)
            gpu_bytes = canonical_bytes(gpu_part_of(gpu))
            part: Any = orjson.Fragment(gpu_bytes)
        else:
            part = gpu_part_of(gpu)
        # A cycle that measured no interval (the first after a start; the clock went
        # backwards) has no usage to report: a row of zeros would only be noise in
        # every chart. Its snapshot still is the baseline of the next interval.
        if usage and elapsed > 0:
            out.extend(
                usage_records(
                    cyc, snap, gpu, prev_gpu=prev_gpu, elapsed=elapsed,
                    counter_share=counter_share, gpu_part=part, gpu_bytes=gpu_bytes,
                )
            )
        events.extend(
            _event_records(cyc, snap, prev, gpu=gpu, prev_gpu=prev_gpu, gpu_part=part)
        )
    seen = {g.info.uuid for g in snap.gpus}
    for uuid, prev_gpu in prev_gpus.items():
        if uuid in seen:
            continue
        # Gone from the snapshot: lost (unless it was already down), processes ended.
        part = {**gpu_part_of(prev_gpu), "up": False, "error": "missing"}
        if prev_gpu.up:
            rec = cyc.record("event", event="gpu_lost", gpu_uuid=uuid)
            rec["gpu"] = part
            events.append(rec)
        for ap in visible_processes(prev, prev_gpu).values():
            events.append(_process_event(cyc, "process_end", gpu_part_of(prev_gpu), ap))
    out.extend(events)
    cyc.parts.end_cycle()
    return out


def exporter_event(
    event: str,
    *,
    timestamp: float,
    host: str,
    stream: str,
    exporter_version: str,
    simulated: bool,
    interval_seconds: float = 0.0,
) -> Record:
    """An `exporter_start` / `exporter_stop` record (no GPU)."""
    time_ns = to_time_ns(timestamp)
    return {
        "schema": SCHEMA_ID,
        "kind": "event",
        "event": event,
        "id": record_id(
            host, stream, "event", event=event, time_ns=time_ns, gpu_uuid="", process_key="",
            xid_key="",
        ),
        "stream": stream,
        "time": format_time_ns(time_ns),
        "time_ns": time_ns,
        "host": host,
        "interval_seconds": interval_seconds,
        "elapsed_seconds": 0.0,
        "simulated": simulated,
        "exporter_version": exporter_version,
    }


__all__: Sequence[str] = (
    "VALUE_NAMES",
    "Encoded",
    "PartsCache",
    "Record",
    "build_cycle",
    "build_records",
    "exporter_event",
    "gpu_values",
)
