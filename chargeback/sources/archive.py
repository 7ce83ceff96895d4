"""Chargeback from the local audit archive: the rollups of sealed parts, the records of
the parts a seal cannot answer for, and a proof per host and stream that nothing is
missing (docs/CHARGEBACK-SOURCES.md).

Per host and stream (a series of parts, gpu_audit.archive.layout), for the period
(start, end] (a record at T accounts for (T - elapsed, T]):

- the parts that matter run from the last part wholly before the period (its last record
  is the last one before the period) to the first wholly after it (its first record is
  the first after); a part's day says from its name alone that it lies outside, so only
  the seals of that window are read;
- every part used is checked by audit verify's rules, in its code
  (gpu_audit.archive.verify.SeriesSeals): its seal, its SHA-256 against the seal, the
  seal chain, the seal's MAC under the key, a closed part without a seal, part numbers
  following each other, and the hash chain from part to part (first seq and prev_hash of
  a part against the last seq and hash of the one before it);
- a part whose seal is authentic (keyed trail, its MAC matches) and whose records
  account only for time inside the period (seal's first_start_ns .. last_time_ns) is
  billed from its seal's rollup, without reading a record; every other part (on an
  unkeyed trail, all of them: no seal proves its sums), a part that straddles the
  period's edge, the still-open part, and with `verify_records` every part, are read
  record by record through core's Verifier, their seals compared with their records
  (rollup included, unless authentic), and added up through core's Rollup, a version 3
  record straddling an edge split by time (gpu_audit.archive.rollup.share);
- with `req.witness`, the archive must hold every chain head the Prometheus there kept
  (gpu_audit.audit.witness);
- the proof: the chain is continuous from the last record before the period to the first
  after it, or "open" (no record after the period yet); otherwise a gap is named: seqs
  missing between parts or inside one, a part missing or damaged, or a stream whose first
  record in the archive lies in the period and does not start its chain.

Legacy parts (written before parts were named by host and stream) are read record by
record, the day before the period included; each chain in them must show a record
before the period or start at seq 1.

The verdicts: problems of the records themselves (edited, re-chained, foreign, a part or
a seal changed after sealing) refuse the bill unless `allow_unverified` (then
`verified=False`); gaps refuse it unless `allow_gaps` (then `completeness.allowed`, and
every output says so). Both are raised as ArchiveRefused naming every problem.

The sums are core's (gpu_audit.archive.rollup, with the rules of gpu_audit.audit.holders):
fleet (up, down, held, idle-held, busy, energy, power cross-check) per GPU model and day;
per owner (user, project) used, charged, busy, idle-held, energy and power cross-check;
the unattributed holder; allocated is not known (records carry no allocation). Simulated
records are left out unless `include_simulated`.
"""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from chargeback.model import Completeness, Fleet, Owner, Request, SourceData, Usage
from gpu_audit.archive import Part, day_of, list_parts
from gpu_audit.archive.rollup import Rollup, share
from gpu_audit.archive.seal import ZERO_DIGEST, Seal, elapsed_ns, file_sha256
from gpu_audit.archive.verify import (
    PartResult,
    SeriesSeals,
    compare_seal,
    group_series,
    read_part,
)
from gpu_audit.audit import witness
from gpu_audit.audit.canonical import ZERO_HASH
from gpu_audit.audit.verify import Verifier
from gpu_audit.errors import GpuAuditError

# Duplicate record ids are looked for within this many recent records per stream: a
# sample chained twice sits within a few cycles of itself. Streams are read one after
# another, so one window is in memory at a time.
ID_WINDOW = 10_000
_DAY_NS = 86_400_000_000_000
# the verifier's problems that mean records are missing (--allow-gaps), not changed
GAP_KINDS = frozenset({"gap", "missing_part", "damaged_part", "witness_missing"})

_ENERGY_SOURCES = {"counter": "the energy counter",
                   "counter_reset": "the counter after a reset (driver reload, GPU reset)",
                   "power": "power x elapsed (no counter reading)",
                   "none": "nowhere (no counter and no power reading: not billed)"}

Progress = Callable[[int, int], None]  # (bytes of parts done so far, bytes of all parts)


class ArchiveRefused(GpuAuditError):
    """The archive cannot be billed from: the trail is broken or incomplete, or holds
    no data for the period."""

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


