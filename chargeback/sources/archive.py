"""Chargeback from the local audit archive: one streaming pass that verifies the hash
chain and adds up the records' accounted seconds and joules (docs/AUDIT.md,
"Accounting: sums over records give usage without Prometheus").

Reading: the parts of every UTC day the period touches, in archive order, through core's
ordered reader (gpu_audit.archive). Every line of those parts is fed to core's
`Verifier` as it is read (the records of a boundary day outside the period too, so the
chain is checked across the whole of every part read); a broken trail is refused
(`ArchiveRefused`, naming the problems) unless `Request.allow_unverified`, and then the
data says `verified=False` with the problems. What is not checked: the records before
the first part read (the chain is verified from its first record read on, not from
seq 1), and the newest part's last line when it has no newline yet (still being
written; left out, as `audit verify` does).

Accounting, per cycle and GPU (the `gpu` record, its `process` records and its
`unattributed` record share `host`, GPU uuid and `time_ns`; they are grouped with a
buffer of one cycle per GPU, so memory does not grow with the number of records). A
record at time T accounts for the interval (T - elapsed, T], so it counts for the period
[start, end) when start < T <= end, and for the UTC day its interval ends in (the day of
T - 1 ns: a record at midnight sharp closes the day before):

- fleet: an up `gpu` record adds `gpu_seconds`, a down one `elapsed_seconds` to
  `down_gpu_seconds`; energy is the record's `energy_joules` (counter, counter reset or
  power, as the exporter chose) and the cross-check `values.power_usage_watts x
  elapsed_seconds`;
- used: per owner (user, project of an attributed process), the interval once per GPU
  (several processes of one owner on one GPU count once); busy: the sum of their
  `busy_gpu_seconds`; energy: the sum of their split `energy_joules` (the power
  cross-check is split in the same proportion);
- charged: the interval divided equally among the distinct owners on the GPU;
- held by nobody known: the `unattributed` record's `gpu_seconds` when it names
  unowned processes (`values.processes` > 0) is the unattributed owner's time; with no
  process at all the GPU was free (idle fleet time, the fleet minus everything held).
  The `unattributed` record's energy goes to the unattributed owner only when unowned
  processes held the GPU; on a free GPU it is idle energy (in the fleet only, the idle
  row); on a GPU held by owners only it is added to the owners' energy (in proportion
  to it, equally when it is all 0), as the Prometheus source splits a held GPU's whole
  power among its holders, so both sources bill the same energy to the same rows;
- idle-held: the interval of a held GPU whose `values.utilization_ratio` is < 5 %
  (unknown utilisation, e.g. a MIG parent, is not counted as idle);
- allocated: the records carry no allocation (the job mapping names owners, not
  reservations), so allocated = used, and `notes` says so;
- MIG: the exporter writes one `gpu` record per physical GPU (the MIG parent), with
  each instance's processes on it (`process.gpu_instance_id`), so its energy is counted
  once. A `gpu` record whose uuid is a MIG instance's (`MIG-...`, another producer) adds
  no fleet time or energy (its parent's record has them); its processes still count as
  used time, and `notes` says how many such records there were;
- simulated records (`simulated: true`) are left out unless `include_simulated`, and
  counted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from chargeback.model import UNATTRIBUTED, Fleet, Owner, Request, SourceData, Usage
from gpu_audit.archive import list_parts, read_lines
from gpu_audit.archive.layout import Part, day_of
from gpu_audit.audit.verify import Verifier

IDLE_UTILIZATION = 0.05
# Duplicate record ids are looked for within this many recent records per stream: a
# sample chained twice sits within a few cycles of itself (10,000 records: over an hour
# of an 8-GPU node at 10 s), and the window bounds memory. Core's default (a million per
# stream, each id kept with its position) held ~200 MB on the benchmark's 8 streams.
ID_WINDOW = 10_000
UNKNOWN_MODEL = "unknown"

_ENERGY_SOURCES = {"counter": "the energy counter",
                   "counter_reset": "the counter after a reset (driver reload, GPU reset)",
                   "power": "power x elapsed (no counter reading)",
                   "none": "nowhere (no counter and no power reading: not billed)"}

Progress = Callable[[int, int], None]  # (bytes of parts read so far, bytes of all parts)


class ArchiveRefused(Exception):
    """The archive cannot be billed from: the trail is broken, or holds no data."""

    def __init__(self, directory: Path, problems: list[str]) -> None:
        self.directory = directory
        self.problems = problems
        lines = [f"archive {directory}: {len(problems)} problem(s)"]
        lines += [f"  - {p}" for p in problems]
        super().__init__("\n".join(lines))


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _ns(t: datetime) -> int:
    """A datetime (naive: UTC) as Unix nanoseconds, exactly."""
    t = t if t.tzinfo is not None else t.replace(tzinfo=UTC)
    return (t - _EPOCH) // timedelta(microseconds=1) * 1000


def _num(v: Any) -> float | None:
    """A JSON number as a float; None for anything else (bool included)."""
    t = type(v)  # exact types: the hot path, and bool is not a number here
    if t is float:
        return float(v)
    if t is int:
        return float(v)
    return None


@dataclass(slots=True)
class _Cycle:
    """The records of one GPU and one cycle, reduced as they arrive."""

    time_ns: int
    model: str
    mig_instance: bool
    up: bool | None = None  # None: no gpu record seen (yet)
    elapsed: float = 0.0
    gpu_seconds: float = 0.0
    energy: float | None = None
    energy_source: str = "none"
    power_energy: float | None = None
    utilization: float | None = None
    # owner -> [max gpu_seconds, busy, energy]
    owners: dict[Owner, list[float]] = field(default_factory=dict)
    unowned_processes: int = 0
    un_seconds: float = 0.0
    un_energy: float = 0.0
    un_busy: float = 0.0
    un_seen: bool = False


@dataclass(slots=True)
class _Totals:
    usage: dict[tuple[Owner, str], Usage] = field(default_factory=dict)
    fleet: dict[str, Fleet] = field(default_factory=dict)
    days: dict[str, tuple[dict[Owner, Usage], Fleet]] = field(default_factory=dict)
    mig_instance_records: int = 0
    energy_sources: dict[str, int] = field(default_factory=dict)  # up GPU intervals by source
    _day_names: dict[int, str] = field(default_factory=dict)

    def day_name(self, time_ns: int) -> str:
        """The UTC day an interval ending at time_ns belongs to (midnight: the day before)."""
        n = (time_ns - 1) // 86_400_000_000_000
        name = self._day_names.get(n)
        if name is None:
            name = self._day_names[n] = day_of(time_ns - 1).isoformat()
        return name

    def merge(self, other: _Totals) -> None:
        """Add another run's totals (of other days) to these."""
        for k, u in other.usage.items():
            self.usage.setdefault(k, Usage()).add(u)
        for m, f in other.fleet.items():
            self.fleet.setdefault(m, Fleet()).add(f)
        for day, (owners, f) in other.days.items():
            mine = self.days.setdefault(day, ({}, Fleet()))
            for o, u in owners.items():
                mine[0].setdefault(o, Usage()).add(u)
            mine[1].add(f)
        self.mig_instance_records += other.mig_instance_records
        for src, n in other.energy_sources.items():
            self.energy_sources[src] = self.energy_sources.get(src, 0) + n

    def _usage(self, owner: Owner, model: str, day: str) -> tuple[Usage, Usage]:
        u = self.usage.get((owner, model))
        if u is None:
            u = self.usage[owner, model] = Usage()
        d = self._day(day)[0]
        du = d.get(owner)
        if du is None:
            du = d[owner] = Usage()
        return u, du

    def _day(self, day: str) -> tuple[dict[Owner, Usage], Fleet]:
        entry = self.days.get(day)
        if entry is None:
            entry = self.days[day] = ({}, Fleet())
        return entry

    def close(self, c: _Cycle) -> None:
        day = self.day_name(c.time_ns)
        f = Fleet()
        e = c.elapsed
        idle = c.utilization is not None and c.utilization < IDLE_UTILIZATION
        gpu_energy = c.energy or 0.0
        ratio = (c.power_energy / gpu_energy
                 if c.power_energy is not None and gpu_energy > 0 else None)
        if c.mig_instance:
            self.mig_instance_records += 1
        elif c.up is True:
            self.energy_sources[c.energy_source] = self.energy_sources.get(c.energy_source, 0) + 1
            f.gpu_seconds = c.gpu_seconds
            f.energy_joules = gpu_energy
            f.power_energy_joules = c.power_energy or 0.0
        elif c.up is False:
            f.down_gpu_seconds = e
        held = bool(c.owners) or c.unowned_processes > 0
        if held and not c.mig_instance:
            f.held_gpu_seconds = e
            if idle:
                f.idle_held_gpu_seconds = e
        n = len(c.owners)
        if c.owners and c.unowned_processes == 0 and c.un_energy:
            # held by owners only: the remainder the records left unattributed (GPU
            # utilisation no owner's process explains) is theirs, as Prometheus splits a
            # held GPU's whole power among its holders (by energy, else equally)
            total = sum(acc[2] for acc in c.owners.values())
            for acc in c.owners.values():
                acc[2] += c.un_energy * (acc[2] / total if total > 0 else 1.0 / n)
            c.un_energy = 0.0
        for owner, (used, busy, energy) in c.owners.items():
            u = Usage(
                allocated_gpu_seconds=used,
                used_gpu_seconds=used,
                charged_gpu_seconds=(e or used) / n,
                busy_gpu_seconds=busy,
                idle_held_gpu_seconds=used if idle else 0.0,
                energy_joules=energy,
                power_energy_joules=energy * ratio if ratio is not None else 0.0,
            )
            f.busy_gpu_seconds += busy
            for target in self._usage(owner, c.model, day):
                target.add(u)
        if c.un_seen and c.unowned_processes > 0:
            held_unknown = c.un_seconds
            u = Usage(
                allocated_gpu_seconds=held_unknown,
                used_gpu_seconds=held_unknown,
                charged_gpu_seconds=held_unknown,
                busy_gpu_seconds=c.un_busy,
                idle_held_gpu_seconds=held_unknown if idle else 0.0,
                energy_joules=c.un_energy,
                power_energy_joules=c.un_energy * ratio if ratio is not None else 0.0,
            )
            f.busy_gpu_seconds += u.busy_gpu_seconds
            if any((u.used_gpu_seconds, u.energy_joules, u.busy_gpu_seconds)):
                for target in self._usage(UNATTRIBUTED, c.model, day):
                    target.add(u)
        if c.mig_instance:
            return
        fleet = self.fleet.get(c.model)
        if fleet is None:
            fleet = self.fleet[c.model] = Fleet()
        fleet.add(f)
        self._day(day)[1].add(f)


