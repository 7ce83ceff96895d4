"""The rollup: the sums a bill needs, per UTC day, simulated or not, GPU model, GPU and
holder, added up from audit records of any schema version.

A sealed archive part carries the rollup of its records (gpu_audit.archive.seal), so a
bill adds up a month of parts without reading a record; the same class adds up the
records a bill has to read (the open part, a part that straddles the period's edge), so
both ways give the same numbers for the same records.

- Version 3 `usage` records already hold their interval's sums (the producer computed
  them per sample with gpu_audit.audit.holders): they are added as they are.
- Version 1 and 2 records are per cycle: a GPU's `gpu`, `process` and `unattributed`
  records of one cycle share host, GPU uuid and `time_ns` and arrive together; they are
  grouped (one open cycle per host and GPU) and closed with `holders.close_cycle`.

A record at time T accounts for the interval (T - elapsed, T], so its day is the UTC
day of T - 1 ns (a record at midnight sharp closes the day before). A `gpu` record of a
MIG instance (uuid `MIG-...`, another producer) adds no fleet time or energy (its
parent's record has them); it is counted in `mig_instance_records`.

Pure: records in, sums out; no I/O. Amounts are seconds and joules.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from gpu_audit.audit.holders import (
    F_BUSY,
    F_DOWN,
    F_ENERGY,
    F_GPU,
    F_HELD,
    F_IDLE_HELD,
    F_POWER,
    GpuCycle,
    Owner,
    close_cycle,
)

UNKNOWN_MODEL = "unknown"
_DAY_NS = 86_400_000_000_000

# (day, simulated, model, gpu uuid, user, project) -> holder sums
HolderKey = tuple[str, bool, str, str, str | None, str | None]
# (day, simulated, model, gpu uuid) -> fleet sums
FleetKey = tuple[str, bool, str, str]


def _num(v: Any) -> float | None:
    """A JSON number as a float; None for anything else (bool included)."""
    t = type(v)  # exact types: the hot path, and bool is not a number here
    if t is float or t is int:
        return float(v)
    return None


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


# a version 3 usage record's sums over its interval: what a share of the interval has a
# share of (the rest, `n`, `gmx`, `gux`, `gua`, `tasks`, are not sums)
_SHARED_SUMS = ("dt", "gs", "gd", "gi", "ge", "gpe", "gms", "s", "c", "b", "i", "e", "pe",
                "ms")


def share(rec: Mapping[str, Any], begin_ns: int, end_ns: int) -> Mapping[str, Any]:
    """The part of a usage record that falls in (begin_ns, end_ns]: the record itself
    when its whole interval does, else (version 3) a copy with its sums scaled by the
    fraction of its interval, (time_ns - dt, time_ns], inside: a record that straddles
    a period's edge is split by time. A version 2 record (one sample) is left whole."""
    t, d = rec.get("time_ns"), rec.get("dt")
    if type(t) is not int or not (type(d) is float or type(d) is int) or d <= 0:
        return rec
    start = t - round(d * 1e9)
    lo, hi = max(start, begin_ns), min(t, end_ns)
    if lo <= start and hi >= t:
        return rec
    f = max(0, hi - lo) / (t - start)
    out = dict(rec)
    for k in _SHARED_SUMS:
        v = out.get(k)
        if type(v) is float or type(v) is int:
            out[k] = v * f
    return out


def _bin_name(n: int, bin_ns: int) -> str:
    """Bin n (of bin_ns since the epoch) by name: the day, or its start to the minute."""
    if bin_ns == _DAY_NS:
        return dt.date.fromordinal(dt.date(1970, 1, 1).toordinal() + n).isoformat()
    start = dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=n * bin_ns // 1000)
    return start.strftime("%Y-%m-%dT%H:%M")


