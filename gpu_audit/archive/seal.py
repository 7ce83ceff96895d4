"""Seals: what the archive sink writes beside a part when it closes it.

A seal (`<part stem>.seal.json`, canonical JSON: keys sorted, compact, one line) says
what the part holds and chains the parts of one host's stream together:

- `host`, `stream`, `part` (the file name), `day`, `number`;
- `records`, `first_seq`, `last_seq`, `first_prev_hash`, `last_hash`, `first_time_ns`,
  `last_time_ns`, `first_start_ns` (the earliest instant they account for: the least
  `time_ns` - elapsed): the part's records as the hash chain sees them (`records` ==
  `last_seq - first_seq + 1` when no seq is missing inside it), and `restarts`: the
  `chain_restart` records in it (seq, the seqs they declare lost);
- `part_sha256`, `part_bytes`: SHA-256 and size of the part file as stored (the
  `.jsonl.gz`), so `sha256sum PART` checks it;
- `prev_seal`: SHA-256 of the previous part's seal file (64 zeros for a series' first
  sealed part): a chain of seals, so a part removed, replaced or reordered shows;
- `rollup`: the sums a bill needs per day, model, GPU and holder (gpu_audit.archive.rollup);
- `mac` (format `gpu-audit.seal/2`, only when the trail is keyed, `audit.hmac_key_file`):
  HMAC-SHA256 under the records' key over the seal's canonical bytes without `mac` (and
  without the newline): every member above, the rollup included. Without it a seal is
  only as good as a checksum: anyone who can write the archive can rewrite one (and the
  `prev_seal` of every later one), so a reader that cannot check a MAC must recompute
  what the seal says from the part's records (`authentic`).

Format `gpu-audit.seal/1` (written before the MAC) is still read: it is never authentic.

`summarize` reads a part's lines (parsing every record: the rollup needs them); `make`
turns a summary into the seal's bytes; `load` reads one back, checking its shape. The
digest of a seal is SHA-256 of its file's bytes.

This module never writes a file (the sink does, crash-safely) and never decides that a
part is good: verification is gpu_audit.archive.verify's.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gpu_audit.archive.rollup import Rollup
from gpu_audit.errors import GpuAuditError

SEAL_FORMAT = "gpu-audit.seal/2"
SEAL_FORMAT_V1 = "gpu-audit.seal/1"
_FORMATS = frozenset({SEAL_FORMAT, SEAL_FORMAT_V1})
ZERO_DIGEST = "0" * 64
_HEX64 = frozenset("0123456789abcdef")


@dataclass(slots=True)
class Summary:
    """A part's records as a seal describes them."""

    records: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    first_prev_hash: str | None = None
    last_hash: str | None = None
    first_time_ns: int | None = None
    last_time_ns: int | None = None
    # the earliest instant its records account for: min(time_ns - elapsed); a bill needs
    # it to know whether the part's first records reach back over a period's edge
    first_start_ns: int | None = None
    unreadable: int = 0  # lines that are not a JSON record with seq and hash
    restarts: list[list[int]] = field(default_factory=list)  # [seq, lost_from, lost_to]
    rollup: Rollup = field(default_factory=Rollup)

    def add(self, rec: Any) -> None:
        seq = rec.get("seq") if isinstance(rec, dict) else None
        h = rec.get("hash") if isinstance(rec, dict) else None
        if type(seq) is not int or not isinstance(h, str):
            self.unreadable += 1
            return
        self.records += 1
        if self.first_seq is None:
            self.first_seq = seq
            prev = rec.get("prev_hash")
            self.first_prev_hash = prev if isinstance(prev, str) else None
        self.last_seq = seq
        self.last_hash = h
        t = rec.get("time_ns")
        if type(t) is int:
            if self.first_time_ns is None:
                self.first_time_ns = t
            self.last_time_ns = t
            begin = t - elapsed_ns(rec)
            if self.first_start_ns is None or begin < self.first_start_ns:
                self.first_start_ns = begin
        if rec.get("event") == "chain_restart":
            lo, hi = rec.get("lost_from"), rec.get("lost_to")
            if type(lo) is int and type(hi) is int:
                self.restarts.append([seq, lo, hi])
        self.rollup.add(rec)


def elapsed_ns(rec: Mapping[str, Any]) -> int:
    """The time a record accounts for, in ns: `dt` (version 3) or `elapsed_seconds`;
    0 for events and anything else."""
    d = rec.get("dt")
    if d is None:
        d = rec.get("elapsed_seconds")
    if (type(d) is float or type(d) is int) and d > 0:
        return round(d * 1e9)
    return 0


def summarize(lines: Iterable[bytes]) -> Summary:
    """The summary of a part's lines (complete lines, without "\\n")."""
    s = Summary()
    loads = orjson.loads
    for raw in lines:
        if not raw:
            continue
        try:
            rec = loads(raw)
        except orjson.JSONDecodeError:
            s.unreadable += 1
            continue
        s.add(rec)
    s.rollup.finish()
    return s