def _day_start_ns(day: dt.date) -> int:
    return (day.toordinal() - dt.date(1970, 1, 1).toordinal()) * _DAY_NS


def _when(ns: int | None) -> str:
    if ns is None:
        return "?"
    return datetime.fromtimestamp(ns // 1_000_000_000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(slots=True)
class _Chain:
    """One host's stream, as the bill saw it."""

    host: str
    stream: str
    # the bill's sums, over GPUs and hosts: shared by every chain (small for a month of
    # a thousand GPUs: per day, model and owner)
    rollup: Rollup
    gpus: dict[bool, set[str]] = field(default_factory=dict)  # simulated? -> GPU uuids
    observed: dict[bool, float] = field(default_factory=dict)  # simulated? -> up + down s
    start: str | None = None  # the last record before the period (or the chain's start)
    proven_before: bool = False  # a record before the period was seen (not just seq 1)
    end: str | None = None  # the first record after the period
    first_seq: int | None = None  # the first record seen of it, and its prev_hash
    first_prev: str | None = None
    first_where: str = ""
    first_in: int | None = None  # time of its first and last records in the period
    last_in: int | None = None
    last_ns: int | None = None  # its newest record seen (in or before the period)
    last_seq: int | None = None
    gaps: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.stream}@{self.host}"

    def absorb(self, part: Rollup) -> None:
        """A part's sums (finished): its GPUs for the inventory, the rest over GPUs."""
        for (_day, sim, _model, uuid), f in part.fleet.items():
            self.gpus.setdefault(sim, set()).add(uuid)
            self.observed[sim] = self.observed.get(sim, 0.0) + f[0] + f[1]
        self.rollup.merge(part, per_gpu=False)


class _Reader:
    """Reads parts for one bill: the verifier, the period, inputs and queries."""

    def __init__(self, req: Request, key: bytes | None, progress: Progress | None,
                 total: int) -> None:
        # bins of the sums shorter than a day (the capacity report's hours): seals sum
        # whole days, so every part in the period is read, once, into per-bin sums
        self.bin_ns = round(req.bin_seconds * 1e9) if req.bin_seconds else _DAY_NS
        self.rollup = Rollup(self.bin_ns)  # what the bill adds up, over GPUs
        self.start_ns, self.end_ns = _ns(req.start), _ns(req.end)
        self.verify_records = req.verify_records
        self.hash_parts = req.hash_sealed_parts or req.verify_records
        self.key = key
        # unkeyed seals billed unread (--trust-unkeyed-seals): nothing proves their sums
        self.trust_unkeyed = req.trust_unkeyed_seals and key is None
        self.trusted = 0
        self.v = Verifier(hmac_key=key, complete=False, id_window=ID_WINDOW)
        self.inputs: dict[str, str] = {}
        self.queries: list[str] = []
        self.notes: list[str] = []  # legacy chains that cannot be proven
        self.progress, self.total, self.done = progress, total, 0

    def advance(self, size: int) -> None:
        self.done += size
        if self.progress is not None:
            self.progress(self.done, self.total)

    def read(self, p: Part, chain: _Chain, *, live: bool, expect: tuple[str, str] | None,
             part_sums: Rollup | None = None) -> PartResult:
        """A part record by record: verify it, add the period's records, note the last
        record before the period and the first after it."""
        name = p.path.name
        sums = Rollup(self.bin_ns)
        on_record = self._recorder(name, chain, sums)
        result = read_part(self.v, p, expect=expect, live=live, on_record=on_record,
                           rollup=part_sums)
        chain.absorb(sums.finish())  # a cycle's records never span two parts
        self.queries.append(f"archive part {name} (records)")
        if chain.first_seq is None and result.first_seq is not None:
            chain.first_seq, chain.first_prev = result.first_seq, result.first_prev_hash
            chain.first_where = name
        return result

    def read_sealed(self, p: Part, s: Seal, chain: _Chain) -> bool:
        """A part across the period's edge whose seal the key proves, its bytes hashed as
        read and found to be the sealed ones: the period's share of its records added up
        without checking each record's hash again (the report that does not hash parts:
        the capacity report). False, having added nothing, when the bytes are not the
        sealed ones (the part is then read and verified record by record)."""
        data = p.path.read_bytes()
        if hashlib.sha256(data).hexdigest() != s.part_sha256:
            return False
        if p.path.name.endswith(".gz"):
            data = gzip.decompress(data)
        sums = Rollup(self.bin_ns)
        on_record = self._recorder(p.path.name, chain, sums)
        loads = orjson.loads
        for line in data.splitlines():
            if line:
                on_record(p, loads(line))
        chain.absorb(sums.finish())
        self.queries.append(f"archive part {p.path.name} (sealed: its records, the "
                            "period's share)")
        return True

    def _recorder(self, name: str, chain: _Chain, sums: Rollup
                  ) -> Callable[[Part, dict[str, Any]], None]:
        start_ns, end_ns = self.start_ns, self.end_ns

        def on_record(_part: Part, rec: dict[str, Any]) -> None:
            # a record accounts for (t - elapsed, t]: it is the period's as far as that
            # interval lies in (start, end]; one that straddles an edge is split by time
            t, seq = rec.get("time_ns"), rec.get("seq")
            if type(t) is not int or type(seq) is not int:
                return
            if t <= start_ns:
                chain.start = f"seq {seq} ({name}, {_when(t)})"
                chain.proven_before = True
            else:
                if t > end_ns and chain.end is None:
                    chain.end = f"seq {seq} ({name}, {_when(t)})"
                if t - elapsed_ns(rec) >= end_ns:
                    return
                if t <= end_ns:
                    if chain.first_in is None:
                        chain.first_in = t
                    chain.last_in = t
                sums.add(share(rec, start_ns, end_ns))
                if t > end_ns:
                    return
            chain.last_ns, chain.last_seq = t, seq

        return on_record


