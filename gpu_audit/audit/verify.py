"""`audit verify`: prove a trail of audit records complete, in order and unmodified.

Per stream it checks: `seq` gaps (records missing), the same `seq` twice, the same `id`
twice under different seqs (a sample chained twice), `seq` going backwards (reordered),
a `hash` that does not match the record's content (modified), a `prev_hash` that does not
match the hash of the previous seq (chain break: a record altered and re-hashed, or
replaced), and records that are not JSON or of no known schema (gpu-audit.record/1 or
/2). Every problem names where it is (line, spool offset or record position), the
stream, seq and id.

Versions: the hash of a record is computed the same way whatever its schema, so a
stream whose producer was upgraded (v1 records, then v2 and v3 records) is one chain,
verified across the change; a v1 record after a v2 one (a downgrade) is accepted the same
way. A `chain_restart` record (schema 3: the producer found records after its newest
readable one unreadable in its spool) starts a fresh chain (`prev_hash` zeros) at a seq
past every one it may have issued; the seqs it declares lost are a `gap` only when they
are missing, named as declared.

One path for `audit verify` and chargeback: `Verifier.feed_line` hashes the stored line as
written (the canonical bytes with the `hash` member cut out, exactly what the spec hashes)
and reads `seq`, `prev_hash`, `stream`, `host`, `id` and `schema` without parsing the
record, where the canonical layout allows it: no object or array opens before those
members (every version 3 usage record; events without nested parts). Any other line, and
any line whose stored bytes do not hash (a sink that re-serialised a record), goes
through the full parse (`feed`), which gives the same verdict by the spec's definition.
A part of an archive names its host and stream: a record of another host or stream in it
is `foreign`, with or without an HMAC key.

Memory stays small on month-long trails: seq bookkeeping keeps only the gaps, the chain
check keeps only unmatched neighbours, and duplicate ids are looked for within a sliding
window of recent records (duplicate seqs are found exactly).

This module only reads; it must never modify, reorder or "repair" a trail, and never
print an HMAC key.
"""

from __future__ import annotations

import bisect
import hmac
import re
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any

import orjson

from gpu_audit.archive.reader import PartLines
from gpu_audit.audit.canonical import KNOWN_SCHEMAS, SCHEMA_V1, ZERO_HASH, expected_hash
from gpu_audit.audit.ports import SpoolReaderPort

MAX_LISTED = 1000
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
ID_WINDOW = 1_000_000
ZERO_HASH_B = ZERO_HASH.encode()

Where = str | tuple[str, int]  # a place, or (file, line number): formatted only if needed