def make(*, host: str, stream: str, part: str, day: str, number: int, summary: Summary,
         part_sha256: str, part_bytes: int, prev_seal: str,
         key: bytes | None = None) -> bytes:
    """The seal's bytes (canonical JSON and a newline); with `key` (the trail's HMAC key)
    it carries `mac`, the HMAC-SHA256 of its bytes without it."""
    doc = {
        "format": SEAL_FORMAT,
        "host": host, "stream": stream, "part": part, "day": day, "number": number,
        "records": summary.records, "unreadable": summary.unreadable,
        "first_seq": summary.first_seq, "last_seq": summary.last_seq,
        "first_prev_hash": summary.first_prev_hash, "last_hash": summary.last_hash,
        "first_time_ns": summary.first_time_ns, "last_time_ns": summary.last_time_ns,
        "first_start_ns": summary.first_start_ns,
        "restarts": summary.restarts,
        "part_sha256": part_sha256, "part_bytes": part_bytes, "prev_seal": prev_seal,
        "rollup": summary.rollup.to_json(),
    }
    body = orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)
    if key is None:
        return body + b"\n"
    doc["mac"] = mac_of(body, key)
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS) + b"\n"


def mac_of(body: bytes, key: bytes) -> str:
    """The MAC of a seal's canonical bytes without `mac`."""
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def digest(data: bytes) -> str:
    """A seal's digest: SHA-256 of its file's bytes (what the next seal's prev_seal is)."""
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class Seal:
    """A seal as read back."""

    path: Path
    digest: str
    host: str
    stream: str
    part: str
    day: str
    number: int
    records: int
    unreadable: int
    first_seq: int | None
    last_seq: int | None
    first_prev_hash: str | None
    last_hash: str | None
    first_time_ns: int | None
    last_time_ns: int | None
    restarts: tuple[tuple[int, int, int], ...]
    first_start_ns: int | None
    part_sha256: str
    part_bytes: int
    prev_seal: str
    rollup_json: Mapping[str, Any]
    format: str = SEAL_FORMAT
    mac: str | None = None
    body: bytes = b""  # canonical bytes without `mac`: what the MAC covers

    def rollup(self) -> Rollup:
        return Rollup.from_json(self.rollup_json)

    def authentic(self, key: bytes | None) -> bool:
        """Whether the key proves every member of this seal (its sums included): False
        without a key, for a seal without a MAC (format 1, or an unkeyed trail's) and for
        one whose MAC does not match."""
        if key is None or self.mac is None:
            return False
        return hmac.compare_digest(mac_of(self.body, key), self.mac)


class BadSeal(GpuAuditError, ValueError):
    """A seal file that is not one (the message says what is wrong)."""


def _hex64(v: Any) -> bool:
    return isinstance(v, str) and len(v) == 64 and set(v) <= _HEX64


def load(path: Path) -> Seal:
    """Read and check a seal's shape; BadSeal (naming the file) when it is not one."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BadSeal(f"{path.name}: cannot read: {exc.strerror or exc}") from None
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise BadSeal(f"{path.name}: not JSON ({exc})") from None
    problems: list[str] = []
    if not isinstance(doc, dict) or doc.get("format") not in _FORMATS:
        raise BadSeal(f"{path.name}: not a seal (format {SEAL_FORMAT!r} expected)")
    mac = doc.pop("mac", None)
    if mac is not None and (doc["format"] == SEAL_FORMAT_V1 or not _hex64(mac)):
        problems.append("mac is not 64 hex digits of a gpu-audit.seal/2")
    for k in ("host", "stream", "part", "day"):
        if not isinstance(doc.get(k), str) or not doc.get(k):
            problems.append(f"{k} missing")
    for k in ("number", "records", "unreadable", "part_bytes"):
        if type(doc.get(k)) is not int:
            problems.append(f"{k} is not an integer")
    for k in ("first_seq", "last_seq", "first_time_ns", "last_time_ns", "first_start_ns"):
        if doc.get(k) is not None and type(doc.get(k)) is not int:
            problems.append(f"{k} is not an integer")
    for k in ("first_prev_hash", "last_hash"):
        if doc.get(k) is not None and not _hex64(doc.get(k)):
            problems.append(f"{k} is not 64 hex digits")
    for k in ("part_sha256", "prev_seal"):
        if not _hex64(doc.get(k)):
            problems.append(f"{k} is not 64 hex digits")
    restarts = doc.get("restarts", [])
    if not (isinstance(restarts, list) and all(
            isinstance(r, list) and len(r) == 3 and all(type(x) is int for x in r)
            for r in restarts)):
        problems.append("restarts is not a list of [seq, lost_from, lost_to]")
    if not isinstance(doc.get("rollup"), dict):
        problems.append("rollup missing")
    if problems:
        raise BadSeal(f"{path.name}: " + "; ".join(problems))
    return Seal(
        path=path, digest=digest(data), host=doc["host"], stream=doc["stream"],
        part=doc["part"], day=doc["day"], number=doc["number"], records=doc["records"],
        unreadable=doc["unreadable"], first_seq=doc.get("first_seq"),
        last_seq=doc.get("last_seq"), first_prev_hash=doc.get("first_prev_hash"),
        last_hash=doc.get("last_hash"), first_time_ns=doc.get("first_time_ns"),
        last_time_ns=doc.get("last_time_ns"),
        restarts=tuple((r[0], r[1], r[2]) for r in restarts),
        # format 1 seals do not have it: their first record's end is the best known
        first_start_ns=doc.get("first_start_ns", doc.get("first_time_ns")),
        part_sha256=doc["part_sha256"], part_bytes=doc["part_bytes"],
        prev_seal=doc["prev_seal"], rollup_json=doc["rollup"], format=doc["format"],
        mac=mac, body=orjson.dumps(doc, option=orjson.OPT_SORT_KEYS))


def file_sha256(path: Path) -> tuple[str, int]:
    """SHA-256 and size of a file, read in large blocks."""
    h = hashlib.sha256()
    size = 0
    with path.open("rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
            size += len(block)
    return h.hexdigest(), size