def _sealed_records(p: Part, s: Seal, bin_ns: int) -> Rollup | None:
    """The records of a sealed part wholly inside the period, added up per bin, when the
    file's bytes are the ones its seal names (None when they are not: the part is then
    read and verified record by record)."""
    data = p.path.read_bytes()
    if hashlib.sha256(data).hexdigest() != s.part_sha256:
        return None
    if p.path.name.endswith(".gz"):
        data = gzip.decompress(data)
    sums = Rollup(bin_ns)
    add, loads = sums.add, orjson.loads
    for line in data.splitlines():
        if line:
            add(loads(line))
    return sums.finish()


def _follow(r: _Reader, chain: _Chain, p: Part, s: Seal, prev: tuple[int, str] | None) -> None:
    """Fast: the chain from the part before to this sealed one, and inside it, from its
    seal alone."""
    first, last = s.first_seq, s.last_seq
    if first is None or last is None:
        return
    restart = any(seq == first for seq, _lo, _hi in s.restarts)
    if prev is not None:
        if first != prev[0] + 1:
            chain.gaps.append(f"{chain.name}: seq {prev[0] + 1}..{first - 1} missing before "
                              f"{p.path.name}")
        elif s.first_prev_hash != prev[1] and not (restart and s.first_prev_hash == ZERO_HASH):
            r.v.problem("chain_break", p.path.name, f"its first record does not follow seq "
                        f"{prev[0]}, the last of the part before it", stream=chain.name,
                        seq=first)
    elif chain.first_seq is None:
        chain.first_seq, chain.first_prev, chain.first_where = (
            first, s.first_prev_hash, p.path.name)
    if s.records != last - first + 1 or s.unreadable:
        chain.gaps.append(f"{p.path.name}: its seal says {s.records} record(s) for seq "
                          f"{first}..{last}: {last - first + 1 - s.records} missing")


