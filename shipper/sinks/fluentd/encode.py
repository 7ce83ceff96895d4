"""What the Fluentd sink puts on the wire: Forward-mode chunks of the forward protocol
(fluentd's "Forward Protocol Specification v1").

A chunk is `[tag, [[EventTime, record], ...], {"chunk": id, "size": n}]`, one per tag
(`<tag_prefix>.<record kind>`) in a batch. EventTime is msgpack ext type 0 holding the
big-endian u32 seconds and u32 nanoseconds, so the record's time is exact to the
nanosecond (fluent-logger's default is whole seconds). The chunk id is
base64(sha256(the chunk's record ids)[:16]): resending the same records gives the same
id, so a receiver can de-duplicate a retried chunk. Pure; no I/O.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack

from shipper.sinks.base import SinkRecord

_EVENT_TIME = 0  # the msgpack ext type code of EventTime


def chunk_id(record_ids: Sequence[str]) -> str:
    """Deterministic chunk id: the same records always give the same id."""
    digest = hashlib.sha256("\n".join(record_ids).encode()).digest()[:16]
    return base64.b64encode(digest).decode()


def event_time(time_ns: int) -> msgpack.ExtType:
    """The forward protocol's EventTime for a time in nanoseconds since the epoch."""
    seconds, nanos = divmod(time_ns, 1_000_000_000)
    return msgpack.ExtType(_EVENT_TIME, struct.pack(">II", seconds, nanos))


def tag_for(tag_prefix: str, doc: Mapping[str, Any]) -> str:
    return f"{tag_prefix}.{doc.get('kind') or 'record'}"


def valid_time_ns(doc: Mapping[str, Any]) -> bool:
    """Can this record's time be an EventTime (an int of ns, not negative, u32 seconds)?"""
    time_ns = doc.get("time_ns")
    return (isinstance(time_ns, int) and not isinstance(time_ns, bool)
            and 0 <= time_ns < (1 << 32) * 1_000_000_000)


def forward_chunk(tag: str, records: Sequence[SinkRecord], cid: str) -> bytes:
    """One Forward-mode message asking for an ack of chunk `cid`."""
    entries = [[event_time(r.doc["time_ns"]), dict(r.doc)] for r in records]
    packed: bytes = msgpack.packb([tag, entries, {"chunk": cid, "size": len(entries)}],
                                  use_bin_type=True)
    return packed


def as_bytes(value: Any) -> bytes:
    """A msgpack value the server may send as str or bytes, as bytes."""
    if isinstance(value, bytes):
        return value
    return str(value).encode()
