"""The exact bytes of an audit record: canonical JSON, record ids and the hash chain.

Everything that makes the trail tamper-evident and replay-safe is defined here once, so
the producer and `audit verify` can never disagree:

- canonical bytes: `orjson.dumps(record, option=OPT_SORT_KEYS)` (keys sorted at every
  level, no whitespace, UTF-8); the bytes that are hashed are those of the record
  *without* its `hash` member, and the bytes stored are those of the record *with* it;
- `hash` = hex SHA-256 (or HMAC-SHA256 with the configured key) over the ASCII
  `prev_hash` followed by the canonical bytes; the first record of a stream has
  `prev_hash` = 64 zeros;
- `id` = a hash over the sample's identity (host, stream, kind, event, time, GPU, process,
  XID), never over `seq` or the chain, so the same sample gets the same id on every
  retry and replay;
- `Cycle`: the members every record of one sampling cycle shares (schema, stream, time,
  host, ...), the start of each record with its id, and those members as canonical bytes
  for the builder's encoded `process` records.

A leaf of the audit record path: the builder and the record kinds call it, it calls
none of them (tests/core/audit/test_call_layers.py).

This module must never log or return an HMAC key, and never do I/O except reading the
key file in `load_hmac_key`.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from gpu_audit.logredact import register_secret

if TYPE_CHECKING:  # annotations only: `audit verify` loads this module without the model
    from gpu_audit.model.samples import ProcessSample
    from gpu_audit.model.snapshot import Snapshot

Record = dict[str, Any]

SCHEMA_ID = "gpu-audit.record/2"  # the per-cycle records and every event
SCHEMA_V1 = "gpu-audit.record/1"
SCHEMA_V3 = "gpu-audit.record/3"  # interval usage records and chain_restart (interval.py)
# Every version `audit verify` reads: the chain rule is the same for all of them, so one
# stream may hold v1 records followed by v2 records (an upgrade) and stays one chain.
KNOWN_SCHEMAS: frozenset[str] = frozenset({SCHEMA_V1, SCHEMA_ID, SCHEMA_V3})
ZERO_HASH = "0" * 64

_SORT = orjson.OPT_SORT_KEYS
_SEP = b"\x1f"  # unit separator: cannot occur in any of the id's fields unescaped


def canonical_bytes(record: Mapping[str, Any]) -> bytes:
    """The canonical serialisation of `record` (sorted keys, compact, UTF-8)."""
    return orjson.dumps(record, option=_SORT)


def chain_hash(prev_hash: str, body: bytes, hmac_key: bytes | None) -> str:
    """The hash of a record whose canonical bytes without `hash` are `body`."""
    if hmac_key is None:
        h = hashlib.sha256(prev_hash.encode("ascii"))
        h.update(body)
        return h.hexdigest()
    m = hmac.new(hmac_key, prev_hash.encode("ascii"), hashlib.sha256)
    m.update(body)
    return m.hexdigest()


def seal(record: dict[str, Any], seq: int, prev_hash: str, hmac_key: bytes | None) -> bytes:
    """Set `seq`, `prev_hash` and `hash` on `record`; return its stored bytes.

    The stored bytes equal `canonical_bytes(record)` with the hash in. To serialise only
    once, the hash member is spliced into the hashed bytes just before the top-level
    `"host"` key, which directly follows `"hash"` in sorted order. That is exact only
    when the first `,"host":` is the top-level one (it cannot occur inside a JSON string,
    whose quotes are all escaped) and no top-level key sorts between "hash" and "host";
    for any record where that is not certain (a nested object or a brace before it, a
    key such as "hint") the record is simply serialised again. tests/core/audit/test_golden.py
    holds this to seal_reference() on arbitrary records. (The builder's `process`
    records, most of a cycle, are not dicts: seal_chain().)
    """
    record["seq"] = seq
    record["prev_hash"] = prev_hash
    record.pop("hash", None)
    body = orjson.dumps(record, option=_SORT)
    if hmac_key is None:  # chain_hash, inlined: one call per record
        h = hashlib.sha256(prev_hash.encode("ascii"))
        h.update(body)
        digest = h.hexdigest()
    else:
        digest = chain_hash(prev_hash, body, hmac_key)
    record["hash"] = digest
    at = body.find(b',"host":')
    if at < 0 or (
        # Any "{" before it but the record's own: a nested object (or a brace inside a
        # string, which would fool a depth count) may hold that `,"host":`.
        body.count(b"{", 0, at) != 1
        # A top-level key between "hash" and "host" ("hint") would follow the hash; the
        # byte scan is cheap and only a record with some `"h...` before host pays the check.
        or (body.find(b'"h', 0, at) >= 0 and any("hash" < k < "host" for k in record))
    ):
        return orjson.dumps(record, option=_SORT)
    return b"".join((body[:at], b',"hash":"', digest.encode("ascii"), b'"', body[at:]))


# A record serialised before its chain point is known: the builder's `process` records
# (all but a few of a cycle's), as (head, pre, ident, pre_end, mid, end, values,
# time_ns). Its canonical bytes without `hash` are, with every member in sorted key order:
#   head + pre + ident + pre_end + PREV_HASH + mid + SEQ + end + values + "}"
# `head` ends with the last member before "hash" and `pre` starts with the `,"host":`
# member, so the stored bytes put `,"hash":"H"` between them; `pre_end` ends with
# `"prev_hash":"`, `mid` starts with the string's closing quote and ends with `"seq":`.
# The pieces are kept apart (ident: the id's hex digits; values: the values object) so
# that a record is joined once to be hashed and once to be stored. time_ns: the
# record's, for the producer's restart gap.
Encoded = tuple[bytes, bytes, bytes, bytes, bytes, bytes, bytes, int]


def seal_chain(records: Iterable[dict[str, Any] | Encoded], seq: int, prev_hash: str,
               hmac_key: bytes | None) -> tuple[list[bytes], int, str]:
    """Chain `records` after (`seq`, `prev_hash`): (their stored bytes, the last seq, the
    last hash). A dict record is sealed by seal() (which sets its members); an Encoded
    one gets exactly the bytes seal() would give it as a dict (tests/core/audit/
    test_golden.py and test_node_cycle_bytes.py hold them equal), nothing serialised
    again: one join to hash, one to store. One loop for a whole commit, as most of a
    cycle's records pass here."""
    out: list[bytes] = []
    append = out.append
    sha256 = hashlib.sha256
    raw = prev_hash.encode("ascii")  # what is hashed (chain_hash), as for a dict record
    for rec in records:
        seq += 1
        if not isinstance(rec, tuple):
            append(seal(rec, seq, raw.decode("ascii"), hmac_key))
            raw = rec["hash"].encode("ascii")
            continue
        head, pre, ident, pre_end, mid, end, values, _time_ns = rec
        # In the record, the JSON string: the same bytes for a hex hash (every hash this
        # loop makes); anything else (only a damaged checkpoint could hand one over) is
        # escaped as orjson escapes it.
        text = raw if raw.isalnum() else orjson.dumps(raw.decode("ascii"))[1:-1]
        rest = b"".join((pre, ident, pre_end, text, mid, b"%d" % seq, end, values, b"}"))
        h: Any = sha256(raw) if hmac_key is None else hmac.new(hmac_key, raw, sha256)
        h.update(head)
        h.update(rest)
        raw = h.hexdigest().encode("ascii")
        append(b"".join((head, b',"hash":"', raw, b'"', rest)))
    return out, seq, raw.decode("ascii")