def _series(r: _Reader, host: str, stream: str, parts: list[Part]) -> _Chain:
    """Bill one host's stream and prove it complete for the period (see the module)."""
    chain = _Chain(host, stream, r.rollup)
    expect = (host, stream)
    v = r.v
    # From the names alone: a part before the period and one after it (a part of day D
    # holds records closing intervals of D; parts written before that rule, and records
    # whose interval reaches back over midnight, can be a day off: a day's margin).
    lo, hi = 0, len(parts) - 1
    for i, p in enumerate(parts):
        if _day_start_ns(p.day) + 2 * _DAY_NS <= r.start_ns:
            lo = i
    for i in range(len(parts) - 1, -1, -1):
        if _day_start_ns(parts[i].day) > r.end_ns + _DAY_NS:
            hi = i
    # the seal rules are audit verify's (SeriesSeals): from the window's first part on,
    # its prev_seal checked against the seal before it
    before_seal: str | None = ZERO_DIGEST
    if lo > 0:
        sp = parts[lo - 1].seal_path
        before_seal = file_sha256(sp)[0] if sp.exists() else None
    seals = SeriesSeals(v, r.key, host, stream, prev_seal=before_seal,
                        number=parts[lo].number if lo > 0 else None, hash_parts=r.hash_parts)
    prev: tuple[int, str] | None = None  # (seq, hash) where the chain stands
    for p in parts[lo:hi + 1]:
        size = p.path.stat().st_size
        verdict = seals.check(p, newest=p is parts[-1])
        s, ok = verdict.seal, verdict.ok
        if s is not None:
            r.inputs[p.path.name] = s.part_sha256 if ok else file_sha256(p.path)[0]
            r.inputs[s.path.name] = s.digest
        first_t = s.first_time_ns if ok and s is not None else None
        last_t = s.last_time_ns if ok and s is not None else None
        # what the part's records account for: (first_start, last_t]
        first_start = s.first_start_ns if ok and s is not None else None
        before = last_t is not None and last_t <= r.start_ns
        after = first_start is not None and first_start >= r.end_ns
        inside = (first_start is not None and last_t is not None
                  and first_start >= r.start_ns and last_t <= r.end_ns)
        # only a seal the key proves is billed or followed without reading its part
        # (or, asked to, an unkeyed trail's: the bill then says it is unverified)
        usable = verdict.authentic or (r.trust_unkeyed and ok)
        binned = None
        if (s is not None and verdict.authentic and not r.verify_records and inside
                and r.bin_ns != _DAY_NS):
            # bins shorter than a day: the seal's sums are per day, so the part's records
            # are added up, but its bytes are the ones the key-proven seal names (their
            # SHA-256 checked again as read): no record-by-record chain check is needed
            binned = _sealed_records(p, s, r.bin_ns)
        if (s is not None and usable and not r.verify_records
                and (before or after or (inside and (r.bin_ns == _DAY_NS
                                                     or binned is not None)))):
            if not verdict.authentic:
                r.trusted += 1
            _follow(r, chain, p, s, prev)
            if s.last_seq is not None and s.last_hash is not None:
                prev = (s.last_seq, s.last_hash)
            if before:
                chain.start = f"seq {s.last_seq} ({p.path.name}, {_when(last_t)})"
                chain.proven_before = True
            elif after:
                chain.end = chain.end or f"seq {s.first_seq} ({p.path.name}, {_when(first_t)})"
            elif binned is not None:
                chain.absorb(binned)
                r.queries.append(f"archive part {p.path.name} (sealed: its records, by bin)")
                chain.first_in = first_t if chain.first_in is None else chain.first_in
                chain.last_in = last_t
            else:
                chain.absorb(s.rollup())
                r.queries.append(f"archive part {p.path.name} (sealed: its rollup)")
                chain.first_in = first_t if chain.first_in is None else chain.first_in
                chain.last_in = last_t
            if not after:
                chain.last_ns, chain.last_seq = last_t, s.last_seq
            r.advance(size)
            if after:
                break
            continue
        # across an edge of the period, for a report that does not hash parts: the
        # records of a key-proven seal's part, its chain followed from the seal
        if (s is not None and verdict.authentic and not r.verify_records
                and not r.hash_parts and not (before or after or inside)
                and r.read_sealed(p, s, chain)):
            _follow(r, chain, p, s, prev)
            if s.last_seq is not None and s.last_hash is not None:
                prev = (s.last_seq, s.last_hash)
            r.advance(size)
            continue
        # record by record, the chain going on from where it stands; a seal is checked
        # against the records as audit verify checks it
        if prev is not None and v.chain_end(host, stream) != prev:
            v.continue_chain(host, stream, prev[0], prev[1], p.path.name)
        part_sums = Rollup() if s is not None and (
            not verdict.authentic or r.verify_records) else None
        result = r.read(p, chain, live=p is parts[-1], expect=expect, part_sums=part_sums)
        if s is None:
            r.inputs[p.path.name] = file_sha256(p.path)[0]
        else:
            compare_seal(v, result, s)
            if part_sums is not None and not result.damaged:
                seals.rollup(s, part_sums)
        if result.records:
            end = v.chain_end(host, stream)
            if end is not None:
                prev = end
        r.advance(size)
        if after:
            break
    v.forget(host, stream)
    if not chain.proven_before and (chain.first_in is not None or chain.end is not None):
        if chain.first_seq == 1 and chain.first_prev == ZERO_HASH:
            chain.start = f"seq 1, the start of its chain ({chain.first_where})"
        elif chain.first_seq is not None:
            chain.gaps.append(
                f"{chain.name}: the archive holds no record of it before the period: its "
                f"first here is seq {chain.first_seq} ({chain.first_where}), so seq "
                f"1..{chain.first_seq - 1} are not in the archive (a part before the "
                "period is missing or was removed)")
    return chain