def where_text(where: Where) -> str:
    return where if isinstance(where, str) else f"{where[0]} line {where[1]}"


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
    #            | duplicate_id | reordered | foreign | damaged_part | and the archive's
    #            (gpu_audit.archive.verify): bad_seal, part_digest, seal_chain, ...
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

    def to_json(self) -> dict[str, Any]:
        """The report as data (`audit verify --json`): the listed problems, every count."""
        return {
            "source": self.source, "ok": self.ok, "records": self.records,
            "streams": {name: {"first_seq": s.first_seq, "last_seq": s.last_seq,
                               "records": s.records}
                        for name, s in sorted(self.streams.items())},
            "counts": dict(sorted(self.counts.items())),
            "problems": [{"kind": p.kind, "where": p.where, "stream": p.stream,
                          "seq": p.seq, "id": p.id, "detail": p.detail}
                         for p in self.problems],
            "unlisted": sum(self.counts.values()) - len(self.problems),
        }

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
    where: Where
    restart: bool = False  # a chain_restart record: a fresh chain at this seq


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
        self.gaps: list[tuple[int, int, Where]] = []
        self.succ: dict[int, tuple[str, Where]] = {}  # seq -> (hash, where): awaiting seq+1
        self.pred: dict[int, tuple[str, Where]] = {}  # seq -> (prev_hash, where): awaiting seq-1
        self.ids: dict[str, Where] = {}
        self.id_order: deque[str] = deque()
        self.declared: list[tuple[int, int, int]] = []  # chain_restart: (lo, hi, its seq)
        self.last_seq = 0  # of the last record fed (in-order fast path)
        self.last_hash = ""
        self.host = ""  # set by Verifier._chain
        self.stream = name

    def add_gap(self, lo: int, hi: int, where: Where) -> None:
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
        # the last record sequenced: (seq, hash, prev_hash)
        self.last_seq: int | None = None
        self.last_hash: str | None = None
        self.last_prev: str | None = None
        self._by_bytes: dict[tuple[bytes, bytes], _Stream] = {}  # feed_line's chains
        self.fast_lines = 0  # lines feed_line verified without parsing them

    @property
    def hmac_key(self) -> bytes | None:
        """The key records are checked with (seals are checked with it too)."""
        return self._key

    def problem(
        self,
        kind: str,
        where: Where,
        detail: str,
        *,
        stream: str | None = None,
        seq: int | None = None,
        rid: str | None = None,
    ) -> None:
        r = self.report_
        r.counts[kind] += 1
        if len(r.problems) < MAX_LISTED:
            r.problems.append(Problem(kind, where_text(where), stream, seq, rid, detail))

    _problem = problem

    def feed_line(self, raw: bytes, where: Where, expect: tuple[str, str] | None = None,
                  ) -> None:
        """One stored line (canonical JSON with `hash`). `expect`: the (host, stream) of
        the part it is in: a record of another is `foreign`.

        Reads the chain members by position where the canonical layout fixes them
        (sorted keys: `host` directly after `hash`, `seq` directly after `schema`) and no
        object or array opens before `stream`; anything else, and any line whose stored
        bytes do not hash, goes to `feed` (the spec's full parse)."""
        i = raw.find(b',"hash":"')
        if i < 0 or raw[i + 73:i + 83] != b'","host":"':
            self.feed(raw, where, expect)
            return
        h_end = raw.find(b'"', i + 83)
        d = raw.find(b',"id":"', h_end)
        j = raw.find(b',"prev_hash":"', d)
        sc = raw.find(b',"schema":"gpu-audit.record/', j)
        k = sc + 30  # after `,"schema":"gpu-audit.record/N"`
        if (d < 0 or j < 0 or sc < 0 or raw[d + 39] != 34  # '"'
                or raw[j + 78] != 34 or raw[sc + 28] not in b"123" or raw[sc + 29] != 34
                or raw[k:k + 7] != b',"seq":'):
            self.feed(raw, where, expect)
            return
        c_end = raw.find(b",", k + 7)
        m = raw.find(b',"stream":"', c_end - 1)
        if (c_end < 0 or m < 0 or raw.find(b"{", 1, m) >= 0 or raw.find(b"[", 1, m) >= 0):
            self.feed(raw, where, expect)
            return
        m_end = raw.find(b'"', m + 11)
        prev = raw[j + 14:j + 78]
        stored = raw[i + 9:i + 73]
        body = raw[:i] + raw[i + 74:]
        key = self._key
        if key is None:
            ok = sha256(prev + body).hexdigest().encode() == stored
        else:
            ok = hmac.new(key, prev + body, sha256).hexdigest().encode() == stored
        seq_b = raw[k + 7:c_end]
        if not ok or prev == ZERO_HASH_B or not seq_b.isdigit():
            # not stored canonically, modified, a chain's start: the spec's path
            self.feed(raw, where, expect)
            return
        ck = (raw[m + 11:m_end], raw[i + 83:h_end])
        st = self._by_bytes.get(ck)
        if st is None:
            if b"\\" in ck[0] or b"\\" in ck[1]:
                self.feed(raw, where, expect)  # an escaped stream or host name
                return
            st = self._chain(ck[1].decode(), ck[0].decode())
            self._by_bytes[ck] = st
        self.report_.records += 1
        self.fast_lines += 1
        seq = int(seq_b)
        rid = raw[d + 7:d + 39].decode()
        if expect is not None and (st.host, st.stream) != expect:
            self._foreign(st.name, seq, rid, where, expect)
        prev_s, hash_s = prev.decode(), stored.decode()
        before = st.succ.get(seq - 1)
        if (st.low is not None and seq == st.high + 1 and before is not None
                and before[0] == prev_s and not st.pred):
            # the common case, in order and linked: what _sequence would do, inline
            self.last_seq, self.last_hash, self.last_prev = seq, hash_s, prev_s
            st.count += 1
            st.high = seq
            first = st.ids.get(rid)
            if first is not None:
                self._problem("duplicate_id", where,
                              f"id already used at {where_text(first)} (sample chained "
                              "twice)", stream=st.name, seq=seq, rid=rid)
            else:
                st.ids[rid] = where
                st.id_order.append(rid)
                if len(st.id_order) > self._id_window:
                    st.ids.pop(st.id_order.popleft(), None)
            del st.succ[seq - 1]
            st.succ[seq] = (hash_s, where)
            st.last_seq, st.last_hash = seq, hash_s
            return
        self._sequence(_Entry(st.name, seq, hash_s, prev_s, rid, where))

    def _chain(self, host: str, stream: str) -> _Stream:
        name = f"{stream}@{host}" if host else stream
        st = self._streams.get(name)
        if st is None:
            st = self._streams[name] = _Stream(name, self._complete)
        st.host, st.stream = host, stream
        return st

    def _foreign(self, name: str, seq: int, rid: str | None, where: Where,
                 expect: tuple[str, str]) -> None:
        self.problem(
            "foreign", where,
            f"a record of {name} in a part of stream {expect[1]} of host {expect[0]} "
            "(its name and seal say whose chain it holds)", stream=name, seq=seq, rid=rid)

    def feed(self, item: Mapping[str, Any] | bytes | str, where: Where,
             expect: tuple[str, str] | None = None) -> None:
        """One record, parsed (the reference path; `feed_line` falls back to it)."""
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
        name = _chain_name(rec, stream)
        if expected_hash(rec, self._key) != h:
            self._problem(
                "modified", where, "hash does not match the record's content",
                stream=name, seq=seq, rid=rid_s,
            )
        if expect is not None and (rec.get("host"), stream) != expect:
            self._foreign(name, seq, rid_s, where, expect)
        restart = rec.get("event") == "chain_restart" and schema != SCHEMA_V1
        if restart:
            lo, hi = rec.get("lost_from"), rec.get("lost_to")
            if type(lo) is int and type(hi) is int and lo <= hi:
                st = self._streams.get(name)
                if st is None:
                    st = self._streams[name] = _Stream(name, self._complete)
                st.declared.append((lo, hi, seq))
        self._sequence(_Entry(name, seq, h, prev, rid_s, where, restart))

    def forget(self, host: str, stream: str) -> None:
        """Drop a finished chain's duplicate-id window (its summary and its last record
        stay): verifying chains one after another keeps one window in memory."""
        st = self._streams.get(f"{stream}@{host}" if host else stream)
        if st is not None:
            st.ids.clear()
            st.id_order.clear()

    def _sequence(self, e: _Entry) -> None:
        self.last_seq, self.last_hash, self.last_prev = e.seq, e.hash, e.prev_hash
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
                "duplicate_id", where,
                f"id already used at {where_text(first)} (sample chained twice)",
                stream=name, seq=s, rid=rid,
            )
        self._link(st, e)

    def _ids_seen(self, st: _Stream, rid: str, where: Where) -> Where | None:
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
        st.last_seq, st.last_hash = s, h
        if s == 1 or e.restart:
            if prev != ZERO_HASH:
                what = "first record of the stream" if s == 1 else "a chain_restart"
                self._problem(
                    "chain_break", where, f"{what} has a non-zero prev_hash",
                    stream=st.name, seq=s, rid=rid,
                )
            st.succ.pop(s - 1, None)  # a restart does not link to the record before it
        elif s - 1 in st.succ:
            before_hash, before_where = st.succ.pop(s - 1)
            if before_hash != prev:
                self._problem(
                    "chain_break", where,
                    f"prev_hash is not the hash of seq {s - 1} at {where_text(before_where)}: "
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
                    f"prev_hash is not the hash of seq {s} at {where_text(where)}: "
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
                declared = [r for a, b, r in st.declared if a <= hi and lo <= b]
                why = (f"; declared lost by the chain_restart at seq {declared[0]} (its "
                       "producer found them unreadable in its spool)" if declared else "")
                self._problem(
                    "gap", where, f"{what} missing before this record{why}", stream=name,
                    seq=lo)
            if st.count:
                r.streams[name] = StreamSummary(
                    first_seq=st.min_seen or 0, last_seq=st.high, records=st.count
                )
        return r

    def chain_end(self, host: str, stream: str) -> tuple[int, str] | None:
        """(seq, hash) of the last record fed of a chain (None: none fed)."""
        st = self._streams.get(f"{stream}@{host}" if host else stream)
        return (st.last_seq, st.last_hash) if st is not None and st.count else None

    def continue_chain(self, host: str, stream: str, seq: int, hash_: str,
                       where: Where) -> None:
        """Go on with a chain from a record known from elsewhere (a seal, which accounts
        for the seqs up to `seq`): the next record fed must be seq + 1 with prev_hash
        == hash_."""
        name = f"{stream}@{host}" if host else stream
        st = self._streams.get(name)
        if st is None:
            st = self._streams[name] = _Stream(name, False)
            st.low = seq
            st.min_seen = seq + 1
        st.high = max(st.high, seq)
        st.succ = {seq: (hash_, where)}
        st.last_seq, st.last_hash = seq, hash_


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


def jsonl_lines(path: Path, damage: list[str] | None = None) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of a JSON Lines file, plain or gzip (detected by content). A
    gzip file that ends early or is not gzip ends the lines at the last complete one;
    what happened is appended to `damage` (never raised)."""
    with open(path, "rb") as raw:
        magic = raw.read(2)
    reader = PartLines(path, compressed=magic == b"\x1f\x8b")
    for first, lines in reader.chunks():
        for i, line in enumerate(lines):
            stripped = line.strip()
            if stripped:
                yield first + i, stripped
    if reader.torn is not None and reader.torn.strip():
        yield reader.lines + 1, reader.torn.strip()
    if reader.damage is not None and damage is not None:
        damage.append(reader.where_damaged())


def verify_jsonl(
    path: Path, hmac_key: bytes | None, *, complete: bool = True
) -> VerifyReport:
    """Verify a JSON Lines export (plain or gzip, detected by content); problems name lines.

    A line that is not valid JSON is reported with its number, and a damaged gzip file
    (truncated) as `damaged_part` naming its last good line, never a crash. Raises
    OSError only when the file itself cannot be read.
    """
    v = Verifier(hmac_key=hmac_key, complete=complete, source=str(path))
    damage: list[str] = []
    for n, line in jsonl_lines(path, damage):
        v.feed_line(line, f"line {n}")
    for d in damage:
        v.problem("damaged_part", path.name, d)
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
