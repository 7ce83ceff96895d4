"""Audit-record shaped test data for the sink tests (and the shipper benchmarks)."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from shipper.sinks.base import SinkRecord

BASE_NS = 1_790_000_000_123_456_789  # 2026-09-21, with nanoseconds that floats would lose


def rfc3339(time_ns: int) -> str:
    import datetime as dt

    sec, nsec = divmod(time_ns, 1_000_000_000)
    stamp = dt.datetime.fromtimestamp(sec, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{nsec:09d}Z"


def make_doc(
    seq: int,
    *,
    kind: str = "process",
    time_ns: int | None = None,
    host: str = "node-1",
    pad: int = 0,
    values: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    t = BASE_NS + seq * 1_000_000 if time_ns is None else time_ns
    doc: dict[str, Any] = {
        "schema": "gpu-audit/record/v1",
        "kind": kind,
        "stream": f"{host}/exporter",
        "seq": seq,
        "prev_hash": f"{seq - 1:064x}",
        "time": rfc3339(t),
        "time_ns": t,
        "host": host,
        "gpu": {"uuid": f"GPU-{seq % 4:08d}-aaaa", "index": seq % 4, "name": "A100", "up": 1},
        "values": {"utilization_ratio": 0.5, "memory_bytes": 1024} if values is None else values,
        "simulated": True,
    }
    if kind == "process":
        doc["process"] = {"pid": 1000 + seq, "name": "python", "uid": 1000}
        doc["attribution"] = {"user": "alice", "project": "vision", "job": "j-17",
                              "sources": {"user": "proc"}}
    if kind == "event":
        doc["event"] = "xid"
        doc["xid"] = 79
    if pad:
        doc["pad"] = "x" * pad
    doc.update(extra)
    doc["id"] = hashlib.sha256(f"{host}/{seq}/{t}".encode()).hexdigest()[:32]
    doc["hash"] = hashlib.sha256(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return doc


def make_record(seq: int, **kw: Any) -> SinkRecord:
    doc = make_doc(seq, **kw)
    return SinkRecord(offset=seq, record_id=doc["id"], doc=doc, raw=orjson.dumps(doc))


def make_batch(n: int, start: int = 0, **kw: Any) -> list[SinkRecord]:
    return [make_record(start + i, **kw) for i in range(n)]


def one_kb_batch(n: int, start: int = 0) -> list[SinkRecord]:
    """Records of about 1 KB of JSON, the size the throughput goals are stated in."""
    probe = make_record(0)
    pad = max(0, 1024 - len(probe.raw) - 10)
    return make_batch(n, start, pad=pad)
