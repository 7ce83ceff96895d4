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

Records carry only the allow-listed attribution fields (IDENTITY_FIELDS and their
sources); this module must never copy a process's environ or cgroup text into a record,
and never do I/O.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from math import isfinite
from typing import Any

import orjson

from gpu_audit.audit.accounting import (
    elapsed_for,
    energy_units,
    energy_weights,
    joules,
    split_units,
)
from gpu_audit.audit.canonical import (
    PENDING,
    SCHEMA_ID,
    canonical_bytes,
    format_time_ns,
    id_from_prefix,
    id_prefix,
    id_tail,
    record_id,
    to_time_ns,
)
from gpu_audit.model.attribution import IDENTITY_FIELDS, UNKNOWN, AttributedProcess, Attribution
from gpu_audit.model.fields import CATALOGUE
from gpu_audit.model.samples import GpuSample, ProcessSample
from gpu_audit.model.snapshot import Snapshot

# Catalogue key -> record value name: the metric name without its `gpu_` prefix.
VALUE_NAMES: dict[str, str] = {m.key: m.name.removeprefix("gpu_") for m in CATALOGUE}

Record = dict[str, Any]
ProcessKey = tuple[str, int, int | None]  # (gpu uuid, pid, start time ticks)


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


def _gpu_part(gpu: GpuSample) -> dict[str, Any]:
    part: dict[str, Any] = {"uuid": gpu.info.uuid, "index": gpu.info.index, "up": gpu.up}
    if gpu.info.name:  # unknown is absent, never ""
        part["name"] = gpu.info.name
    if gpu.error:
        part["error"] = gpu.error
    return part


def _process_part(p: ProcessSample) -> dict[str, Any]:
    part: dict[str, Any] = {"pid": p.pid, "type": p.type}
    if p.name:  # unknown is absent, never ""
        part["name"] = p.name
    uid = p.uid if p.uid is not None else (p.identity.uid if p.identity else None)
    if uid is not None:
        part["uid"] = uid
    if p.gpu_instance_id is not None:
        part["gpu_instance_id"] = p.gpu_instance_id
    if p.compute_instance_id is not None:
        part["compute_instance_id"] = p.compute_instance_id
    if p.identity is not None and p.identity.start_time_ticks is not None:
        part["start_time_ticks"] = p.identity.start_time_ticks
    return part


def _attribution_dict(a: Attribution) -> dict[str, Any]:
    # Only what is known: an unknown field is absent (never ""), so a chart grouped by
    # owner gets no empty bucket; a source is listed only for a field that is there.
    part: dict[str, Any] = {}
    for f in IDENTITY_FIELDS:
        v = getattr(a, f)
        if v:
            part[f] = v
    part["sources"] = {f: s for f, s in a.sources.items() if f in part}
    return part


# Value names shared by every record kind: one name per quantity, the name the gpu
# record uses (the catalogue metric name without `gpu_`), so one query charts them all.
MEMORY_USED = "memory_used_bytes"
UTILIZATION = "utilization_ratio"  # process: its SM share of the GPU's busy time
MEMORY_CONTROLLER_UTILIZATION = "memory_controller_utilization_ratio"
ENCODER_UTILIZATION = "encoder_utilization_ratio"
DECODER_UTILIZATION = "decoder_utilization_ratio"


def _process_values(p: ProcessSample) -> dict[str, Any]:
    # Written out field by field: this runs once per process per cycle.
    out: dict[str, Any] = {}
    if p.used_memory_bytes is not None:
        out[MEMORY_USED] = p.used_memory_bytes
    v = p.sm_util_ratio
    if v is not None and isfinite(v):
        out[UTILIZATION] = v
    v = p.memory_util_ratio
    if v is not None and isfinite(v):
        out[MEMORY_CONTROLLER_UTILIZATION] = v
    v = p.encoder_util_ratio
    if v is not None and isfinite(v):
        out[ENCODER_UTILIZATION] = v
    v = p.decoder_util_ratio
    if v is not None and isfinite(v):
        out[DECODER_UTILIZATION] = v
    return out


def _process_values_sorted(p: ProcessSample) -> dict[str, Any]:
    # _process_values with the keys inserted in sorted order (for PENDING records).
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