def _owner(rec: Mapping[str, Any]) -> Owner | None:
    """The owner of a process record, or None when it is not attributed."""
    if rec.get("attributed") is not True:
        return None
    a = rec.get("attribution")
    if not isinstance(a, Mapping):
        return UNATTRIBUTED
    user, project = a.get("user"), a.get("project")
    return (user if isinstance(user, str) and user else None,
            project if isinstance(project, str) and project else None)


class _Accountant:
    """Groups usage records by (host, GPU uuid) and cycle; closes a cycle when the next
    one of its GPU starts, or at the end."""

    def __init__(self) -> None:
        self.totals = _Totals()
        self.open: dict[tuple[str, str], _Cycle] = {}

    def add(self, rec: Mapping[str, Any]) -> None:
        kind = rec.get("kind")
        if kind not in {"gpu", "process", "unattributed"}:
            return
        gpu = rec.get("gpu")
        t = rec.get("time_ns")
        if not isinstance(gpu, Mapping) or not isinstance(t, int):
            return
        uuid = str(gpu.get("uuid", ""))
        key = (str(rec.get("host", "")), uuid)
        c = self.open.get(key)
        if c is None or c.time_ns != t:
            if c is not None:
                self.totals.close(c)
            name = gpu.get("name")
            c = self.open[key] = _Cycle(
                time_ns=t,
                model=name if isinstance(name, str) and name else UNKNOWN_MODEL,
                mig_instance=uuid.startswith("MIG-"),
            )
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

    def finish(self) -> _Totals:
        for c in self.open.values():
            self.totals.close(c)
        self.open.clear()
        return self.totals


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def parts_for(directory: Path, start_ns: int, end_ns: int) -> list[Part]:
    """The archive's parts of the UTC days from start_ns's to end_ns's (a record at
    end_ns sharp, in end_ns's day, is still in the period), in order."""
    first, last = day_of(start_ns), day_of(max(start_ns, end_ns))
    return [p for p in list_parts(directory) if first <= p.day <= last]


