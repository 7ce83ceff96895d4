"""The parts records are made of, and their cache across cycles.

Nested parts (GPU, process, owner), the visible-process keys the events diff, and
`PartsCache`, which keeps the parts that only change when a process does, so the
builder makes them once per process lifetime, optionally pre-serialised. Only the
builder calls this module; it hands what it finds here to the record kinds
(gpu_audit.audit.usage, gpu_audit.audit.events), which never look here themselves.

Pure: no I/O. Records carry only the allow-listed attribution fields (IDENTITY_FIELDS and
their sources); this module must never copy a process's environ or cgroup text.
"""

from __future__ import annotations

from typing import Any

import orjson

from gpu_audit.audit.canonical import SCHEMA_ID, Record, canonical_bytes, id_tail, process_key_str
from gpu_audit.model.attribution import IDENTITY_FIELDS, AttributedProcess, Attribution
from gpu_audit.model.samples import GpuSample, ProcessSample
from gpu_audit.model.snapshot import Snapshot

ProcessKey = tuple[str, int, int | None]  # (gpu uuid, pid, start time ticks)
# (the Attribution, attributed, its record part or None, its encoded head: PartsCache.owner)
Owner = tuple[Attribution, bool, Any, bytes]
_Visible = tuple[Snapshot, GpuSample, tuple[list[ProcessKey], tuple[AttributedProcess, ...]]]
# The members of an encoded `process` record around its `process` part (PartsCache.process)
_MID_OPEN = b'","process":'
_MID_CLOSE = b',"schema":' + orjson.dumps(SCHEMA_ID) + b',"seq":'


def kept_bytes(part: dict[str, Any]) -> bytes:
    """The canonical bytes of a part kept across cycles, right-sized: orjson's result
    keeps its whole output buffer (~4 KB) allocated for a ~70-byte part, and these live
    as long as their process (1,024 of them at 8 GPUs x 64 processes: ~4 MB of RSS).
    bytes(b) would return b itself, hence the memoryview."""
    return bytes(memoryview(canonical_bytes(part)))


def gpu_part_of(gpu: GpuSample) -> dict[str, Any]:
    part: dict[str, Any] = {"uuid": gpu.info.uuid, "index": gpu.info.index, "up": gpu.up}
    if gpu.info.name:  # unknown is absent, never ""
        part["name"] = gpu.info.name
    if gpu.error:
        part["error"] = gpu.error
    return part


def process_part_of(p: ProcessSample, slice_weight: float | None = None) -> dict[str, Any]:
    # slice_weight: the share of the GPU its MIG instance counts for in a bill
    # (gpu_audit.model.mig); absent when the GPU is counted whole
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
    if slice_weight is not None:
        part["slice_weight"] = slice_weight
    return part


def attribution_part_of(a: Attribution) -> dict[str, Any]:
    # Only what is known: an unknown field is absent (never ""), so a chart grouped by
    # owner gets no empty bucket; a source is listed only for a field that is there.
    part: dict[str, Any] = {}
    for f in IDENTITY_FIELDS:
        v = getattr(a, f)
        if v:
            part[f] = v
    part["sources"] = {f: s for f, s in a.sources.items() if f in part}
    return part


def visible_processes(
    snap: Snapshot | None, gpu: GpuSample | None
) -> dict[ProcessKey, AttributedProcess]:
    """(GPU uuid, pid, start time) -> process, for the processes an up GPU lists."""
    keys, procs = visible_keys(snap, gpu)
    return dict(zip(keys, procs, strict=True))


def visible_keys(
    snap: Snapshot | None, gpu: GpuSample | None
) -> tuple[list[ProcessKey], tuple[AttributedProcess, ...]]:
    """visible_processes() as the list of keys and the processes, in NVML's order: two
    cycles whose lists are equal have the same processes, with no dict built."""
    if snap is None or gpu is None or not gpu.up:
        return [], ()
    uuid = gpu.info.uuid
    procs = snap.processes_of(gpu)
    return [  # the key: once per process and cycle
        (uuid, (p := ap.process).pid,
         p.identity.start_time_ticks if p.identity is not None else None)
        for ap in procs
    ], procs


