"""A sink's delivery progress: its position in the spool, the outcome counts behind it,
and committing both (the ledger, then the cursor).

What it is for: the accounting of one sink. The position moves only over the contiguous
prefix of records that are final (DELIVERED or DEAD_LETTER) or that the spool could not
return (counted as dropped, `spool_skipped`). Each record is counted once however often
it was sent: records below `counted_through` were counted before (by an earlier process,
per the ledger, or earlier in this one), and every send beyond a record's first is
counted in `redelivered` instead. The ledger is written before the cursor is committed,
so after any crash it is at or ahead of the cursor; one that is behind (or missing
while the cursor is past 0) makes the conservation check fail for good, never guessed.

It never sends, sleeps or reads the spool; the worker thread changes it and any thread
reads it (`snapshot`), under one lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpu_audit.spool import CursorStore
from shipper.delivery.batches import Batch, time_ns_of
from shipper.ledger import Ledger, LedgerState
from shipper.sinks.base import ItemResult, Outcome, SinkRecord

log = logging.getLogger("shipper.worker")  # operators filter on the worker's logger


@dataclass
class ProgressSnapshot:
    position: int
    committed: int
    counted_through: int
    delivered: int
    dead_lettered: int
    dropped: dict[str, int]
    accounted: int
    retried: int
    redelivered: int
    last_success: float | None
    consistent: bool
    head_time_ns: int | None = field(default=None)


class DeliveryProgress:
    def __init__(self, name: str, cursors: CursorStore, ledger: Ledger) -> None:
        self.name = name
        self._cursors = cursors
        self._ledger = ledger
        self._lock = threading.Lock()
        self._commit_lock = threading.Lock()
        committed = cursors.get(name)
        saved = ledger.load()
        # The ledger is written before the cursor is committed, so it is at or ahead of
        # the cursor; anything else means its counts cannot be trusted for the check.
        if saved is None:
            self._consistent = committed == 0
            saved = LedgerState(cursor=committed)
        else:
            self._consistent = saved.cursor >= committed
        if not self._consistent:
            log.error(
                "sink %s: delivery ledger %s (cursor %d) is behind the committed cursor %d; "
                "the conservation check reports 0 for this sink",
                name, ledger.path, saved.cursor, committed,
            )
        self._counts = saved
        self._counted_through = max(saved.cursor, committed)
        # Records below this offset have been handed to the sink before (by an earlier
        # process, per the ledger, or earlier in this one): handing one over again is a
        # re-send, counted in `redelivered` whatever the reason.
        self._sent_through = self._counted_through
        self._position = committed
        self._committed = committed
        self._last_commit = time.monotonic()
        self._retried = 0
        self._redelivered = 0
        self._last_success: float | None = None
        self._head_time_ns: int | None = None  # time of the record at the position

    @property
    def position(self) -> int:
        with self._lock:
            return self._position

    def head_time_ns(self, position: int) -> tuple[bool, int | None]:
        """(known, time) of the record at `position`, known while a batch is in hand."""
        with self._lock:
            known = self._head_time_ns is not None and self._position == position
            return known, self._head_time_ns if known else None

    def set_head(self, time_ns: int | None) -> None:
        with self._lock:
            self._head_time_ns = time_ns

    def account_skip(self, start: int, end: int) -> None:
        """Offsets [start, end) the spool cannot return: dropped (`spool_skipped`)."""
        log.error(
            "sink %s: spool offsets %d..%d cannot be read (quarantined or deleted segment); "
            "counted as dropped with reason spool_skipped", self.name, start, end - 1,
        )
        with self._lock:
            fresh = max(0, end - max(start, self._counted_through))
            if fresh:
                dropped = self._counts.dropped
                dropped["spool_skipped"] = dropped.get("spool_skipped", 0) + fresh
            self._position = end
            self._counted_through = max(self._counted_through, end)

    def advance(self, batch: Batch, start: int) -> int:
        """Move the position over the final prefix from `start`; return the new start."""
        i = start
        delivered = dead = 0
        n = len(batch.offsets)
        with self._lock:
            while i < n and batch.outcomes[i] is not None:
                # below _counted_through: counted before a crash (its re-send is
                # counted in count_resends), not counted again
                if batch.offsets[i] >= self._counted_through:
                    if batch.outcomes[i] is Outcome.DELIVERED:
                        delivered += 1
                    else:
                        dead += 1
                i += 1
            if i == start:
                return start
            self._counts.delivered += delivered
            self._counts.dead_lettered += dead
            self._position = batch.offsets[i - 1] + 1
            self._counted_through = max(self._counted_through, self._position)
            if i < n:
                rec = batch.records[i]
                self._head_time_ns = time_ns_of(rec.doc) if rec is not None else None
            else:
                self._head_time_ns = None
        return i

    def count_resends(
        self, records: Sequence[SinkRecord], results: Sequence[ItemResult]
    ) -> None:
        """Count each record sent again: handed over before (a RETRY/HOLD answer, a failed
        round, a crash before the cursor commit) or put on the wire twice by the sink."""
        with self._lock:
            again = sum(1 for rec in records if rec.offset < self._sent_through)
            again += sum(r.sends - 1 for r in results if r.sends > 1)
            self._redelivered += again
            if records:
                self._sent_through = max(self._sent_through, records[-1].offset + 1)

    def count_retried(self, records: int) -> None:
        with self._lock:
            self._retried += records

    def delivered_at(self, when: float) -> None:
        with self._lock:
            self._last_success = when

    # ---- committing --------------------------------------------------------------

    def maybe_commit(self, interval_s: float, *, force: bool = False) -> None:
        if force or time.monotonic() - self._last_commit >= interval_s:
            self.commit()

    def commit(self) -> None:
        """Persist the ledger, then the cursor, if the position moved since the last commit."""
        with self._commit_lock:
            with self._lock:
                position = self._position
                if position <= self._committed:
                    return
                state = LedgerState(
                    cursor=max(position, self._counted_through),
                    delivered=self._counts.delivered,
                    dead_lettered=self._counts.dead_lettered,
                    dropped=dict(self._counts.dropped),
                )
            self._ledger.save(state)
            self._cursors.commit(self.name, position)
            with self._lock:
                self._committed = position
            self._last_commit = time.monotonic()

    def snapshot(self) -> ProgressSnapshot:
        with self._lock:
            return ProgressSnapshot(
                position=self._position,
                committed=self._committed,
                counted_through=max(self._position, self._counted_through),
                delivered=self._counts.delivered,
                dead_lettered=self._counts.dead_lettered,
                dropped=dict(self._counts.dropped),
                accounted=self._counts.accounted,
                retried=self._retried,
                redelivered=self._redelivered,
                last_success=self._last_success,
                consistent=self._consistent,
                head_time_ns=self._head_time_ns,
            )