@dataclass(slots=True)
class _Scan:
    """What one run of consecutive days' parts gave (picklable: a worker's answer)."""

    records: int = 0
    in_range: int = 0
    simulated_excluded: int = 0
    simulated_billed: int = 0
    problems: list[str] = field(default_factory=list)
    problem_count: int = 0
    totals: _Totals = field(default_factory=_Totals)
    # per stream: its first and last record fed, with where they are (for the stitch)
    edges: dict[str, tuple[dict[str, Any], str, dict[str, Any], str]] = field(
        default_factory=dict)
    hashes: dict[str, str] = field(default_factory=dict)


def _scan(parts: list[Part], newest: Path, *, start_ns: int, end_ns: int,
          key: bytes | None, include_sim: bool,
          on_part: Callable[[int], None] | None = None) -> _Scan:
    """Verify every line of `parts` (in order) and add up the period's records;
    `on_part(size)` after each part."""
    out = _Scan()
    verifier = Verifier(hmac_key=key, complete=False, id_window=ID_WINDOW)
    acct = _Accountant()
    first: dict[str, tuple[dict[str, Any], str]] = {}
    last: dict[str, tuple[dict[str, Any], str]] = {}
    loads = orjson.loads
    for part in parts:
        out.hashes[part.path.name] = _sha256(part.path)
        for line in read_lines(part.path.parent, parts=[part]):
            if not line.complete and part.path == newest:
                continue  # still being written: not part of the trail yet
            try:
                rec = loads(line.raw)
            except orjson.JSONDecodeError:
                verifier.feed(line.raw, line.where)  # reported as invalid_json
                continue
            verifier.feed(rec, line.where)
            if not isinstance(rec, dict):
                continue
            stream = rec.get("stream")
            if isinstance(stream, str):
                if stream not in first:
                    first[stream] = (rec, line.where)
                last[stream] = (rec, line.where)
            t = rec.get("time_ns")
            if not isinstance(t, int) or not start_ns < t <= end_ns:
                continue
            out.in_range += 1
            if rec.get("simulated") is True:
                if not include_sim:
                    out.simulated_excluded += 1
                    continue
                out.simulated_billed += 1
            acct.add(rec)
        if on_part is not None:
            on_part(part.path.stat().st_size)
    report = verifier.report()
    out.records = report.records
    out.problems = [p.render() for p in report.problems]
    out.problem_count = sum(report.counts.values())
    out.totals = acct.finish()
    out.edges = {s: (*first[s], *last[s]) for s in first}
    return out