def seal_any(record: dict[str, Any] | Encoded, seq: int, prev_hash: str,
             hmac_key: bytes | None) -> tuple[bytes, str]:
    """(stored bytes, hash) of one record, dict or Encoded, chained at (`seq`,
    `prev_hash`): seal_chain() of that one record."""
    stored, _seq, digest = seal_chain((record,), seq - 1, prev_hash, hmac_key)
    return stored[0], digest


def seal_reference(
    record: Mapping[str, Any], seq: int, prev_hash: str, hmac_key: bytes | None
) -> bytes:
    """The plain, obviously-correct form of seal(): the stored bytes of `record` chained
    at (`seq`, `prev_hash`), without any fast path (no encoded records, no spliced
    hash, `record` left unchanged). Tests hold seal() and the builder's cached parts to
    it byte for byte; nothing on the production path calls it."""
    body = {k: v for k, v in record.items() if k != "hash"}
    body["seq"] = seq
    body["prev_hash"] = prev_hash
    digest = chain_hash(prev_hash, orjson.dumps(body, option=_SORT), hmac_key)
    return orjson.dumps({**body, "hash": digest}, option=_SORT)


def expected_hash(record: Mapping[str, Any], hmac_key: bytes | None) -> str:
    """Recompute the hash a stored record should carry (used by verify)."""
    body = {k: v for k, v in record.items() if k != "hash"}
    prev = record.get("prev_hash")
    return chain_hash(prev if isinstance(prev, str) else "", canonical_bytes(body), hmac_key)


def id_prefix(host: str, stream: str, time_ns: int) -> Any:
    """The hash state over the parts of a record id shared by a whole cycle."""
    h = hashlib.blake2b(digest_size=16)
    h.update(_SEP.join((host.encode(), stream.encode(), str(time_ns).encode(), b"")))
    return h


def id_tail(kind: str, event: str, gpu_uuid: str, process_key: str, xid_key: str) -> bytes:
    """The per-record part of an id's hashed text (what id_from_prefix appends)."""
    return f"{kind}\x1f{event}\x1f{gpu_uuid}\x1f{process_key}\x1f{xid_key}".encode()


