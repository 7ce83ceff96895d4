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
  time) keys changed), `xid` (GpuSample.new_xids).

Records of one cycle share nested objects (the GPU part, an owner's attribution part):
treat them as read-only; the producer only ever sets top-level `seq` / `prev_hash` /
`hash`.

The orchestrator of the per-cycle records, read top-down: this module walks the GPUs,
looks up what the records are made of in the parts cache (gpu_audit.audit.parts) and
hands it to the record kinds, gpu_audit.audit.usage (gpu, process, unattributed) and
gpu_audit.audit.events; below them are only the leaves gpu_audit.audit.canonical
(encoding) and gpu_audit.audit.accounting. None of them calls back into this module
(tests/core/audit/test_call_layers.py).

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
    Cycle,
    Encoded,
    Record,
    canonical_bytes,
    format_time_ns,
    record_id,
    to_time_ns,
)
from gpu_audit.audit.events import Changed, gpu_events, missing_gpu_events
from gpu_audit.audit.parts import (
    Owner,
    PartsCache,
    gpu_part_of,
    process_part_of,
    visible_processes,
)
from gpu_audit.audit.usage import VALUE_NAMES, gpu_values, usage_records
from gpu_audit.model.attribution import AttributedProcess
from gpu_audit.model.mig import process_weights
from gpu_audit.model.samples import GpuSample
from gpu_audit.model.snapshot import Snapshot


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
            out.extend(_usage(cyc, snap, gpu, prev_gpu, parts, elapsed=elapsed,
                              counter_share=counter_share, gpu_part=part,
                              gpu_bytes=gpu_bytes))
        events.extend(_events(cyc, snap, prev, gpu, prev_gpu, parts, part))
    seen = {g.info.uuid for g in snap.gpus}
    for uuid, prev_gpu in prev_gpus.items():
        if uuid in seen:
            continue
        # Gone from the snapshot: lost (unless it was already down), processes ended.
        prev_part = gpu_part_of(prev_gpu)
        events.extend(missing_gpu_events(
            cyc, uuid, was_up=prev_gpu.up,
            missing_part={**prev_part, "up": False, "error": "missing"},
            prev_part=prev_part,
            ended=[_changed(parts, ap) for ap in visible_processes(prev, prev_gpu).values()],
        ))
    out.extend(events)
    parts.end_cycle()
    return out


def _usage(
    cyc: Cycle,
    snap: Snapshot,
    gpu: GpuSample,
    prev_gpu: GpuSample | None,
    parts: PartsCache,
    *,
    elapsed: float,
    counter_share: float,
    gpu_part: Any,
    gpu_bytes: bytes | None,
) -> list[Record | Encoded]:
    """usage.usage_records() of one GPU, with each process's owner and `process` part
    from the cache (for an up GPU: a down one has no process records)."""
    procs: Sequence[AttributedProcess] = ()
    owners: list[Owner] = []
    proc_parts: list[tuple[Any, bytes]] = []
    slices = None
    if gpu.up:
        procs = snap.processes_of(gpu)
        owner, process, uuid = parts.owner, parts.process, gpu.info.uuid
        owners = [owner(ap.attribution) for ap in procs]
        slices = process_weights(gpu)  # MIG: gpu_instance_id -> weight (None: whole GPU)
        if slices is None:
            proc_parts = [process(uuid, ap.process) for ap in procs]
        else:
            proc_parts = [process(uuid, p, slices.get(gi) if gi is not None else None)
                          for p, gi in ((ap.process, ap.process.gpu_instance_id)
                                        for ap in procs)]
    return usage_records(cyc, gpu, procs, owners, proc_parts, slices, prev_gpu=prev_gpu,
                         elapsed=elapsed, counter_share=counter_share, gpu_part=gpu_part,
                         gpu_bytes=gpu_bytes)


def _events(  # noqa: PLR0917 - one call per GPU and cycle
    cyc: Cycle,
    snap: Snapshot,
    prev: Snapshot | None,
    gpu: GpuSample,
    prev_gpu: GpuSample | None,
    parts: PartsCache,
    gpu_part: Any,
) -> list[Record]:
    """events.gpu_events() of one GPU: which processes ended and started is decided
    here, from the visible keys of this and the previous snapshot."""
    now_keys, now_procs = parts.visible(snap, gpu)
    before_keys, before_procs = parts.visible(prev, prev_gpu, now=False)
    ended: list[Changed] = []
    started: list[Changed] = []
    prev_part = gpu_part
    # Most cycles change no process: equal key lists (compared in C, no dict built) have
    # no event; otherwise the dicts say which keys came and went, in the lists' order.
    if now_keys != before_keys:
        now = dict(zip(now_keys, now_procs, strict=True))
        before = dict(zip(before_keys, before_procs, strict=True))
        ended = [_changed(parts, ap) for key, ap in before.items() if key not in now]
        started = [_changed(parts, ap) for key, ap in now.items() if key not in before]
        if prev_gpu is not None:
            prev_part = gpu_part_of(prev_gpu)
    return gpu_events(cyc, gpu, prev_gpu, gpu_part, prev_part, ended, started)


def _changed(parts: PartsCache, ap: AttributedProcess) -> Changed:
    """What an event record of a process that started or ended needs from the parts."""
    owned, owner_part = parts.get(ap.attribution)
    return ap, process_part_of(ap.process), owned, owner_part


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