def _process_key_str(p: ProcessSample) -> str:
    # NVML may list one pid once per type and per MIG instance: all of it is identity.
    return f"{p.pid}:{p.type}:{p.gpu_instance_id}:{p.compute_instance_id}"


def _start_ticks(p: ProcessSample) -> int | None:
    return p.identity.start_time_ticks if p.identity is not None else None


def processes_of(snap: Snapshot, gpu: GpuSample) -> tuple[AttributedProcess, ...]:
    """The GPU's processes with their owners (unknown owner when attribution is absent)."""
    attributed = snap.processes.get(gpu.info.uuid)
    if attributed is not None:
        return attributed
    return tuple(AttributedProcess(gpu.info.uuid, p, UNKNOWN) for p in gpu.processes)


class PartsCache:
    """Attribution parts carried from one cycle to the next.

    The resolver hands out the same Attribution object for a process as long as the
    process lives, so its record part (and whether it is attributed at all) is built once
    per process lifetime, not once per cycle. Entries hold the Attribution itself, so an
    id() is never reused while cached; entries unused in a cycle are dropped. Likewise a
    process's `process` part and the per-record text of its id, keyed by everything they
    are made of (GPU, pid, name, type, uid, MIG ids, start time).

    fragments=True (the producer's setting) puts shared nested parts (owner, GPU,
    process) into records as pre-serialised canonical JSON (orjson.Fragment) so each is
    serialised once, not once per record, and builds `process` records with their keys
    in sorted order and `seq` / `prev_hash` (PENDING) in place, so seal() serialises
    them without sorting; the stored bytes are identical. Records built that way are for
    sealing only: read them after parsing the stored bytes.
    """

    def __init__(self, *, fragments: bool = False) -> None:
        self.fragments = fragments
        self._parts: dict[int, tuple[Attribution, bool, Any]] = {}
        self._used: dict[int, tuple[Attribution, bool, Any]] = {}
        self._procs: dict[tuple[Any, ...], tuple[Any, bytes]] = {}
        self._procs_used: dict[tuple[Any, ...], tuple[Any, bytes]] = {}
        # GPU uuid -> (snapshot, its GpuSample, _visible of them), from the last cycle
        # (where it was "now") for this cycle (where it is "before").
        self._visible: dict[str, tuple[Snapshot, GpuSample, dict[ProcessKey, Any]]] = {}
        self._visible_new: dict[str, tuple[Snapshot, GpuSample, dict[ProcessKey, Any]]] = {}

    def shared(self, part: dict[str, Any]) -> Any:
        """`part` as it goes into records: itself, or its canonical bytes as a Fragment."""
        return orjson.Fragment(canonical_bytes(part)) if self.fragments else part

    def get(self, a: Attribution) -> tuple[bool, Any]:
        """(attributed, record part): the part is None for an unknown owner."""
        key = id(a)
        hit = self._used.get(key)
        if hit is None:
            hit = self._parts.get(key)
            if hit is None or hit[0] is not a:
                owned = a.attributed
                hit = (a, owned, self.shared(_attribution_dict(a)) if owned else None)
            self._used[key] = hit
        return hit[1], hit[2]

    def process(self, gpu_uuid: str, p: ProcessSample) -> tuple[Any, bytes]:
        """(record part, id_tail) of a `process` record of `p` on the GPU."""
        ident = p.identity
        uid = p.uid if p.uid is not None else (ident.uid if ident is not None else None)
        start = ident.start_time_ticks if ident is not None else None
        key = (gpu_uuid, p.pid, p.name, p.type, uid, p.gpu_instance_id,
               p.compute_instance_id, start)
        hit = self._procs_used.get(key)
        if hit is None:
            hit = self._procs.get(key)
            if hit is None:
                hit = (self.shared(_process_part(p)),
                       id_tail("process", "", gpu_uuid, _process_key_str(p), ""))
            self._procs_used[key] = hit
        return hit

    def visible(
        self, snap: Snapshot | None, gpu: GpuSample | None
    ) -> dict[ProcessKey, AttributedProcess]:
        """_visible(snap, gpu), computed once per snapshot and GPU (treat as read-only)."""
        if snap is None or gpu is None:
            return {}
        uuid = gpu.info.uuid
        for cache in (self._visible_new, self._visible):
            hit = cache.get(uuid)
            if hit is not None and hit[0] is snap and hit[1] is gpu:
                return hit[2]
        found = _visible(snap, gpu)
        self._visible_new[uuid] = (snap, gpu, found)
        return found

    def end_cycle(self) -> None:
        self._parts, self._used = self._used, {}
        self._procs, self._procs_used = self._procs_used, {}
        self._visible, self._visible_new = self._visible_new, {}