class PartsCache:
    """Attribution parts carried from one cycle to the next.

    The resolver hands out the same Attribution object for a process as long as the
    process lives, so its record part (and whether it is attributed at all) is built once
    per process lifetime, not once per cycle. Entries hold the Attribution itself, so an
    id() is never reused while cached. Likewise a process's `process` part and the
    per-record text of its id, keyed by everything they are made of (GPU, pid, name,
    type, uid, MIG ids, start time). Both live in dicts kept across cycles, each entry
    marked with the cycle it was last used in (a hit is one lookup: no dict rebuilt each
    cycle); the entries not used in the last cycle are dropped once there are more than
    about twice the last cycle's lookups.

    fragments=True (the producer's setting, with builder.build_cycle) puts shared nested
    parts (owner, GPU) into records as pre-serialised canonical JSON (orjson.Fragment) so
    each is serialised once, not once per record, and keeps the canonical bytes of a
    process's `process` part and of its owner's members, from which `process` records
    are built as canonical.Encoded bytes (usage.py); the stored bytes are identical.
    Records built that way are for sealing only: read them after parsing the stored bytes.
    """

    def __init__(self, *, fragments: bool = False) -> None:
        self.fragments = fragments
        # id(Attribution) -> its Owner, and the cycle it was last used in (as _procs)
        self._owners: dict[int, Owner] = {}
        self._owner_used: dict[int, int] = {}
        # Each entry [part, id tail, cycle it was last used in]
        self._procs: dict[tuple[Any, ...], list[Any]] = {}
        self._cycle = 0
        self._asked = 0  # lookups this cycle (owners and processes): what the sweep keeps
        # GPU uuid -> (snapshot, its GpuSample, visible_keys of them), from the last
        # cycle (where it was "now") for this cycle (where it is "before").
        self._visible: dict[str, _Visible] = {}
        self._visible_new: dict[str, _Visible] = {}

    def owner(self, a: Attribution) -> Owner:
        """(a, attributed, record part, encoded head) of an owner: the part is None for
        an unknown owner; the head (fragments only, else b"") is the start of its
        `process` records' canonical bytes, `{"attributed":...` up to the next member."""
        key = id(a)
        self._asked += 1
        hit = self._owners.get(key)
        if hit is None or hit[0] is not a:
            hit = self._owners[key] = self._owner(a)
        self._owner_used[key] = self._cycle
        return hit

    def _owner(self, a: Attribution) -> Owner:
        owned = a.attributed
        if not self.fragments:
            return a, owned, attribution_part_of(a) if owned else None, b""
        if not owned:
            return a, False, None, b'{"attributed":false'
        raw = kept_bytes(attribution_part_of(a))
        return a, True, orjson.Fragment(raw), b'{"attributed":true,"attribution":' + raw

    def get(self, a: Attribution) -> tuple[bool, Any]:
        """(attributed, record part): the part is None for an unknown owner."""
        hit = self.owner(a)
        return hit[1], hit[2]

    def process(self, gpu_uuid: str, p: ProcessSample,
                slice_weight: float | None = None) -> tuple[Any, bytes]:
        """(record part, id_tail) of a `process` record of `p` on the GPU. With
        fragments the part is its encoded members instead: `","process":{...}` through
        `"seq":` (the `mid` of a canonical.Encoded record)."""
        ident = p.identity
        uid = p.uid if p.uid is not None else (ident.uid if ident is not None else None)
        start = ident.start_time_ticks if ident is not None else None
        key = (gpu_uuid, p.pid, p.name, p.type, uid, p.gpu_instance_id,
               p.compute_instance_id, start, slice_weight)
        self._asked += 1
        hit = self._procs.get(key)
        if hit is None:
            part = process_part_of(p, slice_weight)
            hit = self._procs[key] = [
                _MID_OPEN + canonical_bytes(part) + _MID_CLOSE if self.fragments else part,
                id_tail("process", "", gpu_uuid, process_key_str(p), ""), self._cycle]
        else:
            hit[2] = self._cycle
        return hit[0], hit[1]

    def visible(
        self, snap: Snapshot | None, gpu: GpuSample | None, *, now: bool = True
    ) -> tuple[list[ProcessKey], tuple[AttributedProcess, ...]]:
        """visible_keys(snap, gpu), computed once per snapshot and GPU (treat as
        read-only): the cycle's own view (`now`) is kept for the next cycle, where the
        previous cycle's (now=False) is looked up. Only the current views are kept: one
        made for a "before" the cache missed (a cache started mid-stream) would have
        taken the current view's place, and every later cycle would have made both; and
        keeping older ones would keep their whole snapshots alive."""
        if snap is None or gpu is None:
            return [], ()
        uuid = gpu.info.uuid
        hit = (self._visible_new if now else self._visible).get(uuid)
        if hit is not None and hit[0] is snap and hit[1] is gpu:
            return hit[2]
        found = visible_keys(snap, gpu)
        if now:
            self._visible_new[uuid] = (snap, gpu, found)
        return found

    def end_cycle(self) -> None:
        cycle = self._cycle
        if len(self._owners) > 2 * self._asked + 64:
            self._owner_used = {k: c for k, c in self._owner_used.items() if c == cycle}
            self._owners = {k: self._owners[k] for k in self._owner_used}
        if len(self._procs) > 2 * self._asked + 64:
            self._procs = {k: v for k, v in self._procs.items() if v[2] == cycle}
        self._cycle += 1
        self._asked = 0
        self._visible, self._visible_new = self._visible_new, {}


__all__ = (
    "Owner",
    "PartsCache",
    "ProcessKey",
    "Record",
    "attribution_part_of",
    "gpu_part_of",
    "kept_bytes",
    "process_key_str",
    "process_part_of",
    "visible_keys",
    "visible_processes",
)