def _legacy(r: _Reader, parts: list[Part], newest: Part) -> Rollup:
    """Legacy parts of the period's days and the day before, record by record."""
    first_day = day_of(r.start_ns) - dt.timedelta(days=1)
    last_day = day_of(max(r.start_ns, r.end_ns))
    seen_before: set[str] = set()
    first_seen: dict[str, tuple[int, str]] = {}
    rollup = Rollup()
    for p in parts:
        if not first_day <= p.day <= last_day:
            continue

        def note(_p: Part, rec: dict[str, Any], part: Part = p) -> None:
            t, seq = rec.get("time_ns"), rec.get("seq")
            host, stream = rec.get("host"), rec.get("stream")
            if type(t) is not int or type(seq) is not int or not isinstance(stream, str):
                return
            name = f"{stream}@{host}" if isinstance(host, str) and host else stream
            first_seen.setdefault(name, (seq, part.path.name))
            if t <= r.start_ns:
                seen_before.add(name)
            elif t <= r.end_ns:
                rollup.add(rec)

        read_part(r.v, p, expect=None, live=p is newest, on_record=note)
        r.queries.append(f"archive part {p.path.name} (records)")
        r.inputs[p.path.name] = file_sha256(p.path)[0]
        r.advance(p.path.stat().st_size)
    for name, (seq, where) in sorted(first_seen.items()):
        if name not in seen_before and seq != 1:
            r.notes.append(f"{name}: the (legacy) archive holds no record of it before the "
                           f"period: its first here is seq {seq} ({where}), so seq "
                           f"1..{seq - 1} are not proven present")
    return rollup


def read_archive(
    req: Request,
    archive_dir: Path,
    key: bytes | None = None,
    progress: Progress | None = None,
) -> SourceData:
    """Bill the period from the archive and prove it complete (see the module).

    `key`: the HMAC key the records were chained with (None: plain SHA-256).
    `progress(done, total)` is called as parts are done, in bytes of the part files.
    Raises ArchiveRefused when the directory cannot be read, holds no part for the
    period, does not verify (unless `req.allow_unverified`), has gaps (unless
    `req.allow_gaps`) or holds no usage for the period.
    """
    if not archive_dir.is_dir():
        raise ArchiveRefused(archive_dir, ["not a directory (is --config's archive right?)"])
    all_parts = list_parts(archive_dir)
    start_ns, end_ns = _ns(req.start), _ns(req.end)
    first, last = day_of(start_ns), day_of(max(start_ns, end_ns))
    if not any(first <= p.day <= last for p in all_parts):
        raise ArchiveRefused(archive_dir, [
            f"no archive part for {req.start.isoformat()} .. {req.end.isoformat()} "
            "(files <prefix>_<host>_<stream>_YYYY-MM-DD[.N].jsonl[.gz])"])
    legacy, series = group_series(all_parts)
    r = _Reader(req, key, progress, sum(p.path.stat().st_size for p in all_parts))
    if legacy:
        r.rollup.merge(_legacy(r, legacy, all_parts[-1]).finish(), per_gpu=False)
    chains = [_series(r, host, stream, sparts)
              for (_prefix, host, stream), sparts in series.items()]
    if req.witness is not None:
        try:
            witnessed = witness.heads(req.witness)
        except witness.WitnessUnavailable as exc:
            raise ArchiveRefused(archive_dir, [str(exc)]) from None
        for f in witness.check(archive_dir, witnessed):
            r.v.problem(f.kind, f.where, f.detail, stream=f.stream, seq=f.seq)
        r.queries.append(f"witness {req.witness}: {len(witnessed)} chain head(s)")
    rollup = r.rollup
    return _finish(r, req, archive_dir, chains, rollup)


