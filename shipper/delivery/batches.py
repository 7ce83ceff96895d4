"""Reading a sink's next batch from the spool: batching by count, bytes and time, the
read-ahead of the next full batch while one is on the wire, and decoding.

What it is for: turning spool entries from a position into a `Batch` the worker can
send. It never moves a sink's position, counts or cursor: a gap in the spool (offsets
that cannot be read) is reported to the caller (`on_skip`), which accounts for it, and
the first record's time is reported (`on_head`) for the lag. Bytes that are not an audit
record decode to None and are dead-lettered by the worker, never dropped here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from gpu_audit.spool import SpoolReader
from shipper.config import ShipperConfig
from shipper.sinks.base import Outcome, SinkRecord


@dataclass
class Batch:
    offsets: list[int]
    records: list[SinkRecord | None]  # None: undecodable, dead-lettered without sending
    raws: list[bytes]
    outcomes: list[Outcome | None]
    reasons: list[str]

    @classmethod
    def from_entries(cls, entries: list[tuple[int, bytes]]) -> Batch:
        offsets = [o for o, _ in entries]
        raws = [r for _, r in entries]
        records = [decode(o, r) for o, r in entries]
        return cls(offsets, records, raws, [None] * len(offsets), [""] * len(offsets))


def decode(offset: int, raw: bytes) -> SinkRecord | None:
    """The SinkRecord for stored bytes, or None when they are not an audit record."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    record_id = doc.get("id")
    if not isinstance(record_id, str) or not record_id:
        return None
    return SinkRecord(offset=offset, record_id=record_id, doc=doc, raw=raw)


def time_ns_of(doc: Any) -> int | None:
    """A record's `time_ns`, or None when it has none."""
    value = doc.get("time_ns") if isinstance(doc, dict) else None
    return value if isinstance(value, int) else None


def first_time_ns(batch: Batch) -> int | None:
    first = batch.records[0]
    return time_ns_of(first.doc) if first is not None else None


class BatchReader:
    """One sink's reader of batches (a spool reader of its own keeps position state)."""

    def __init__(
        self,
        config: ShipperConfig,
        reader: SpoolReader,
        *,
        limit_offset: Callable[[], int | None],
        stopping: threading.Event,
        pause: Callable[[float], None],
        on_skip: Callable[[int, int], None],
    ) -> None:
        self._cfg = config
        self._reader = reader
        self._limit_offset = limit_offset
        self._stopping = stopping
        self._pause = pause
        self._on_skip = on_skip
        # A full batch read ahead while the previous batch was on the wire (read_ahead)
        self._ahead: Batch | None = None

    @property
    def has_ahead(self) -> bool:
        return self._ahead is not None

    def drop_ahead(self) -> None:
        self._ahead = None

    def close(self) -> None:
        self._reader.close()

    def read(self, position: int) -> Batch | None:
        """The next batch from `position`, or None when the spool has nothing there yet.

        Waits up to batch_max_wait_s (from the first record seen) for a batch to fill.
        """
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead.offsets[0] == position:
            # read while the previous batch was being sent; still the next records exactly
            return ahead
        cfg = self._cfg
        read_pos = position
        entries: list[tuple[int, bytes]] = []
        size = 0
        first_seen: float | None = None
        while True:
            limit = self._limit_offset()
            result = self._reader.read(
                read_pos, cfg.batch_max_records - len(entries), cfg.batch_max_bytes - size, limit
            )
            if result.skipped_to is not None and result.skipped_to > read_pos:
                if entries:
                    break  # send what we have; the gap is accounted on the next read
                self._on_skip(read_pos, result.skipped_to)
            entries += result.entries
            size += sum(len(raw) for _, raw in result.entries)
            read_pos = max(read_pos, result.next_offset)
            if not entries:
                return None
            if first_seen is None:
                first_seen = time.monotonic()
            full = len(entries) >= cfg.batch_max_records or size >= cfg.batch_max_bytes
            waited = time.monotonic() - first_seen
            if full or waited >= cfg.batch_max_wait_s or self._stopping.is_set():
                break
            if not result.entries:
                self._pause(min(cfg.poll_interval_s, cfg.batch_max_wait_s - waited))
        return Batch.from_entries(entries)

    def read_ahead(self, start: int) -> None:
        """Read and decode the full batch that starts at `start`, if the spool holds one now.

        Only a full batch is kept (a partial one would skip batch_max_wait_s); a gap or
        anything short is left for read() to handle the ordinary way. Nothing here
        touches the position, the counts or the cursor: it only saves the next read.
        """
        cfg = self._cfg
        limit = self._limit_offset()
        entries: list[tuple[int, bytes]] = []
        size = 0
        pos = start
        while len(entries) < cfg.batch_max_records and size < cfg.batch_max_bytes:
            result = self._reader.read(
                pos, cfg.batch_max_records - len(entries), cfg.batch_max_bytes - size, limit
            )
            if result.skipped_to is not None and result.skipped_to > pos:
                return  # a gap: read() accounts for it
            if not result.entries or result.entries[0][0] != pos:
                return  # not a full batch yet (or not contiguous): read it the usual way
            entries += result.entries
            size += sum(len(raw) for _, raw in result.entries)
            pos = result.next_offset
        self._ahead = Batch.from_entries(entries)