# Problems a stitch can find that no worker could: across the boundary between runs.
_STITCH_KINDS = frozenset({"gap", "chain_break", "reordered", "duplicate_seq", "duplicate_id"})


def _stitch(scans: list[_Scan], key: bytes | None) -> list[str]:
    """Chain the runs together: each stream's last record of one run and its first of
    the next run it appears in go through a Verifier of their own (a gap or a chain
    break between runs; the records themselves were checked by their runs)."""
    problems: list[str] = []
    before: dict[str, tuple[dict[str, Any], str]] = {}
    for scan in scans:
        for stream, (first, where_first, last, where_last) in scan.edges.items():
            prev = before.get(stream)
            if prev is not None:
                v = Verifier(hmac_key=key, complete=False)
                v.feed(prev[0], prev[1])
                v.feed(first, where_first)
                problems += [p.render() for p in v.report().problems
                             if p.kind in _STITCH_KINDS]
            before[stream] = (last, where_last)
    return problems


def _runs(parts: list[Part], sizes: list[int], workers: int) -> list[list[Part]]:
    """Consecutive runs of whole days' parts (a cycle's records never leave their day),
    about equal in bytes, at most `workers` of them."""
    days: list[list[Part]] = []
    day_sizes: list[int] = []
    for part, size in zip(parts, sizes, strict=True):
        if days and days[-1][0].day == part.day:
            days[-1].append(part)
            day_sizes[-1] += size
        else:
            days.append([part])
            day_sizes.append(size)
    n = max(1, min(workers, len(days)))
    target = sum(day_sizes) / n
    runs: list[list[Part]] = [[]]
    acc = 0
    for i, (day, size) in enumerate(zip(days, day_sizes, strict=True)):
        behind = len(days) - i <= n - len(runs)  # as many days left as runs to fill
        if runs[-1] and len(runs) < n and (acc >= target * len(runs) or behind):
            runs.append([])
        runs[-1].extend(day)
        acc += size
    return runs