def _finish(r: _Reader, req: Request, archive_dir: Path, chains: list[_Chain],
            rollup: Rollup) -> SourceData:
    report = r.v.report()
    gaps: list[str] = [*r.notes]
    unverified: list[str] = []
    for p in report.problems:
        (gaps if p.kind in GAP_KINDS else unverified).append(p.render())
    hidden = sum(report.counts.values()) - len(report.problems)
    if hidden > 0:
        unverified.append(f"... {hidden} more not listed")
    period_ns = r.end_ns - r.start_ns
    comp = Completeness()
    for c in chains:
        gaps += c.gaps
        if c.first_in is None and c.start is None:
            continue  # begins after the period: not this bill's
        if c.first_in is None:
            if c.last_ns is not None and r.start_ns - period_ns < c.last_ns <= r.start_ns:
                comp.silent.append(f"stream {c.stream} of host {c.host}: records in the "
                                   "period before this one, none in it (its last: seq "
                                   f"{c.last_seq} at {_when(c.last_ns)})")
            continue
        comp.chains.append(_proof(c))
    comp.gaps = gaps
    comp.allowed = bool(gaps) and req.allow_gaps
    _inventory(r, chains, comp, req.include_simulated)
    problems: list[str] = []
    if unverified and not req.allow_unverified:
        problems += ["the hash chain does not verify (pass --allow-unverified to bill from "
                     "it anyway, marked unverified)", *unverified]
    if gaps and not req.allow_gaps:
        problems += ["records are missing: the bill cannot be proven complete (pass "
                     "--allow-gaps to bill anyway, stamped incomplete everywhere)", *gaps]
    if problems:
        raise ArchiveRefused(archive_dir, problems)
    data = SourceData(source="archive", start=req.start, end=req.end,
                      simulated_included=req.include_simulated)
    data.inputs["archive"] = str(archive_dir)
    data.inputs.update(r.inputs)
    data.queries.extend(r.queries)
    if r.trusted:
        unverified.append(
            f"{r.trusted} sealed part(s) billed or followed from their seals without reading "
            "them, and the trail is not keyed: nothing proves those seals' sums "
            "(--trust-unkeyed-seals); `audit verify` checks them against the records")
    data.verified = not unverified
    data.verification_problems = unverified
    data.completeness = comp
    _to_source(rollup, data, req.include_simulated)
    if not data.fleet and not data.usage:
        n = rollup.records
        why = (f"{n} usage record(s) in the period, all simulated (--include-simulated "
               "bills them)" if n and rollup.simulated == n
               else f"{n} usage record(s) in the period")
        raise ArchiveRefused(archive_dir, [
            f"no usage for {req.start.isoformat()} .. {req.end.isoformat()}: {why}"])
    _notes(data, rollup, req, all_read=r.key is None and not r.trust_unkeyed)
    return data


def _proof(c: _Chain) -> str:
    name = f"stream {c.stream} of host {c.host}"
    if c.gaps:
        return f"{name}: NOT complete ({len(c.gaps)} gap(s))"
    if c.start is None:
        return f"{name}: not proven from before the period"
    if c.end is None:
        return (f"{name}: continuous from {c.start} to its newest record, seq "
                f"{c.last_seq} at {_when(c.last_ns)}; the period is still open (no record "
                "after it yet)")
    return f"{name}: continuous from {c.start} to {c.end}"


def _inventory(r: _Reader, chains: list[_Chain], comp: Completeness,
               include_sim: bool) -> None:
    """GPU-hours the GPUs each host's records name in the period stand for over the time
    its chain covers (from the period's start when a record before it was seen, else its
    first record; to the period's end when a record after it was seen, else its newest),
    against the up + down GPU-hours its records account for."""
    expected = observed = 0.0
    hosts: set[str] = set()
    gpus: set[str] = set()
    for c in chains:
        if c.first_in is None:
            continue
        flags = (False, True) if include_sim else (False,)
        mine = set().union(*(c.gpus.get(sim, set()) for sim in flags))
        if not mine:
            continue
        hosts.add(c.host)
        gpus |= {f"{c.host}/{u}" for u in mine}
        frm = r.start_ns if c.proven_before else c.first_in
        to = r.end_ns if c.end is not None else (c.last_in or c.first_in)
        expected += len(mine) * max(0, to - frm) / 1e9
        observed += sum(c.observed.get(sim, 0.0) for sim in flags)
    comp.inventory_gpus, comp.inventory_hosts = len(gpus), len(hosts)
    comp.expected_gpu_hours = expected / 3600.0
    comp.observed_gpu_hours = observed / 3600.0


