"""`audit verify`: prove a trail of audit records complete, in order and unmodified.

Per stream it checks: `seq` gaps (records missing), the same `seq` twice, the same `id`
twice under different seqs (a sample chained twice), `seq` going backwards (reordered),
a `hash` that does not match the record's content (modified), a `prev_hash` that does not
match the hash of the previous seq (chain break: a record altered and re-hashed, or
replaced), and records that are not JSON or of no known schema (gpu-audit.record/1 or
/2). Every problem names where it is (line, spool offset or record position), the
stream, seq and id.

Versions: the hash of a record is computed the same way whatever its schema, so a
stream whose producer was upgraded (v1 records, then v2 records) is one chain, verified
across the change; a v1 record after a v2 one (a downgrade) is accepted the same way.

Memory stays small on month-long trails: seq bookkeeping keeps only the gaps, the chain
check keeps only unmatched neighbours, and duplicate ids are looked for within a sliding
window of recent records (duplicate seqs are found exactly).

This module only reads; it must never modify, reorder or "repair" a trail, and never
print an HMAC key.
"""

from __future__ import annotations

import bisect
import gzip
import re
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gpu_audit.archive import list_parts, parse_name, read_lines
from gpu_audit.audit.canonical import KNOWN_SCHEMAS, ZERO_HASH, expected_hash
from gpu_audit.audit.ports import SpoolReaderPort

MAX_LISTED = 1000
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
ID_WINDOW = 1_000_000


