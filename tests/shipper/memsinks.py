"""In-memory sinks for engine tests: idempotent storage that counts duplicates, and
switches to make them down (whole-batch RETRY), held (HOLD), slow, or scripted per record.

They follow the Sink protocol exactly, so the engine cannot tell them from real sinks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import orjson

from shipper.sinks.base import ItemResult, Outcome, SinkError, SinkRecord

Script = Callable[[SinkRecord, int], ItemResult | None]


class MemorySink:
    """Stores each record once by id; remembers every send and every re-receipt."""

    kind = "memory"

    def __init__(self, name: str, *, script: Script | None = None, latency: float = 0.0) -> None:
        self.name = name
        self.script = script  # (record, times this record was sent before) -> result or None
        self.latency = latency
        self.down = False
        self.hold: str | None = None
        self.docs: dict[str, Mapping[str, Any]] = {}
        self.received: list[str] = []  # every record id sent with a DELIVERED outcome
        self.sends: list[list[int]] = []  # offsets of every send call
        self.attempts: dict[int, int] = {}  # offset -> how many times it was sent
        self.started = 0
        self.closed = False
        self.lock = threading.Lock()

    def start(self) -> None:
        self.started += 1

    def send(self, batch: Sequence[SinkRecord]) -> Sequence[ItemResult]:
        if self.latency:
            time.sleep(self.latency)
        with self.lock:
            self.sends.append([r.offset for r in batch])
            if self.down:
                raise SinkError(Outcome.RETRY, "connection refused")
            if self.hold is not None:
                raise SinkError(Outcome.HOLD, self.hold)
            results = []
            for rec in batch:
                seen = self.attempts.get(rec.offset, 0)
                self.attempts[rec.offset] = seen + 1
                scripted = self.script(rec, seen) if self.script else None
                if scripted is not None and scripted.outcome is not Outcome.DELIVERED:
                    results.append(scripted)
                    continue
                self.received.append(rec.record_id)
                self.docs.setdefault(rec.record_id, rec.doc)
                results.append(ItemResult(Outcome.DELIVERED))
            return results

    def read_back(self, start_ns: int, end_ns: int) -> Iterator[Mapping[str, Any]]:
        with self.lock:
            docs = list(self.docs.values())
        return iter([d for d in docs if start_ns <= int(d["time_ns"]) < end_ns])

    def close(self) -> None:
        self.closed = True

    # helpers for assertions
    def duplicates(self) -> int:
        with self.lock:
            return len(self.received) - len(set(self.received))

    def count(self) -> int:
        with self.lock:
            return len(self.docs)


def record(seq: int, *, stream: str = "test", size: int = 0) -> bytes:
    """An audit-like record: id, time_ns, stream, seq, hash (and padding to ~size bytes)."""
    doc: dict[str, Any] = {
        "id": f"{stream}-{seq:012d}",
        "time_ns": 1_700_000_000_000_000_000 + seq * 1_000_000,
        "stream": stream,
        "seq": seq,
        "hash": f"{seq:064x}",
        "kind": "gpu_sample",
    }
    raw = orjson.dumps(doc)
    if size > len(raw):
        doc["pad"] = "x" * (size - len(raw) - 10)
        raw = orjson.dumps(doc)
    return raw