def _to_source(rollup: Rollup, data: SourceData, include_sim: bool) -> None:
    for (day, sim, model, _uuid, user, project), h in rollup.holders.items():
        if sim and not include_sim:
            continue
        owner: Owner = (user, project)
        # allocation: not known (records carry none), so left 0 and written empty
        u = Usage(used_gpu_seconds=h[0],
                  charged_gpu_seconds=h[1], busy_gpu_seconds=h[2],
                  idle_held_gpu_seconds=h[3], energy_joules=h[4], power_energy_joules=h[5])
        data.usage.setdefault((owner, model), Usage()).add(u)
        data.days.setdefault(day, ({}, Fleet()))[0].setdefault(owner, Usage()).add(u)
    for (day, sim, model, _uuid), f in rollup.fleet.items():
        if sim and not include_sim:
            continue
        fl = Fleet(gpu_seconds=f[0], down_gpu_seconds=f[1], held_gpu_seconds=f[2],
                   idle_held_gpu_seconds=f[3], busy_gpu_seconds=f[4], energy_joules=f[5],
                   power_energy_joules=f[6])
        data.fleet.setdefault(model, Fleet()).add(fl)
        data.days.setdefault(day, ({}, Fleet()))[1].add(fl)
        data.model_days.setdefault(day, {}).setdefault(model, Fleet()).add(fl)
    data.simulated_excluded = 0 if include_sim else rollup.simulated


def _notes(data: SourceData, rollup: Rollup, req: Request, *, all_read: bool) -> None:
    if req.include_simulated and rollup.simulated:
        data.notes.append(
            f"SIMULATED: {rollup.simulated} of the {rollup.records} usage record(s) in the "
            "period are simulated (simulated: true, from the GPU simulator) and are billed "
            "(--include-simulated): not a bill for real hardware")
    data.allocation_known = False
    if not (req.hash_sealed_parts or req.verify_records):
        data.notes.append(
            "archive: each sealed part's size was checked against its seal, not its SHA-256 "
            "(the sums are the key-proven seals'; `gpu-audit audit verify` checks the parts' "
            "bytes)")
    data.notes.append(
        "archive: allocated GPU-hours not known (audit records carry no allocation, only "
        "the owners of running processes): the column is empty")
    sealed = sum(1 for q in data.queries if q.endswith("(sealed: its rollup)"))
    read = sum(1 for q in data.queries if q.endswith("(records)"))
    data.notes.append(
        f"archive: {rollup.records} usage record(s) in the period, from {sealed} sealed "
        f"part(s) (their rollups) and {read} part(s) read record by record")
    if all_read:
        data.notes.append(
            "archive: the trail is not keyed (audit.hmac_key_file), so no seal proves its "
            "sums: every part was read and added up record by record, each seal checked "
            "against its records; \"verified\" means the chain and seals are consistent, "
            "not who wrote them (docs/AUDIT.md, \"What 'verified' means\")")
    sources = rollup.energy_sources
    data.notes.append(
        "archive: energy of " + ", ".join(
            f"{n} GPU interval(s) from {_ENERGY_SOURCES.get(k, k)}"
            for k, n in sorted(sources.items())) if sources else
        "archive: no GPU interval with energy")
    if rollup.mig_instance_records:
        data.notes.append(
            f"archive: {rollup.mig_instance_records} GPU record(s) of MIG instances "
            "(MIG-... uuids) added no fleet time or energy (their parent GPU's record has it)")
    comp = data.completeness
    if comp is not None and comp.gaps:
        data.notes.append(f"INCOMPLETE: {len(comp.gaps)} gap(s) in the trail, billed with "
                          "--allow-gaps (see completeness)")