def _chain_name(rec: Mapping[str, Any], stream: str) -> str:
    """The chain a record belongs to: seq and prev_hash run per host and stream
    (docs/AUDIT.md), so two nodes' default `exporter` streams read back from one sink are
    two chains, not one broken one. Named `stream@host`."""
    host = rec.get("host")
    return f"{stream}@{host}" if isinstance(host, str) and host else stream


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding: what is wrong, and exactly where."""

    kind: str  # invalid_json | bad_schema | modified | chain_break | gap | duplicate_seq
    #            | duplicate_id | reordered
    where: str  # "line 12", "offset 4096", "record 7"
    stream: str | None
    seq: int | None
    id: str | None
    detail: str

    def render(self) -> str:
        ident = []
        if self.stream is not None:
            ident.append(f"stream {self.stream}")
        if self.seq is not None:
            ident.append(f"seq {self.seq}")
        if self.id is not None:
            ident.append(f"id {self.id}")
        suffix = f" ({', '.join(ident)})" if ident else ""
        return f"{self.where}: {self.kind}: {self.detail}{suffix}"


@dataclass(slots=True)
class StreamSummary:
    first_seq: int
    last_seq: int
    records: int


@dataclass(slots=True)
class VerifyReport:
    """The outcome: `.ok`, every problem (the first MAX_LISTED listed), counts by kind."""

    records: int = 0
    problems: list[Problem] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    streams: dict[str, StreamSummary] = field(default_factory=dict)
    source: str = ""

    @property
    def ok(self) -> bool:
        return not self.counts

    def render(self) -> str:
        total = sum(self.counts.values())
        head = f"audit verify{' ' + self.source if self.source else ''}: {self.records} records"
        head += f" in {len(self.streams)} stream(s): "
        head += "OK" if self.ok else f"FAILED, {total} problem(s)"
        lines = [head]
        for name in sorted(self.streams):
            s = self.streams[name]
            lines.append(f"  stream {name}: seq {s.first_seq}..{s.last_seq}, {s.records} records")
        if self.counts:
            lines.append(
                "  by kind: " + ", ".join(f"{k}={n}" for k, n in sorted(self.counts.items()))
            )
        lines.extend(f"  {p.render()}" for p in self.problems)
        if total > len(self.problems):
            lines.append(f"  ... {total - len(self.problems)} more not listed")
        if self.counts.get("modified", 0) == self.records and self.records:
            lines.append("  hint: every record fails its hash: wrong or missing --hmac-key-file?")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class _Entry:
    """The chain-relevant fields of one record, and where it was found."""

    stream: str
    seq: int
    hash: str
    prev_hash: str
    id: str
    where: str


class _Stream:
    """Per-stream bookkeeping, O(gaps + window) memory."""

    def __init__(self, name: str, complete: bool) -> None:
        self.name = name
        self.low: int | None = 1 if complete else None
        self.high = 0
        self.count = 0
        self.min_seen: int | None = None
        # Sorted, disjoint [lo, hi] ranges of seqs below `high` not seen yet, with the
        # position of the record that revealed each gap.
        self.gap_lo: list[int] = []
        self.gaps: list[tuple[int, int, str]] = []
        self.succ: dict[int, tuple[str, str]] = {}  # seq -> (hash, where): awaiting seq+1
        self.pred: dict[int, tuple[str, str]] = {}  # seq -> (prev_hash, where): awaiting seq-1
        self.ids: dict[str, str] = {}
        self.id_order: deque[str] = deque()

    def add_gap(self, lo: int, hi: int, where: str) -> None:
        if lo > hi:
            return
        i = bisect.bisect_left(self.gap_lo, lo)
        self.gap_lo.insert(i, lo)
        self.gaps.insert(i, (lo, hi, where))

    def take_from_gap(self, s: int) -> bool:
        """Remove `s` from the gaps; True when it was missing (so it arrives late)."""
        i = bisect.bisect_right(self.gap_lo, s) - 1
        if i < 0:
            return False
        lo, hi, where = self.gaps[i]
        if not lo <= s <= hi:
            return False
        del self.gap_lo[i], self.gaps[i]
        if s + 1 <= hi:
            self.add_gap(s + 1, hi, where)
        if lo <= s - 1:
            self.add_gap(lo, s - 1, where)
        return True


class Verifier:
    """Feed records in trail order; `report()` at the end.

    complete=True: every stream must start at seq 1 (a full export). complete=False: a
    stream may start anywhere (a spool whose shipped segments are gone, a time range read
    back from a sink); what is missing before the first record seen is not a gap.
    """

    def __init__(
        self,
        *,
        hmac_key: bytes | None,
        complete: bool = True,
        id_window: int = ID_WINDOW,
        source: str = "",
    ) -> None:
        self._key = hmac_key
        self._complete = complete
        self._id_window = id_window
        self._streams: dict[str, _Stream] = {}
        self.report_ = VerifyReport(source=source)

    def _problem(
        self,
        kind: str,
        where: str,
        detail: str,
        *,
        stream: str | None = None,
        seq: int | None = None,
        rid: str | None = None,
    ) -> None:
        r = self.report_
        r.counts[kind] += 1
        if len(r.problems) < MAX_LISTED:
            r.problems.append(Problem(kind, where, stream, seq, rid, detail))

    def feed(self, item: Mapping[str, Any] | bytes | str, where: str) -> None:
        self.report_.records += 1
        if isinstance(item, bytes | str):
            try:
                rec = orjson.loads(item)
            except orjson.JSONDecodeError as exc:
                self._problem("invalid_json", where, f"not a JSON record: {exc}")
                return
        else:
            rec = item
        if not isinstance(rec, Mapping):
            self._problem("invalid_json", where, "not a JSON object")
            return
        stream, seq, h, prev, rid = (
            rec.get("stream"),
            rec.get("seq"),
            rec.get("hash"),
            rec.get("prev_hash"),
            rec.get("id"),
        )
        rid_s = rid if isinstance(rid, str) else None
        schema = rec.get("schema")
        if not isinstance(schema, str) or schema not in KNOWN_SCHEMAS:
            self._problem(
                "bad_schema", where,
                f"schema is {schema!r}, expected one of {', '.join(sorted(KNOWN_SCHEMAS))}",
                stream=stream if isinstance(stream, str) else None,
                seq=seq if isinstance(seq, int) else None, rid=rid_s,
            )
            return
        if not (
            isinstance(stream, str)
            and isinstance(seq, int)
            and not isinstance(seq, bool)
            and isinstance(h, str)
            and isinstance(prev, str)
            and _HEX64.match(h) is not None
            and _HEX64.match(prev) is not None
            and rid_s is not None
        ):
            self._problem(
                "bad_schema", where,
                "stream, seq, id, hash or prev_hash missing or mistyped "
                "(hashes are 64 lowercase hex digits)",
                stream=stream if isinstance(stream, str) else None, rid=rid_s,
            )
            return
        if expected_hash(rec, self._key) != h:
            self._problem(
                "modified", where, "hash does not match the record's content",
                stream=_chain_name(rec, stream), seq=seq, rid=rid_s,
            )
        self._sequence(_Entry(_chain_name(rec, stream), seq, h, prev, rid_s, where))

    def _sequence(self, e: _Entry) -> None:
        name, s, rid, where = e.stream, e.seq, e.id, e.where
        st = self._streams.get(name)
        if st is None:
            st = self._streams[name] = _Stream(name, self._complete)
        st.count += 1
        st.min_seen = s if st.min_seen is None else min(st.min_seen, s)
        if st.low is None:  # first record of a stream that may start anywhere
            st.low, st.high = s, s
        elif s > st.high:
            st.add_gap(st.high + 1, s - 1, where)
            st.high = s
        elif s < st.low:
            self._problem("reordered", where, f"seq {s} after seq {st.high}",
                          stream=name, seq=s, rid=rid)
            st.add_gap(s + 1, st.low - 1, where)
            st.low = s
        elif st.take_from_gap(s):
            self._problem("reordered", where, f"seq {s} after seq {st.high}",
                          stream=name, seq=s, rid=rid)
        else:
            self._problem(
                "duplicate_seq", where, f"seq {s} appears again", stream=name, seq=s, rid=rid
            )
            return
        first = self._ids_seen(st, rid, where)
        if first is not None:
            self._problem(
                "duplicate_id", where, f"id already used at {first} (sample chained twice)",
                stream=name, seq=s, rid=rid,
            )
        self._link(st, e)

    def _ids_seen(self, st: _Stream, rid: str, where: str) -> str | None:
        first = st.ids.get(rid)
        if first is not None:
            return first
        st.ids[rid] = where
        st.id_order.append(rid)
        if len(st.id_order) > self._id_window:
            st.ids.pop(st.id_order.popleft(), None)
        return None

    def _link(self, st: _Stream, e: _Entry) -> None:
        s, h, prev, rid, where = e.seq, e.hash, e.prev_hash, e.id, e.where
        if s == 1:
            if prev != ZERO_HASH:
                self._problem(
                    "chain_break", where, "first record of the stream has a non-zero prev_hash",
                    stream=st.name, seq=s, rid=rid,
                )
        elif s - 1 in st.succ:
            before_hash, before_where = st.succ.pop(s - 1)
            if before_hash != prev:
                self._problem(
                    "chain_break", where,
                    f"prev_hash is not the hash of seq {s - 1} at {before_where}: "
                    "that record was altered and re-hashed, or replaced",
                    stream=st.name, seq=s, rid=rid,
                )
        else:
            st.pred[s] = (prev, where)
        after = st.pred.pop(s + 1, None)
        if after is not None:
            if after[0] != h:
                self._problem(
                    "chain_break", after[1],
                    f"prev_hash is not the hash of seq {s} at {where}: "
                    "that record was altered and re-hashed, or replaced",
                    stream=st.name, seq=s + 1,
                )
        else:
            st.succ[s] = (h, where)

    def report(self) -> VerifyReport:
        r = self.report_
        for name, st in self._streams.items():
            for lo, hi, where in st.gaps:
                what = f"seq {lo}" if lo == hi else f"seq {lo}..{hi} ({hi - lo + 1} records)"
                self._problem(
                    "gap", where, f"{what} missing before this record", stream=name, seq=lo
                )
            r.streams[name] = StreamSummary(
                first_seq=st.min_seen or 0, last_seq=st.high, records=st.count
            )
        return r


def verify_records(
    records: Iterable[Mapping[str, Any] | bytes],
    *,
    hmac_key: bytes | None,
    complete: bool = True,
) -> VerifyReport:
    """Verify records given in trail order; positions are "record N" (1-based)."""
    v = Verifier(hmac_key=hmac_key, complete=complete)
    for i, rec in enumerate(records, 1):
        v.feed(rec, f"record {i}")
    return v.report()


def jsonl_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with open(path, "rb") as raw:
        magic = raw.read(2)
    opener: Any = gzip.open if magic == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        for n, line in enumerate(f, 1):
            stripped = line.strip()
            if stripped:
                yield n, stripped


def verify_jsonl(
    path: Path, hmac_key: bytes | None, *, complete: bool = True
) -> VerifyReport:
    """Verify a JSON Lines export (plain or gzip, detected by content); problems name lines.

    A line that is not valid JSON is reported with its number, never a crash. Raises
    OSError only when the file itself cannot be read.
    """
    v = Verifier(hmac_key=hmac_key, complete=complete, source=str(path))
    for n, line in jsonl_lines(path):
        v.feed(line, f"line {n}")
    return v.report()


def verify_spool(
    reader: SpoolReaderPort, hmac_key: bytes | None, *, complete: bool = False, source: str = ""
) -> VerifyReport:
    """Verify every record a spool reader returns, in spool order; problems name offsets.

    complete=False by default: segments already shipped and deleted are not gaps.
    """
    v = Verifier(hmac_key=hmac_key, complete=complete, source=source)
    pos = 0
    while True:
        result = reader.read(pos, 4096, 16 * 1024 * 1024)
        for off, payload in result.entries:
            v.feed(payload, f"offset {off}")
        if not result.entries or result.next_offset <= pos:
            return v.report()
        pos = result.next_offset


def verify_spool_dir(
    path: Path, hmac_key: bytes | None, *, complete: bool = False
) -> VerifyReport:
    """Verify the audit records in a spool directory (read with gpu_audit.spool)."""
    from gpu_audit.spool import SpoolReader  # noqa: PLC0415 - keeps verify usable alone

    with SpoolReader(path) as reader:
        return verify_spool(reader, hmac_key, complete=complete, source=str(path))


def verify_readback(
    records: Iterable[Mapping[str, Any] | bytes],
    *,
    hmac_key: bytes | None,
    source: str = "",
) -> VerifyReport:
    """Verify records read back from a sink for a time range, in any order.

    They are sorted by (stream, seq) first, so order is not judged (sinks do not keep
    it); seqs before the first one in range are not gaps. Positions are "record N" in
    the order the sink returned them.
    """
    parsed: list[tuple[str, int, int, Mapping[str, Any] | bytes]] = []
    v = Verifier(hmac_key=hmac_key, complete=False, source=source)
    for i, item in enumerate(records, 1):
        rec: Any = item
        if isinstance(item, bytes | str):
            try:
                rec = orjson.loads(item)
            except orjson.JSONDecodeError:
                v.feed(item, f"record {i}")  # reported as invalid_json
                continue
        stream = rec.get("stream") if isinstance(rec, Mapping) else None
        seq = rec.get("seq") if isinstance(rec, Mapping) else None
        parsed.append(
            (
                stream if isinstance(stream, str) else "",
                seq if isinstance(seq, int) else -1,
                i,
                rec,
            )
        )
    parsed.sort(key=lambda t: (t[0], t[1], t[2]))
    for _stream, _seq, i, rec in parsed:
        v.feed(rec, f"record {i}")
    return v.report()


def verify_archive_dir(path: Path, key: bytes | None) -> VerifyReport:
    """An archive directory as one trail, in the order it was written.

    The archive's parts come in archive order (day, then part number: `.2` before `.10`,
    the base file before `.1`). The newest part's last line, when it has no newline yet,
    is a line still being written and is left out. Other JSON Lines files follow in name
    order.
    """
    v = Verifier(hmac_key=key, complete=True, source=str(path))
    parts = list_parts(path)
    for line in read_lines(path, parts=parts):
        if line.complete or line.part != parts[-1]:
            v.feed(line.raw, line.where)
    others = sorted(p for p in path.iterdir()
                    if p.name.endswith((".jsonl", ".jsonl.gz")) and not p.name.startswith(".")
                    and parse_name(p.name) is None)
    for f in others:
        for n, line_raw in jsonl_lines(f):
            v.feed(line_raw, f"{f.name} line {n}")
    return v.report()