class Rollup:
    """Sums per (day, simulated, model, GPU, holder) and per (day, simulated, model, GPU).

    `bin_ns`: the length of the "day" of the keys, a whole divisor of a UTC day; shorter
    than a day (an hour: 3_600_000_000_000) the key is the bin's start,
    YYYY-MM-DDTHH:MM. Seals always hold day rollups; shorter bins are for reports that
    read records (the capacity report's hour bins), so one pass gives every bin.
    """

    def __init__(self, bin_ns: int = _DAY_NS) -> None:
        if bin_ns <= 0 or _DAY_NS % bin_ns:
            raise ValueError(f"rollup bin of {bin_ns} ns does not divide a day")
        self.bin_ns = bin_ns
        self.holders: dict[HolderKey, list[float]] = {}
        self.fleet: dict[FleetKey, list[float]] = {}
        self.records = 0  # usage records added (v3), or v1/v2 usage records grouped
        self.simulated = 0  # of them, simulated (`sim` / `simulated` true)
        self.mig_instance_records = 0
        self.energy_sources: dict[str, int] = {}  # GPU intervals by where energy came from
        self._days: dict[int, str] = {}
        self._open: dict[tuple[str, str], tuple[int, str, str, bool, GpuCycle]] = {}

    # -- adding ----------------------------------------------------------------------
    def day_name(self, time_ns: int) -> str:
        """The UTC day (or bin) an interval ending at time_ns belongs to (midnight: the
        day before)."""
        n = (time_ns - 1) // self.bin_ns
        name = self._days.get(n)
        if name is None:
            name = self._days[n] = _bin_name(n, self.bin_ns)
        return name

    def add(self, rec: Mapping[str, Any]) -> None:
        """Add one record (any kind: records that account for nothing are ignored)."""
        kind = rec.get("kind")
        if kind == "usage":
            self._add_usage(rec)
        elif kind in ("gpu", "process", "unattributed"):
            self._add_cycle_record(rec, kind)

    def add_all(self, records: Iterable[Mapping[str, Any]]) -> None:
        for rec in records:
            self.add(rec)

    def _fleet(self, key: FleetKey) -> list[float]:
        f = self.fleet.get(key)
        if f is None:
            f = self.fleet[key] = [0.0] * 7
        return f

    def _holder(self, key: HolderKey) -> list[float]:
        h = self.holders.get(key)
        if h is None:
            h = self.holders[key] = [0.0] * 6
        return h

    def _add_usage(self, rec: Mapping[str, Any]) -> None:
        # Written out (no helper per field): this runs once per record of every part a
        # bill reads and every part the archive sink seals. A value that is not a
        # number (a bool, a string) counts as 0, as absent does.
        get = rec.get
        t, uuid = get("time_ns"), get("uuid")
        if type(t) is not int or type(uuid) is not str:
            return
        self.records += 1
        n = (t - 1) // self.bin_ns
        day = self._days.get(n)
        if day is None:
            day = self.day_name(t)
        sim = get("sim") is True
        self.simulated += sim
        model = get("model")
        if type(model) is not str or not model:
            model = UNKNOWN_MODEL
        fkey = (day, sim, model, uuid)
        gs = get("gs")
        if gs is not None:  # the GPU's own sums: on the first record of its interval only
            f = self.fleet.get(fkey)
            if f is None:
                f = self.fleet[fkey] = [0.0] * 7
            up = gs if type(gs) is float or type(gs) is int else 0.0
            f[F_GPU] += up
            v = get("gd")
            f[F_DOWN] += v if type(v) is float or type(v) is int else 0.0
            v = get("gi")
            f[F_IDLE_HELD] += v if type(v) is float or type(v) is int else 0.0
            v = get("ge")
            f[F_ENERGY] += v / 1000.0 if type(v) is int or type(v) is float else 0.0
            v = get("gpe")
            f[F_POWER] += v / 1000.0 if type(v) is int or type(v) is float else 0.0
            if up > 0:
                src = get("ges")
                src = src if type(src) is str else ("counter" if "ge" in rec else "none")
                self.energy_sources[src] = self.energy_sources.get(src, 0) + 1
        s = get("s")
        if s is not None:  # a holder's sums
            user, project = get("user"), get("project")
            hkey = (day, sim, model, uuid, user if type(user) is str and user else None,
                    project if type(project) is str and project else None)
            h = self.holders.get(hkey)
            if h is None:
                h = self.holders[hkey] = [0.0] * 6
            f = self.fleet.get(fkey)
            if f is None:
                f = self.fleet[fkey] = [0.0] * 7
            h[0] += s if type(s) is float or type(s) is int else 0.0
            c = get("c")
            c = c if type(c) is float or type(c) is int else 0.0
            b = get("b")
            b = b if type(b) is float or type(b) is int else 0.0
            h[1] += c
            h[2] += b
            # the GPU's held and busy time are its holders' (docs/AUDIT.md, version 3)
            f[F_HELD] += c
            f[F_BUSY] += b
            v = get("i")
            h[3] += v if type(v) is float or type(v) is int else 0.0
            v = get("e")
            h[4] += v / 1000.0 if type(v) is int or type(v) is float else 0.0
            v = get("pe")
            h[5] += v / 1000.0 if type(v) is int or type(v) is float else 0.0

    def _add_cycle_record(self, rec: Mapping[str, Any], kind: str) -> None:
        gpu = rec.get("gpu")
        t = rec.get("time_ns")
        if not isinstance(gpu, Mapping) or type(t) is not int:
            return
        self.records += 1
        self.simulated += rec.get("simulated") is True
        uuid = str(gpu.get("uuid", ""))
        key = (str(rec.get("host", "")), uuid)
        entry = self._open.get(key)
        if entry is None or entry[0] != t:
            if entry is not None:
                self._close(entry)
            name = gpu.get("name")
            entry = self._open[key] = (
                t, uuid, name if isinstance(name, str) and name else UNKNOWN_MODEL,
                rec.get("simulated") is True, GpuCycle(elapsed=0.0))
        c = entry[4]
        elapsed = _num(rec.get("elapsed_seconds")) or 0.0
        c.elapsed = max(c.elapsed, elapsed)
        values = rec.get("values")
        vals: Mapping[str, Any] = values if isinstance(values, Mapping) else {}
        if kind == "gpu":
            c.up = gpu.get("up") is True
            c.gpu_seconds = _num(rec.get("gpu_seconds")) or 0.0
            c.energy = _num(rec.get("energy_joules"))
            source = rec.get("energy_source")
            c.energy_source = source if isinstance(source, str) else "none"
            power = _num(vals.get("power_usage_watts"))
            c.power_energy = power * elapsed if power is not None else None
            c.utilization = _num(vals.get("utilization_ratio"))
        elif kind == "process":
            owner = _owner(rec)
            if owner is None:
                c.unowned_processes += 1
                return
            acc = c.owners.get(owner)
            if acc is None:
                acc = c.owners[owner] = [0.0, 0.0, 0.0]
            proc = rec.get("process")
            w = _num(proc.get("slice_weight")) if isinstance(proc, Mapping) else None
            gi = proc.get("gpu_instance_id") if isinstance(proc, Mapping) else None
            if w is not None and type(gi) is int:  # counted by the slice (MIG)
                if c.slices is None:
                    c.slices = {}
                c.slices.setdefault(owner, {})[gi] = w
            else:
                c.whole = True
            acc[0] = max(acc[0], _num(rec.get("gpu_seconds")) or 0.0)
            acc[1] += _num(rec.get("busy_gpu_seconds")) or 0.0
            acc[2] += _num(rec.get("energy_joules")) or 0.0
        else:
            c.un_seen = True
            c.un_seconds = _num(rec.get("gpu_seconds")) or 0.0
            c.un_energy = _num(rec.get("energy_joules")) or 0.0
            procs = _num(vals.get("processes"))
            if procs is not None:
                c.unowned_processes = max(c.unowned_processes, int(procs))
            util = _num(vals.get("utilization_ratio"))
            c.un_busy = util * elapsed if util is not None else 0.0

    def _close(self, entry: tuple[int, str, str, bool, GpuCycle]) -> None:
        t, uuid, model, sim, c = entry
        day = self.day_name(t)
        mig = uuid.startswith("MIG-")
        holders, fleet = close_cycle(c)
        if mig:
            self.mig_instance_records += 1
        else:
            if c.up is True:
                self.energy_sources[c.energy_source] = (
                    self.energy_sources.get(c.energy_source, 0) + 1)
            f = self._fleet((day, sim, model, uuid))
            for i, v in enumerate(fleet):
                f[i] += v
        for (user, project), sums in holders.items():
            h = self._holder((day, sim, model, uuid, user, project))
            for i, v in enumerate(sums):
                h[i] += v

    def finish(self) -> Rollup:
        """Close the cycles still open (call once every record was added)."""
        for entry in self._open.values():
            self._close(entry)
        self._open.clear()
        return self

    # -- combining and storing -------------------------------------------------------
    def merge(self, other: Rollup, *, per_gpu: bool = True) -> None:
        """Add another rollup's sums to these (both finished). `per_gpu=False` adds them
        up over GPUs (the uuid of every key becomes ""): what a bill keeps of a month of
        a thousand GPUs."""
        for hk, hv in other.holders.items():
            mine = self._holder(hk if per_gpu else (*hk[:3], "", *hk[4:]))
            for i, v in enumerate(hv):
                mine[i] += v
        for fk, fv in other.fleet.items():
            mine = self._fleet(fk if per_gpu else (*fk[:3], ""))
            for i, v in enumerate(fv):
                mine[i] += v
        self.records += other.records
        self.simulated += other.simulated
        self.mig_instance_records += other.mig_instance_records
        for src, n in other.energy_sources.items():
            self.energy_sources[src] = self.energy_sources.get(src, 0) + n

    def to_json(self) -> dict[str, Any]:
        """The rollup as stored in a seal: sorted rows, so the same sums give the same
        bytes."""
        return {
            "holders": [[*k, *v] for k, v in sorted(self.holders.items(), key=_hkey)],
            "fleet": [[*k, *v] for k, v in sorted(self.fleet.items())],
            "records": self.records,
            "simulated": self.simulated,
            "mig_instance_records": self.mig_instance_records,
            "energy_sources": dict(sorted(self.energy_sources.items())),
        }

    @classmethod
    def from_json(cls, obj: Any) -> Rollup:
        """A stored rollup; ValueError naming what is wrong when it is not one."""
        if not isinstance(obj, Mapping):
            raise ValueError("rollup is not an object")
        r = cls()
        try:
            for row in obj["holders"]:
                day, sim, model, uuid, user, project, *sums = row
                if (not isinstance(day, str) or not isinstance(sim, bool)
                        or not isinstance(model, str) or not isinstance(uuid, str)
                        or not (user is None or isinstance(user, str))
                        or not (project is None or isinstance(project, str))
                        or len(sums) != 6 or not all(_num(x) is not None for x in sums)):
                    raise ValueError(f"bad holder row {row!r}")
                r.holders[day, sim, model, uuid, user, project] = [float(x) for x in sums]
            for row in obj["fleet"]:
                day, sim, model, uuid, *sums = row
                if (not isinstance(day, str) or not isinstance(sim, bool)
                        or not isinstance(model, str) or not isinstance(uuid, str)
                        or len(sums) != 7 or not all(_num(x) is not None for x in sums)):
                    raise ValueError(f"bad fleet row {row!r}")
                r.fleet[day, sim, model, uuid] = [float(x) for x in sums]
            r.records = int(obj["records"])
            r.simulated = int(obj.get("simulated", 0))
            r.mig_instance_records = int(obj.get("mig_instance_records", 0))
            r.energy_sources = {str(k): int(v) for k, v in obj.get("energy_sources", {}).items()}
        except (KeyError, TypeError) as exc:
            raise ValueError(f"rollup: {type(exc).__name__}: {exc}") from None
        return r


def _hkey(item: tuple[HolderKey, list[float]]) -> tuple[Any, ...]:
    (day, sim, model, uuid, user, project), _ = item
    return (day, sim, model, uuid, user is not None, user or "", project is not None,
            project or "")


def _owner(rec: Mapping[str, Any]) -> Owner | None:
    """The owner of a v1/v2 process record, or None when it is not attributed."""
    if rec.get("attributed") is not True:
        return None
    a = rec.get("attribution")
    if not isinstance(a, Mapping):
        return (None, None)
    return (_str(a.get("user")), _str(a.get("project")))