class _Cycle:
    """Shared parts of every record of one cycle, computed once."""

    def __init__(
        self,
        snap: Snapshot,
        *,
        host: str,
        stream: str,
        exporter_version: str,
        simulated: bool,
        elapsed: float,
        parts: PartsCache,
    ) -> None:
        self.host = host
        self.stream = stream
        self.time_ns = to_time_ns(snap.timestamp)
        self.id_prefix = id_prefix(host, stream, self.time_ns)
        self.parts = parts
        self.time = format_time_ns(self.time_ns)
        self.exporter_version = exporter_version
        self.interval_seconds = snap.interval_seconds
        self.simulated = simulated
        self.common: dict[str, Any] = {
            "schema": SCHEMA_ID,
            "stream": stream,
            "time": self.time,
            "time_ns": self.time_ns,
            "host": host,
            "interval_seconds": snap.interval_seconds,
            "elapsed_seconds": elapsed,
            "simulated": simulated,
            "exporter_version": exporter_version,
        }

    def record(
        self,
        kind: str,
        *,
        event: str = "",
        gpu_uuid: str = "",
        process_key: str = "",
        xid_key: str = "",
    ) -> Record:
        r = dict(self.common)
        r["kind"] = kind
        if event:
            r["event"] = event
        r["id"] = id_from_prefix(self.id_prefix, kind, event, gpu_uuid, process_key, xid_key)
        return r

    def attribution(self, ap: AttributedProcess) -> tuple[bool, Any]:
        """(attributed, record part or None) of a process's owner."""
        return self.parts.get(ap.attribution)


def _finite(v: float | None) -> float | None:
    # A non-finite reading is "not measured" (as in `values`), never a number to use.
    return v if v is not None and isfinite(v) else None


def _energy_of(
    gpu: GpuSample, prev_gpu: GpuSample | None, elapsed: float, counter_share: float
) -> tuple[int, str] | None:
    counter, power = _finite(gpu.scalar("energy")), _finite(gpu.scalar("power_usage"))
    prev_counter = (_finite(prev_gpu.scalar("energy"))
                    if prev_gpu is not None and prev_gpu.up else None)
    return energy_units(counter, prev_counter, power, elapsed, counter_share=counter_share)


def _usage_records(
    cyc: _Cycle,
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
    energy = _energy_of(gpu, prev_gpu, elapsed, counter_share)
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
            attributed_sm=[_finite(ap.process.sm_util_ratio) for ap in owned],
            attributed_mem=[_f(ap.process.used_memory_bytes) for ap in owned],
            unattributed_sm=[_finite(ap.process.sm_util_ratio) for ap in unowned],
            unattributed_mem=[_f(ap.process.used_memory_bytes) for ap in unowned],
            gpu_util=_finite(gpu.scalar("utilization_gpu")),
            gpu_mem_used=_finite(gpu.scalar("memory_used")),
        )
        shares = split_units(energy[0], weights)
    owned_share = iter(shares)

    parts = cyc.parts
    templates = _presorted_templates(cyc, gpu_part, elapsed) if parts.fragments else None
    prefix = cyc.id_prefix
    for ap, (is_owned, owner_part) in zip(procs, owners, strict=True):
        p = ap.process
        proc_part, tail = parts.process(uuid, p)
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
            rec["values"] = _process_values_sorted(p)
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
        rec["values"] = _process_values(p)
        rec["gpu_seconds"] = elapsed
        if busy is not None:
            rec["busy_gpu_seconds"] = busy
        if energy_j is not None:
            rec["energy_joules"] = energy_j
        out.append(rec)

    un = cyc.record("unattributed", gpu_uuid=uuid)
    un["gpu"] = gpu_part
    uvals: dict[str, Any] = {"processes": len(unowned)}
    mem_used = _finite(gpu.scalar("memory_used"))
    if mem_used is not None:
        explained = sum(ap.process.used_memory_bytes or 0 for ap in owned)
        uvals[MEMORY_USED] = max(0.0, mem_used - explained)
    util = _finite(gpu.scalar("utilization_gpu"))
    if util is not None:
        explained_sm = math.fsum(_finite(ap.process.sm_util_ratio) or 0.0 for ap in owned)
        uvals[UTILIZATION] = max(0.0, util - explained_sm)
    un["values"] = uvals
    un["gpu_seconds"] = 0.0 if owned else elapsed
    if shares:
        un["energy_joules"] = joules(shares[-1])
    out.append(un)
    return out


