"""The exporter's GPU inventory: every GPU this node has reported, with its last state,
its XID history and who held it when it was last read, kept across restarts.

Why: a GPU that falls off the bus (XID 79) stays enumerated by NVML and is reported
down (`gpu_up 0`, GpuLost). After the exporter restarts (or the driver reloads) it is
often not enumerated at all, and without a record the exporter would forget it: GpuLost
and its XID 79 would vanish, leaving at most a GpuMissing warning. With the inventory:
- a recorded GPU the backend no longer returns is reported down, error "missing", with
  its identity, its XID totals and its last owners, for as long as it is recorded;
- the XID totals recorded before this process started are added to this process's own,
  so `gpu_xid_errors_total` continues across restarts instead of starting again at 0;
- a GPU that is down keeps the owners it had when it was last read (`gpu_owner_info`,
  the owner labels of hardware alerts), across restarts too.

A GPU removed on purpose stays reported down until it is forgotten: stop the exporter
and delete the inventory file (docs/runbooks.md, GpuLost).

`Inventory.annotate` runs on the sampler thread once per cycle, before rendering (the
sampler's `before_render` hook). It must never raise because of its file (the store
logs and carries on) and never report a GPU up that the backend did not read. Only
GPUs with a real UUID ("GPU-...") are recorded: a slot the backend could not identify
("unknown-index-N") would otherwise be reported lost forever once it is identified.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from exporter.inventory_store import (
    MAX_GPUS,
    MAX_OWNERS,
    MAX_XID_CODES,
    VERSION,
    GpuDoc,
    InventoryDoc,
    InventoryStore,
    OwnerDoc,
)
from exporter.owners import Owner, owners_of
from gpu_audit.model.samples import BackendInfo, GpuInfo, GpuSample
from gpu_audit.model.snapshot import Snapshot

log = logging.getLogger("gpu_audit.inventory")

MISSING = "missing"
"""Error kind of a recorded GPU the backend no longer enumerates."""
OWNER_WRITE_INTERVAL_SECONDS = 30.0
"""Owner changes alone rewrite the file at most this often (jobs come and go)."""
_REAL_UUID = "GPU-"


@dataclass
class _Gpu:
    """What is remembered about one GPU."""

    info: GpuInfo
    up: bool
    error: str
    last_seen: float | None
    xid_totals: dict[int, int] = field(default_factory=dict)
    xid_last: float | None = None
    owners: tuple[Owner, ...] = ()


class Inventory:
    """The recorded GPUs, updated from each snapshot and saved when they change."""

    def __init__(self, store: InventoryStore | None, source: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._source = source
        self._clock = clock
        self._gpus: dict[str, _Gpu] = {}
        # XID totals recorded before this process started: added to the backend's
        # own totals, which start at 0 with each process
        self._base_xids: dict[str, dict[int, int]] = {}
        self._base_xid_last: dict[str, float] = {}
        self._dirty = False
        self._owners_dirty = False
        self._last_write = float("-inf")

    # -- start ------------------------------------------------------------------------
    def load(self) -> None:
        """Take over what the store recorded (nothing when it has nothing usable)."""
        doc = self._store.load() if self._store is not None else None
        if doc is None:
            return
        if doc.source != self._source:
            log.warning("GPU inventory of %s ignored: it records GPUs read from %s, this "
                        "exporter reads %s; starting a new one", self._store_dir(), doc.source,
                        self._source)
            self._dirty = True
            return
        for g in doc.gpus:
            xids = {int(code): n for code, n in g.xid_totals.items()}
            self._gpus[g.uuid] = _Gpu(
                info=GpuInfo(uuid=g.uuid, index=g.index, name=g.name, serial=g.serial,
                             pci_bus_id=g.pci_bus_id),
                up=g.up, error=g.error, last_seen=g.last_seen, xid_totals=dict(xids),
                xid_last=g.xid_last_timestamp,
                owners=tuple((o.user, o.project, o.job, o.slurm_job) for o in g.owners))
            self._base_xids[g.uuid] = xids
            if g.xid_last_timestamp is not None:
                self._base_xid_last[g.uuid] = g.xid_last_timestamp
        down = sorted(uuid for uuid, g in self._gpus.items() if not g.up)
        log.info("GPU inventory: %d GPU(s) recorded%s", len(self._gpus),
                 f", down when last seen: {', '.join(down)}" if down else "")

    # -- each cycle ---------------------------------------------------------------------
    def annotate(self, snap: Snapshot) -> Snapshot:
        """The snapshot with recorded GPUs the backend did not return added as down,
        recorded XID totals added, and the last owners of down GPUs; records what it
        saw and saves when something changed."""
        gpus: list[GpuSample] = []
        seen: set[str] = set()
        for read in snap.gpus:
            seen.add(read.uuid)
            sample = self._with_recorded_xids(read)
            gpus.append(sample)
            if sample.uuid.startswith(_REAL_UUID):
                self._record(sample, snap)
        for uuid in sorted(set(self._gpus) - seen):
            gpus.append(self._missing(uuid))
        last_owners = {g.uuid: self._gpus[g.uuid].owners for g in gpus
                       if not g.up and g.uuid in self._gpus and self._gpus[g.uuid].owners}
        self._save_if_due()
        return dataclasses.replace(snap, gpus=tuple(gpus), last_owners=last_owners)

    def _with_recorded_xids(self, sample: GpuSample) -> GpuSample:
        base = self._base_xids.get(sample.uuid)
        if not base:
            return sample
        totals = dict(base)
        for code, n in sample.xid_totals.items():
            totals[code] = totals.get(code, 0) + n
        lasts = [t for t in (self._base_xid_last.get(sample.uuid), sample.xid_last_timestamp)
                 if t is not None]
        return dataclasses.replace(sample, xid_totals=totals,
                                   xid_last_timestamp=max(lasts) if lasts else None)

    def _record(self, sample: GpuSample, snap: Snapshot) -> None:
        uuid = sample.uuid
        old = self._gpus.get(uuid)
        error = "" if sample.up else (sample.error or "unknown")
        owners = (owners_of(snap.processes.get(uuid, ()))[:MAX_OWNERS] if sample.up
                  else old.owners if old is not None else ())
        xids = dict(sorted(sample.xid_totals.items())[:MAX_XID_CODES])
        info = sample.info
        if old is None:
            if len(self._gpus) >= MAX_GPUS:
                return  # far beyond any node's GPUs: not worth a record
            log.info("GPU inventory: recording GPU %d (%s)", info.index, uuid)
            self._dirty = True
        elif (old.up != sample.up or old.error != error or old.xid_totals != xids
              or old.info.index != info.index or old.info.name != info.name):
            self._dirty = True
        elif old.owners != owners:
            self._owners_dirty = True
        self._gpus[uuid] = _Gpu(
            info=info, up=sample.up, error=error,
            last_seen=snap.timestamp if sample.up else (old.last_seen if old else None),
            xid_totals=xids, xid_last=sample.xid_last_timestamp, owners=owners)

    def _missing(self, uuid: str) -> GpuSample:
        g = self._gpus[uuid]
        if g.up or g.error != MISSING:
            # the watch (exporter.watch) logs the GPU going down; this says why
            log.info("GPU %d (%s) is no longer enumerated by the backend: the inventory "
                     "reports it down (%s) until it is back or forgotten", g.info.index,
                     uuid, MISSING)
            g.up, g.error = False, MISSING
            self._dirty = True
        return GpuSample(info=g.info, up=False, error=MISSING, xid_totals=dict(g.xid_totals),
                         xid_last_timestamp=g.xid_last)

    def _save_if_due(self) -> None:
        if self._store is None:
            return
        now = self._clock()
        owners_due = (self._owners_dirty
                      and now - self._last_write >= OWNER_WRITE_INTERVAL_SECONDS)
        if not (self._dirty or owners_due):
            return
        if self._store.save(self.document()):
            self._dirty = self._owners_dirty = False
            self._last_write = now

    # -- views --------------------------------------------------------------------------
    def document(self) -> InventoryDoc:
        return InventoryDoc(version=VERSION, source=self._source, gpus=[
            GpuDoc(uuid=uuid, index=g.info.index, name=g.info.name, serial=g.info.serial,
                   pci_bus_id=g.info.pci_bus_id, up=g.up, error=g.error,
                   last_seen=g.last_seen,
                   xid_totals={str(code): n for code, n in g.xid_totals.items()},
                   xid_last_timestamp=g.xid_last,
                   owners=[OwnerDoc(user=u, project=p, job=j, slurm_job=s)
                           for u, p, j, s in g.owners])
            for uuid, g in sorted(self._gpus.items())])

    def recorded(self) -> Mapping[str, bool]:
        """uuid -> up, for every recorded GPU (for /status and tests)."""
        return {uuid: g.up for uuid, g in self._gpus.items()}

    def close(self) -> None:
        """Save what is pending, then release the directory."""
        if self._store is None:
            return
        if self._dirty or self._owners_dirty:
            self._store.save(self.document())
        self._store.close()

    def _store_dir(self) -> str:
        return str(self._store.directory) if self._store is not None else "(none)"


def default_directory(spool_directory: Path) -> Path:
    """`inventory` inside the spool directory (exporter.inventory_directory unset): one
    exporter writes a spool, so one owns this inventory too."""
    return spool_directory / "inventory"


def source_of(info: BackendInfo) -> str:
    """What the GPUs are read from, as the inventory records it: NVML and DCGM read the
    same hardware; each simulator scenario is its own world (the simulator's detail is
    "scenario NAME")."""
    if not info.simulated:
        return "hardware"
    return "sim:" + info.detail.removeprefix("scenario ")


def open_inventory(directory: Path, source: str) -> Inventory:
    """The inventory kept in `directory`, loaded. Raises LockHeld when another exporter
    keeps it; without a usable directory it works in memory (logged)."""
    store = InventoryStore(directory)
    store.open()
    inventory = Inventory(store, source)
    inventory.load()
    return inventory