def read_archive(
    req: Request,
    archive_dir: Path,
    key: bytes | None = None,
    progress: Progress | None = None,
    workers: int = 1,
) -> SourceData:
    """Verify and add up the archive's records for the period (start, end].

    `key`: the HMAC key the records were chained with (None: plain SHA-256).
    `progress(done, total)` is called as parts are done, in bytes of the part files.
    `workers` > 1 verifies and adds up runs of consecutive days in that many processes
    (each about as large as one; the runs' chains are then joined, so the verdict is the
    one pass's, except that a record id used twice is looked for within a run only).
    Raises ArchiveRefused when the directory cannot be read, holds no part for the
    period, or the chain does not verify (unless `req.allow_unverified`).
    """
    start_ns, end_ns = _ns(req.start), _ns(req.end)
    if not archive_dir.is_dir():
        raise ArchiveRefused(archive_dir, ["not a directory (is --config's archive right?)"])
    parts = parts_for(archive_dir, start_ns, end_ns)
    if not parts:
        raise ArchiveRefused(archive_dir, [
            f"no archive part for {req.start.isoformat()} .. {req.end.isoformat()} "
            "(files <prefix>-YYYY-MM-DD[.N].jsonl[.gz])"])
    data = SourceData(source="archive", start=req.start, end=req.end,
                      simulated_included=req.include_simulated)
    data.inputs["archive"] = str(archive_dir)
    newest = list_parts(archive_dir)[-1].path
    sizes = [p.path.stat().st_size for p in parts]
    total = sum(sizes)
    runs = _runs(parts, sizes, workers)
    kw: dict[str, Any] = {"start_ns": start_ns, "end_ns": end_ns, "key": key,
                          "include_sim": req.include_simulated}
    if len(runs) == 1:
        done = [0]

        def on_part(size: int) -> None:
            done[0] += size
            if progress is not None:
                progress(done[0], total)

        scans = [_scan(parts, newest, on_part=on_part, **kw)]
    else:
        scans = _parallel(runs, newest, kw, total, progress)
    for part in parts:
        data.queries.append(f"archive part {part.path.name}")
    problems: list[str] = []
    count = 0
    for scan in scans:
        data.inputs.update(scan.hashes)
        problems += scan.problems
        count += scan.problem_count
    stitched = _stitch(scans, key)
    problems += stitched
    count += len(stitched)
    if count > len(problems):
        problems.append(f"... {count - len(problems)} more not listed")
    if problems and not req.allow_unverified:
        raise ArchiveRefused(archive_dir, [
            "the hash chain does not verify (pass --allow-unverified to bill from it "
            "anyway, marked unverified)", *problems])
    data.verified = not problems
    data.verification_problems = problems
    totals = _Totals()
    in_range = records = simulated_billed = 0
    for scan in scans:
        simulated_billed += scan.simulated_billed
        totals.merge(scan.totals)
        in_range += scan.in_range
        records += scan.records
        data.simulated_excluded += scan.simulated_excluded
    if not totals.fleet and not totals.usage:
        why = (f"{in_range} record(s) in the period, all simulated (--include-simulated "
               "bills them)" if in_range and data.simulated_excluded == in_range
               else f"{in_range} record(s) in the period, none a usage record")
        raise ArchiveRefused(archive_dir, [
            f"no usage for {req.start.isoformat()} .. {req.end.isoformat()}: {why}"])
    data.usage, data.fleet, data.days = totals.usage, totals.fleet, totals.days
    if simulated_billed:
        data.notes.append(
            f"SIMULATED: {simulated_billed} of the {in_range} record(s) in the period are "
            "simulated (simulated: true, from the GPU simulator) and are billed "
            "(--include-simulated): not a bill for real hardware")
    data.notes.append(
        "archive: allocated GPU-hours = used GPU-hours (audit records carry no "
        "allocation, only the owners of running processes)")
    data.notes.append(
        f"archive: {records} record(s) verified in {len(parts)} part(s), "
        f"{in_range} in the period")
    sources = totals.energy_sources
    data.notes.append(
        "archive: energy of " + ", ".join(
            f"{n} GPU interval(s) from {_ENERGY_SOURCES.get(k, k)}"
            for k, n in sorted(sources.items())) if sources else
        "archive: no GPU interval with energy")
    if totals.mig_instance_records:
        data.notes.append(
            f"archive: {totals.mig_instance_records} GPU record(s) of MIG instances "
            "(MIG-... uuids) added no fleet time or energy (their parent GPU's record has it)")
    return data


def _parallel(runs: list[list[Part]], newest: Path, kw: dict[str, Any], total: int,
              progress: Progress | None) -> list[_Scan]:
    import multiprocessing  # noqa: PLC0415 - only for workers > 1
    from concurrent.futures import ProcessPoolExecutor, as_completed  # noqa: PLC0415

    ctx = multiprocessing.get_context("spawn")  # no fork of a threaded parent
    scans: list[_Scan | None] = [None] * len(runs)
    done = 0
    with ProcessPoolExecutor(max_workers=len(runs), mp_context=ctx) as pool:
        futures = {pool.submit(_scan, run, newest, **kw): i for i, run in enumerate(runs)}
        for fut in as_completed(futures):
            i = futures[fut]
            scans[i] = fut.result()
            done += sum(p.path.stat().st_size for p in runs[i])
            if progress is not None:
                progress(done, total)
    return [s for s in scans if s is not None]