def _presorted_templates(
    cyc: _Cycle, gpu_part: Any, elapsed: float
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


def _f(x: int | None) -> float | None:
    return float(x) if x is not None else None


def _process_event(
    cyc: _Cycle, event: str, gpu_part: Any, ap: AttributedProcess
) -> Record:
    p = ap.process
    rec = cyc.record(
        "event", event=event, gpu_uuid=ap.gpu_uuid, process_key=_process_key_str(p)
    )
    rec["gpu"] = gpu_part
    rec["process"] = _process_part(p)
    owned, part = cyc.attribution(ap)
    rec["attributed"] = owned
    if owned:
        rec["attribution"] = part
    return rec


def _visible(snap: Snapshot | None, gpu: GpuSample | None) -> dict[ProcessKey, AttributedProcess]:
    if snap is None or gpu is None or not gpu.up:
        return {}
    return {
        (gpu.info.uuid, ap.process.pid, _start_ticks(ap.process)): ap
        for ap in processes_of(snap, gpu)
    }


def _event_records(
    cyc: _Cycle,
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
    now = cyc.parts.visible(snap, gpu)
    before = cyc.parts.visible(prev, prev_gpu)
    prev_part = _gpu_part(prev_gpu) if prev_gpu is not None else gpu_part
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
) -> list[Record]:
    """All audit records of one cycle, unchained (no seq / prev_hash / hash).

    `prev` is the previous snapshot of this exporter run (None for the first): it gives
    the energy baseline, the elapsed time and the event diffs. Without it (or when no
    time passed) only events are built: no interval was measured. `host` defaults to the
    snapshot's host; `simulated` to what the backend says (the producer may only turn
    it on, never off). `parts`: a cache kept by the caller across cycles (speed only;
    the records are the same without it).
    """
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
    cyc = _Cycle(
        snap,
        host=host if host is not None else snap.host,
        stream=stream,
        exporter_version=exporter_version,
        simulated=snap.backend.simulated if simulated is None else simulated,
        elapsed=elapsed,
        parts=parts if parts is not None else PartsCache(),
    )
    prev_gpus: Mapping[str, GpuSample] = (
        {g.info.uuid: g for g in prev.gpus} if prev is not None else {}
    )
    out: list[Record] = []
    events: list[Record] = []
    for gpu in snap.gpus:
        prev_gpu = prev_gpus.get(gpu.info.uuid)
        part = cyc.parts.shared(_gpu_part(gpu))
        # A cycle that measured no interval (the first after a start; the clock went
        # backwards) has no usage to report: a row of zeros would only be noise in
        # every chart. Its snapshot still is the baseline of the next interval.
        if elapsed > 0:
            out.extend(
                _usage_records(
                    cyc, snap, gpu, prev_gpu=prev_gpu, elapsed=elapsed,
                    counter_share=counter_share, gpu_part=part,
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
        part = {**_gpu_part(prev_gpu), "up": False, "error": "missing"}
        if prev_gpu.up:
            rec = cyc.record("event", event="gpu_lost", gpu_uuid=uuid)
            rec["gpu"] = part
            events.append(rec)
        for ap in _visible(prev, prev_gpu).values():
            events.append(_process_event(cyc, "process_end", _gpu_part(prev_gpu), ap))
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
    "PartsCache",
    "build_records",
    "exporter_event",
    "gpu_values",
)