def id_from_tail(prefix: Any, tail: bytes) -> str:
    """Finish a record id from a cycle's `id_prefix` and an `id_tail`."""
    h = prefix.copy()
    h.update(tail)
    return str(h.hexdigest())


def id_from_prefix(  # noqa: PLR0917 - hot path: one call per record
    prefix: Any, kind: str, event: str, gpu_uuid: str, process_key: str, xid_key: str
) -> str:
    """Finish a record id from a cycle's `id_prefix` (the prefix state is not changed)."""
    return id_from_tail(prefix, id_tail(kind, event, gpu_uuid, process_key, xid_key))


def record_id(
    host: str,
    stream: str,
    kind: str,
    *,
    event: str,
    time_ns: int,
    gpu_uuid: str,
    process_key: str,
    xid_key: str,
) -> str:
    """Deterministic 128-bit record id (32 hex digits): blake2b over host, stream,
    time_ns, kind, event, GPU uuid, process key and XID key, joined with 0x1f."""
    return id_from_prefix(
        id_prefix(host, stream, time_ns), kind, event, gpu_uuid, process_key, xid_key
    )


def process_key_str(p: ProcessSample) -> str:
    """The process member of a record id."""
    # NVML may list one pid once per type and per MIG instance: all of it is identity.
    return f"{p.pid}:{p.type}:{p.gpu_instance_id}:{p.compute_instance_id}"


class Cycle:
    """Shared members of every record of one cycle, computed once."""

    def __init__(
        self,
        snap: Snapshot,
        *,
        host: str,
        stream: str,
        exporter_version: str,
        simulated: bool,
        elapsed: float,
    ) -> None:
        self.host = host
        self.stream = stream
        self.time_ns = to_time_ns(snap.timestamp)
        self.id_prefix = id_prefix(host, stream, self.time_ns)
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
        self._encoded: tuple[bytes, bytes, bytes, bytes] | None = None

    def record(
        self,
        kind: str,
        *,
        event: str = "",
        gpu_uuid: str = "",
        process_key: str = "",
        xid_key: str = "",
    ) -> Record:
        """A new record of this cycle: the shared members, its kind and its id."""
        r = dict(self.common)
        r["kind"] = kind
        if event:
            r["event"] = event
        r["id"] = id_from_prefix(self.id_prefix, kind, event, gpu_uuid, process_key, xid_key)
        return r

    def encoded_members(self) -> tuple[bytes, bytes, bytes, bytes]:
        """The members every encoded `process` record of this cycle shares, as canonical
        bytes in sorted key order: (`,"elapsed_seconds":..`; `,"host":..,"id":"`;
        `","interval_seconds":..,"kind":"process","prev_hash":"`;
        `,"simulated":..,"time_ns":..,"values":`), made on first use."""
        if self._encoded is None:
            c, dumps = self.common, orjson.dumps
            self._encoded = (
                b',"elapsed_seconds":' + dumps(c["elapsed_seconds"]),
                b',"host":' + dumps(self.host) + b',"id":"',
                b'","interval_seconds":' + dumps(self.interval_seconds)
                + b',"kind":"process","prev_hash":"',
                b',"simulated":' + dumps(self.simulated) + b',"stream":' + dumps(self.stream)
                + b',"time":' + dumps(self.time) + b',"time_ns":' + dumps(self.time_ns)
                + b',"values":',
            )
        return self._encoded

    def gpu_members(self, gpu_part: bytes, gpu_seconds: float) -> bytes:
        """`,"exporter_version":..,"gpu":{..},"gpu_seconds":..`: the members of a GPU's
        encoded `process` records from after `energy_joules` to before `hash`."""
        return (b',"exporter_version":' + orjson.dumps(self.exporter_version)
                + b',"gpu":' + gpu_part + b',"gpu_seconds":' + orjson.dumps(gpu_seconds))


def to_time_ns(unix_seconds: float) -> int:
    """Unix seconds (as the sampler stamps them) to integer nanoseconds, deterministically."""
    return round(unix_seconds * 1e9)


def format_time_ns(time_ns: int) -> str:
    """RFC 3339 UTC with nanosecond digits and `Z`, e.g. 2026-11-30T06:20:47.123456789Z."""
    secs, frac = divmod(time_ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{frac:09d}Z"


def load_hmac_key(path: Path) -> bytes:
    """The HMAC secret: the file's bytes without one trailing newline (LF or CRLF).

    Raises ValueError (naming the file, never its content) when the key is empty.
    """
    data = path.read_bytes()
    if data.endswith(b"\r\n"):
        data = data[:-2]
    elif data.endswith(b"\n"):
        data = data[:-1]
    if not data:
        raise ValueError(f"{path}: HMAC key file is empty")
    register_secret(data)  # masked in every log line from now on
    return data
