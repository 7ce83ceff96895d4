"""Interval usage records (schema `gpu-audit.record/3`): samples added up over
`audit.interval_seconds`, one record per GPU and holder per interval.

Every sample is accounted exactly as a per-cycle trail accounts it (the energy split of
gpu_audit.audit.accounting, the bill's rules of gpu_audit.audit.holders), and the results are
summed, so a bill from the interval trail equals the bill from the per-cycle trail of
the same run. On top of the sums a record keeps what forensics needs: the peak memory of
each process and of the GPU, mean and max utilisation.

At the end of an interval, per GPU that was measured in it: one record per holder (an
owner `(user, project)`, or the unattributed holder: processes nobody owns), owners in
(user, project) order, the unattributed holder last; or one record without a holder
when nobody held the GPU. The GPU's own sums are on the first of them only, so a sum of
a field over records counts each GPU interval once. Key names are short on purpose
(a record is written per GPU per minute, for a year); docs/AUDIT.md lists them.

The orchestrator of the interval trail (the producer calls it, as it calls the builder for
the per-cycle one): below it are only holders.py and the leaves canonical.py and
accounting.py, none of which calls back up (tests/core/audit/test_call_layers.py).

Pure: snapshots in, record dicts out (unchained: the producer chains them). Never I/O,
never a process's environ or cgroup text.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from math import isfinite
from typing import Any

import orjson

from gpu_audit.audit.accounting import (
    as_float,
    energy_of,
    energy_weights,
    finite,
    joules,
    split_units,
)
from gpu_audit.audit.canonical import SCHEMA_V3, id_prefix, id_tail
from gpu_audit.audit.holders import (
    F_DOWN,
    F_ENERGY,
    F_GPU,
    F_IDLE_HELD,
    F_POWER,
    UNATTRIBUTED,
    GpuCycle,
    Owner,
    close_cycle,
)
from gpu_audit.model.mig import process_weights, unowned_slices
from gpu_audit.model.samples import GpuSample, ProcessSample
from gpu_audit.model.snapshot import Snapshot

Record = dict[str, Any]
TaskKey = tuple[int, str, int | None, int | None, int | None]  # pid, type, gi, ci, start


def _s(x: float) -> float:
    # millisecond resolution: what sampling times carry (a cycle's jitter is milliseconds),
    # short numbers, and far below what a bill can see (0.5 ms per record and sum)
    return round(x, 3)


def _mj(joules_: float) -> int:
    return round(joules_ * 1000.0)


@dataclass(slots=True)
class _Task:
    pid: int
    type: str
    gi: int | None
    ci: int | None
    start: int | None
    name: str
    job: str
    slurm_job: str  # the Slurm job id (per-job reports and the bill by account)
    seconds: float = 0.0
    mem_max: int | None = None
    sm_max: float | None = None
    sm_time: float = 0.0  # sum of elapsed x SM ratio
    sm_seconds: float = 0.0  # seconds with an SM sample


@dataclass(slots=True)
class _Holder:
    sums: list[float] = field(default_factory=lambda: [0.0] * 6)
    counted: bool = False  # the bill counts this holder (close_cycle named it)
    mem_seconds: float = 0.0
    mem_known: bool = False
    tasks: dict[TaskKey, _Task] = field(default_factory=dict)


@dataclass(slots=True)
class _Gpu:
    index: int
    model: str
    samples: int = 0
    elapsed: float = 0.0
    fleet: list[float] = field(default_factory=lambda: [0.0] * 7)
    energy_known: bool = False
    sources: set[str] = field(default_factory=set)
    mem_seconds: float = 0.0
    mem_max: float | None = None
    mem_total: float | None = None  # the GPU's memory, for "how much of it was used"
    util_time: float = 0.0
    util_seconds: float = 0.0
    util_max: float | None = None
    holders: dict[Owner, _Holder] = field(default_factory=dict)


def _owner_of(attributed: bool, a: Any) -> Owner | None:
    if not attributed:
        return None
    return (a.user or None, a.project or None)


class IntervalUsage:
    """Adds samples up per GPU; `emit()` turns what was added into records and starts
    the next interval."""

    def __init__(self, *, host: str, stream: str) -> None:
        self.host = host
        self.stream = stream
        self._gpus: dict[str, _Gpu] = {}

    @property
    def pending(self) -> bool:
        """Whether a sample was added since the last emit."""
        return bool(self._gpus)

    def add(self, snap: Snapshot, prev: Snapshot | None, elapsed: float,
            counter_share: float) -> None:
        """Account one sample (the interval (prev, snap] of `elapsed` seconds)."""
        if elapsed <= 0:
            return
        prev_gpus: Mapping[str, GpuSample] = (
            {g.info.uuid: g for g in prev.gpus} if prev is not None else {})
        for gpu in snap.gpus:
            self._add_gpu(snap, gpu, prev_gpus.get(gpu.info.uuid), elapsed, counter_share)

    def _add_gpu(self, snap: Snapshot, gpu: GpuSample, prev_gpu: GpuSample | None,
                 e: float, counter_share: float) -> None:
        uuid = gpu.info.uuid
        acc = self._gpus.get(uuid)
        if acc is None:
            acc = self._gpus[uuid] = _Gpu(gpu.info.index, gpu.info.name)
        acc.samples += 1
        acc.elapsed += e
        if not gpu.up:
            _holders, fleet = close_cycle(GpuCycle(elapsed=e, up=False))
            acc.fleet[F_DOWN] += fleet[F_DOWN]
            return
        cyc, tasks = self._cycle(snap, gpu, prev_gpu, e, counter_share=counter_share, acc=acc)
        holders, fleet = close_cycle(cyc)
        for i, v in enumerate(fleet):
            acc.fleet[i] += v
        for owner, sums in holders.items():
            h = acc.holders.get(owner)
            if h is None:
                h = acc.holders[owner] = _Holder()
            h.counted = True
            for i, v in enumerate(sums):
                h.sums[i] += v
        for owner, p, job, slurm_job in tasks:
            h = acc.holders.get(owner)
            if h is None:
                h = acc.holders[owner] = _Holder()
            _add_task(h, p, job, slurm_job, e)

    def _cycle(
        self, snap: Snapshot, gpu: GpuSample, prev_gpu: GpuSample | None, e: float, *,
        counter_share: float, acc: _Gpu,
    ) -> tuple[GpuCycle, list[tuple[Owner, ProcessSample, str, str]]]:
        """The sample as the per-cycle trail would record it, reduced for the bill."""
        util = finite(gpu.scalar("utilization_gpu"))
        mem = finite(gpu.scalar("memory_used"))
        power = finite(gpu.scalar("power_usage"))
        energy = energy_of(gpu, prev_gpu, e, counter_share)
        c = GpuCycle(elapsed=e, up=True, gpu_seconds=e, utilization=util,
                     power_energy=power * e if power is not None else None)
        if energy is not None:
            c.energy = joules(energy[0])
            c.energy_source = energy[1]
            acc.energy_known = True
            acc.sources.add(energy[1])
        total = finite(gpu.scalar("memory_total"))
        if total is not None:
            acc.mem_total = total
        if mem is not None:
            acc.mem_seconds += e * mem
            acc.mem_max = mem if acc.mem_max is None else max(acc.mem_max, mem)
        if util is not None:
            acc.util_time += e * util
            acc.util_seconds += e
            acc.util_max = util if acc.util_max is None else max(acc.util_max, util)
        procs = snap.processes_of(gpu)
        owners = [_owner_of(ap.attribution.attributed, ap.attribution) for ap in procs]
        owned = [ap for ap, o in zip(procs, owners, strict=True) if o is not None]
        unowned = [ap for ap, o in zip(procs, owners, strict=True) if o is None]
        shares: list[int] = []
        if energy is not None:
            shares = split_units(energy[0], energy_weights(
                attributed_sm=[finite(ap.process.sm_util_ratio) for ap in owned],
                attributed_mem=[as_float(ap.process.used_memory_bytes) for ap in owned],
                unattributed_sm=[finite(ap.process.sm_util_ratio) for ap in unowned],
                unattributed_mem=[as_float(ap.process.used_memory_bytes) for ap in unowned],
                gpu_util=util, gpu_mem_used=mem))
        share = iter(shares)
        weights = process_weights(gpu)
        if weights is not None:
            c.slices = {}
        tasks: list[tuple[Owner, ProcessSample, str, str]] = []
        for ap, owner in zip(procs, owners, strict=True):
            p = ap.process
            sm = p.sm_util_ratio
            busy = e * max(0.0, sm) if sm is not None and isfinite(sm) else 0.0
            if owner is None:
                c.unowned_processes += 1
                tasks.append((UNATTRIBUTED, p, ap.attribution.job or "",
                              ap.attribution.slurm_job_id or ""))
                continue
            energy_j = joules(next(share)) if shares else 0.0
            if c.slices is not None and weights is not None and p.gpu_instance_id is not None:
                c.slices.setdefault(owner, {})[p.gpu_instance_id] = weights[p.gpu_instance_id]
            o = c.owners.get(owner)
            if o is None:
                c.owners[owner] = [e, busy, energy_j]
            else:
                o[0] = max(o[0], e)
                o[1] += busy
                o[2] += energy_j
            tasks.append((owner, p, ap.attribution.job or "", ap.attribution.slurm_job_id or ""))
        c.un_seen = True
        c.un_seconds = 0.0 if owned else e
        if weights is not None:
            c.un_seconds = e * unowned_slices(
                weights, (ap.process.gpu_instance_id for ap in owned),
                (ap.process.gpu_instance_id for ap in unowned))
        if shares:
            c.un_energy = joules(shares[-1])
        if util is not None:
            explained = math.fsum(finite(ap.process.sm_util_ratio) or 0.0 for ap in owned)
            c.un_busy = max(0.0, util - explained) * e
        return c, tasks

    def emit(self, time_ns: int, *, simulated: bool) -> list[Record]:
        """The records of the interval ending at `time_ns` (empty when nothing was
        added); the next interval starts empty."""
        gpus, self._gpus = self._gpus, {}
        prefix = id_prefix(self.host, self.stream, time_ns)
        out: list[Record] = []
        for uuid, acc in gpus.items():
            holders = sorted(acc.holders.items(), key=_holder_order)
            if not holders:
                out.append(self._record(prefix, time_ns, uuid, acc, None, first=True,
                                        simulated=simulated))
                continue
            for i, holder in enumerate(holders):
                out.append(self._record(prefix, time_ns, uuid, acc, holder, first=i == 0,
                                        simulated=simulated))
        return out

    def _record(self, prefix: Any, time_ns: int, uuid: str, g: _Gpu,
                holder: tuple[Owner, _Holder] | None, *, first: bool,
                simulated: bool) -> Record:
        key = "" if holder is None else orjson.dumps(list(holder[0])).decode()
        h = prefix.copy()
        h.update(id_tail("usage", "", uuid, key, ""))
        rec: Record = {
            "schema": SCHEMA_V3, "kind": "usage", "id": h.hexdigest(),
            "stream": self.stream, "host": self.host, "time_ns": time_ns,
            "dt": _s(g.elapsed), "n": g.samples, "uuid": uuid, "idx": g.index,
        }
        if g.model:
            rec["model"] = g.model
        if simulated:
            rec["sim"] = True
        if first:  # the GPU's own sums: once per GPU and interval
            _gpu_fields(rec, g)
        if holder is not None:
            (user, project), hold = holder
            if user is not None:
                rec["user"] = user
            if project is not None:
                rec["project"] = project
            if hold.counted:
                s = hold.sums
                rec["s"] = _s(s[0])  # always: it marks a holder the bill counts
                _nonzero(rec, "c", s[1])
                _nonzero(rec, "b", s[2])
                _nonzero(rec, "i", s[3])
                if g.energy_known:
                    rec["e"] = _mj(s[4])
                    rec["pe"] = _mj(s[5])
            if hold.mem_known:
                rec["ms"] = round(hold.mem_seconds)
            if hold.tasks:
                rec["tasks"] = [_task_json(t) for t in hold.tasks.values()]
        return rec


def _holder_order(item: tuple[Owner, _Holder]) -> tuple[Any, ...]:
    (user, project), _ = item
    return (user is None and project is None, user or "", project or "")


def _nonzero(rec: Record, key: str, seconds: float) -> None:
    # a sum of seconds that is 0 is left out (never down, never idle): absent reads as 0
    value = _s(seconds)
    if value:
        rec[key] = value


def _gpu_fields(rec: Record, g: _Gpu) -> None:
    f = g.fleet
    rec["gs"] = _s(f[F_GPU])  # always: it marks the GPU's own sums
    _nonzero(rec, "gd", f[F_DOWN])
    _nonzero(rec, "gi", f[F_IDLE_HELD])
    if g.energy_known:
        rec["ge"] = _mj(f[F_ENERGY])
        rec["gpe"] = _mj(f[F_POWER])
        if g.sources != {"counter"}:
            rec["ges"] = "+".join(sorted(g.sources))
    if g.mem_max is not None:
        rec["gms"] = round(g.mem_seconds)
        rec["gmx"] = round(g.mem_max)
    if g.mem_total is not None:
        rec["gmt"] = round(g.mem_total)
    if g.util_max is not None:
        rec["gua"] = round(g.util_time / g.util_seconds, 4) if g.util_seconds else 0.0
        rec["gux"] = g.util_max


def _add_task(h: _Holder, p: ProcessSample, job: str, slurm_job: str, e: float) -> None:
    start = p.identity.start_time_ticks if p.identity is not None else None
    key: TaskKey = (p.pid, p.type, p.gpu_instance_id, p.compute_instance_id, start)
    t = h.tasks.get(key)
    if t is None:
        t = h.tasks[key] = _Task(p.pid, p.type, p.gpu_instance_id, p.compute_instance_id,
                                 start, p.name, job, slurm_job)
    t.seconds += e
    mem = p.used_memory_bytes
    if mem is not None:
        t.mem_max = mem if t.mem_max is None else max(t.mem_max, mem)
        h.mem_seconds += e * mem
        h.mem_known = True
    sm = p.sm_util_ratio
    if sm is not None and isfinite(sm):
        t.sm_time += e * sm
        t.sm_seconds += e
        t.sm_max = sm if t.sm_max is None else max(t.sm_max, sm)


def _task_json(t: _Task) -> dict[str, Any]:
    out: dict[str, Any] = {"pid": t.pid, "s": _s(t.seconds)}
    if t.type != "compute":
        out["type"] = t.type
    if t.gi is not None:
        out["gi"] = t.gi
    if t.ci is not None:
        out["ci"] = t.ci
    if t.start is not None:
        out["st"] = t.start
    if t.name:
        out["name"] = t.name
    if t.job:
        out["job"] = t.job
    if t.slurm_job:
        out["sj"] = t.slurm_job
    if t.mem_max is not None:
        out["mx"] = t.mem_max
    if t.sm_max is not None:
        out["ua"] = round(t.sm_time / t.sm_seconds, 4) if t.sm_seconds else 0.0
        out["ux"] = t.sm_max
    return out
