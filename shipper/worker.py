"""One sink's delivery loop: its own thread, its own cursor, its own retries.

The loop reads records from the sink's position in the spool, batches them by count,
bytes and time, sends, and classifies each record's outcome:
- DELIVERED and DEAD_LETTER are final. Dead letters are fsynced to the sink's dead-letter
  file before anything else happens, so the cursor can never pass a record that is
  neither in the backend nor in that file.
- RETRY and HOLD records (only those, never the whole batch) are sent again after a
  capped, fully jittered exponential backoff that honours Retry-After, without limit.
  HOLD also raises the sink's blocked alert until a send gets through.
The position moves over the contiguous prefix of final records only; the cursor (and
the ledger that counts outcomes) is committed after a batch, at most every
`commit_interval_s`. A crash re-sends what followed the last commit; idempotent sinks
store it once, and the ledger keeps it from being counted twice.

The sink is started as part of a send: a sink that cannot be started (backend down,
bad credentials) fails the batch like a failed send, so its records are counted as
retried, its lag grows and its state shows "down" (or "blocked") from the first moment,
whether the outage began before or after the shipper started. Each change of that state
is logged once (up -> down with the reason, down -> up with how long and how far
behind), never once per retry.

A worker never drops a record it could read (undecodable bytes are dead-lettered with
reason "undecodable"), never touches another sink's cursor, and never blocks another
worker: the only thing workers share is the read-only spool.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gpu_audit.spool import CursorStore, SpoolReader
from shipper.backoff import Backoff
from shipper.config import ShipperConfig
from shipper.deadletter import DeadLetter, DeadLetterFile
from shipper.ledger import Ledger, LedgerState
from shipper.metrics import Histogram, SinkStatus
from shipper.sinks.base import ItemResult, Outcome, Sink, SinkError, SinkRecord
from shipper.sinks.httputil import exception_reason

log = logging.getLogger(__name__)

_FINAL = (Outcome.DELIVERED, Outcome.DEAD_LETTER)

# A sink's state, as sink_up and the log show it. "starting": no attempt has ended yet;
# "down": the last attempt got no record through (connection refused, 5xx, timeouts);
# "blocked": the sink holds data (auth or configuration, HOLD).
STARTING, UP, DOWN, BLOCKED = "starting", "up", "down", "blocked"
_PROBE_RECORDS = 16  # records looked at to find the oldest undelivered record's time


@dataclass
class _Batch:
    offsets: list[int]
    records: list[SinkRecord | None]  # None: undecodable, dead-lettered without sending
    raws: list[bytes]
    outcomes: list[Outcome | None]
    reasons: list[str]


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


class SinkWorker:
    def __init__(
        self,
        sink: Sink,
        *,
        config: ShipperConfig,
        reader_factory: Callable[[], SpoolReader],
        cursors: CursorStore,
        deadletters: DeadLetterFile,
        ledger: Ledger,
        end_offset: Callable[[], int],
        limit_offset: Callable[[], int | None],
        backoff: Backoff,
        clock: Callable[[], float],
        sleep: Callable[[float], Any],
        stopping: threading.Event,
    ) -> None:
        self.sink = sink
        self.name = sink.name
        self._cfg = config
        self._reader = reader_factory()
        self._cursors = cursors
        self._dead = deadletters
        self._ledger = ledger
        self._end_offset = end_offset
        self._limit_offset = limit_offset
        self._backoff = backoff
        self._clock = clock
        self._sleep = sleep
        self._stopping = stopping
        self._lock = threading.Lock()
        self._commit_lock = threading.Lock()
        self.batches = Histogram()
        self.thread: threading.Thread | None = None

        committed = cursors.get(self.name)
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
                self.name, ledger.path, saved.cursor, committed,
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
        self._blocked: str | None = None
        self._head_time_ns: int | None = None
        self._reader_factory = reader_factory
        self._probe_lock = threading.Lock()
        self._probe: tuple[int, int | None] | None = None  # (position, its record's time_ns)
        self._sink_started = False
        self._start_attempts = 0
        self._next_start = 0.0  # monotonic time of the next idle start attempt
        self._state = STARTING
        self._state_reason = ""
        self._down_since = 0.0  # monotonic time the current outage began
        # A full batch read ahead while the previous batch was on the wire (see _send_overlapped)
        self._ahead: _Batch | None = None

    # ---- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name=f"shipper-{self.name}", daemon=True)
        self.thread.start()

    def _abandon(self) -> bool:
        # Once stopping, no new send starts: records not yet final stay in the spool and
        # go out after the restart. A send already in progress finishes (bounded by the
        # sink's own timeouts; the engine waits shutdown_grace_s for it).
        return self._stopping.is_set()

    def _pause(self, seconds: float) -> None:
        if seconds > 0 and not self._stopping.is_set():
            self._sleep(seconds)

    def _run(self) -> None:
        try:
            failures = 0
            while not self._stopping.is_set():
                try:
                    batch = self._read_batch()
                    if batch is None:
                        # idle: the last records' commit is at most commit_interval_s late
                        self._maybe_commit(force=False)
                        self._idle_start()
                        self._pause(self._cfg.poll_interval_s)
                        continue
                    self._deliver(batch)
                    self._maybe_commit(force=False)
                    failures = 0
                except Exception:
                    # A disk error (ENOSPC on the dead-letter file, ledger or cursor) or a
                    # bug must neither kill this sink's thread nor move its cursor: the
                    # position only ever covers final records, so the loop starts again
                    # from it after a backoff (a re-sent batch is absorbed by the sink).
                    log.exception("sink %s: delivery round failed; retrying", self.name)
                    self._pause(self._backoff.delay(failures))
                    failures += 1
        finally:
            try:
                self.commit()
            except OSError:
                log.exception("sink %s: final cursor commit failed", self.name)
            try:
                self.sink.close()
            except Exception:
                log.exception("sink %s: close failed", self.name)
            self._reader.close()

    def _ensure_started(self) -> None:
        """Start the sink once; raise SinkError (RETRY or HOLD) while it cannot be started."""
        if self._sink_started:
            return
        try:
            self.sink.start()
        except SinkError as exc:
            if exc.outcome is Outcome.HOLD:
                raise
            # nothing can be dead-lettered by a failed start: the records were never sent
            raise SinkError(Outcome.RETRY, exc.reason, exc.retry_after) from None
        except Exception as exc:
            # a sink bug or an unclassified error is transient (as in _send); its one-line
            # reason reaches the state log, redacted like every transport error
            raise SinkError(Outcome.RETRY, f"start failed: {exception_reason(exc)}") from exc
        self._sink_started = True

    def _idle_start(self) -> None:
        """With nothing to send, still start the sink (with backoff) so its state is known.

        With records to send the start happens inside the send, and fails the batch like
        a failed send would (see _send).
        """
        if self._sink_started or time.monotonic() < self._next_start:
            return
        try:
            self._ensure_started()
        except SinkError as exc:
            self._set_state(BLOCKED if exc.outcome is Outcome.HOLD else DOWN, exc.reason)
            delay = self._backoff.delay(self._start_attempts, exc.retry_after)
            self._start_attempts += 1
            self._next_start = time.monotonic() + delay
            return
        self._start_attempts = 0
        self._set_state(UP, "")

    # ---- reading -----------------------------------------------------------------

    def _read_batch(self) -> _Batch | None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead.offsets[0] == self._position:
            # read while the previous batch was being sent; still the next records exactly
            with self._lock:
                first = ahead.records[0]
                self._head_time_ns = _time_ns(first.doc) if first is not None else None
            return ahead
        cfg = self._cfg
        read_pos = self._position
        offsets: list[int] = []
        raws: list[bytes] = []
        size = 0
        first_seen: float | None = None
        while True:
            limit = self._limit_offset()
            result = self._reader.read(
                read_pos, cfg.batch_max_records - len(offsets), cfg.batch_max_bytes - size, limit
            )
            if result.skipped_to is not None and result.skipped_to > read_pos:
                if offsets:
                    break  # send what we have; the gap is accounted on the next read
                self._account_skip(read_pos, result.skipped_to)
            for offset, raw in result.entries:
                offsets.append(offset)
                raws.append(raw)
                size += len(raw)
            read_pos = max(read_pos, result.next_offset)
            if not offsets:
                return None
            if first_seen is None:
                first_seen = time.monotonic()
            full = len(offsets) >= cfg.batch_max_records or size >= cfg.batch_max_bytes
            waited = time.monotonic() - first_seen
            if full or waited >= cfg.batch_max_wait_s or self._stopping.is_set():
                break
            if not result.entries:
                self._pause(min(cfg.poll_interval_s, cfg.batch_max_wait_s - waited))
        records = [decode(o, r) for o, r in zip(offsets, raws, strict=True)]
        with self._lock:
            first = records[0]
            self._head_time_ns = _time_ns(first.doc) if first is not None else None
        return _Batch(offsets, records, raws, [None] * len(offsets), [""] * len(offsets))

    def _read_ahead(self, start: int) -> None:
        """Read and decode the full batch that starts at `start`, if the spool holds one now.

        Only a full batch is kept (a partial one would skip batch_max_wait_s); a gap or
        anything short is left for _read_batch to handle the ordinary way. Nothing here
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
                return  # a gap: _read_batch accounts for it
            if not result.entries or result.entries[0][0] != pos:
                return  # not a full batch yet (or not contiguous): read it the usual way
            entries += result.entries
            size += sum(len(raw) for _, raw in result.entries)
            pos = result.next_offset
        offsets = [o for o, _ in entries]
        raws = [r for _, r in entries]
        records = [decode(o, r) for o, r in entries]
        self._ahead = _Batch(offsets, records, raws, [None] * len(offsets), [""] * len(offsets))

    def _account_skip(self, start: int, end: int) -> None:
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

    # ---- delivering --------------------------------------------------------------

    def _deliver(self, batch: _Batch) -> None:
        for i, rec in enumerate(batch.records):
            if rec is None:
                batch.outcomes[i] = Outcome.DEAD_LETTER
                batch.reasons[i] = "undecodable"
        todo = [i for i, rec in enumerate(batch.records) if rec is not None]
        done = 0  # index of the first record not yet accounted
        attempt = 0
        delay: float | None = None
        while True:
            self._write_dead_letters(batch, done)
            done = self._advance(batch, done)
            if not todo:
                return
            if delay is not None:
                # commit the final prefix before a possibly long wait
                self._maybe_commit(force=False)
                self._pause(delay)
            if self._abandon():
                log.warning(
                    "sink %s: stopping with %d records not yet delivered; they stay in the "
                    "spool and are sent after the restart", self.name, len(todo),
                )
                return
            sending = [batch.records[i] for i in todo]
            started = time.monotonic()
            records = [r for r in sending if r is not None]
            if attempt == 0 and self._ahead is None:
                results = self._send_overlapped(records, batch.offsets[-1] + 1)
            else:
                results = self._send(records)
            self.batches.observe(time.monotonic() - started)
            self._count_resends(records, results)
            retry: list[int] = []
            retry_after: float | None = None
            hold: str | None = None
            delivered_any = False
            for i, res in zip(todo, results, strict=True):
                if res.outcome in _FINAL:
                    batch.outcomes[i] = res.outcome
                    batch.reasons[i] = res.reason
                    delivered_any = delivered_any or res.outcome is Outcome.DELIVERED
                    continue
                retry.append(i)
                if res.retry_after is not None:
                    retry_after = max(retry_after or 0.0, res.retry_after)
                if res.outcome is Outcome.HOLD and hold is None:
                    hold = res.reason or "hold"
            if delivered_any:
                with self._lock:
                    self._last_success = self._clock()
            if hold is not None:
                self._set_state(BLOCKED, hold)
            elif len(retry) < len(results):
                self._set_state(UP, "")
            elif results:
                self._set_state(DOWN, results[0].reason or "retry")
            todo = retry
            if retry:
                with self._lock:
                    self._retried += len(retry)
                delay = self._backoff.delay(attempt, retry_after)
                attempt += 1
                log.debug("sink %s: %d records to retry in %.2fs", self.name, len(retry), delay)

    def _count_resends(
        self, records: Sequence[SinkRecord], results: Sequence[ItemResult]
    ) -> None:
        """Count each record sent again: handed over before (a RETRY/HOLD answer, a failed
        round, a crash before the cursor commit) or put on the wire twice by the sink."""
        again = sum(1 for rec in records if rec.offset < self._sent_through)
        again += sum(r.sends - 1 for r in results if r.sends > 1)
        with self._lock:
            self._redelivered += again
            if records:
                self._sent_through = max(self._sent_through, records[-1].offset + 1)

    def _send_overlapped(self, records: Sequence[SinkRecord], next_offset: int) -> Sequence[
        ItemResult
    ]:
        """Send a batch from a helper thread while this thread reads and decodes the next.

        The sink's encoding and the server's work on one batch then overlap with the spool
        read and JSON decoding of the next (a catch-up is CPU-bound on both sides). This
        returns only once the send is over, as _send does: at most one send is in flight
        per sink, and at most two batches (this one and the next) are held.
        """
        box: list[Sequence[ItemResult]] = []
        sender = threading.Thread(
            target=lambda: box.append(self._send(records)),
            name=f"shipper-{self.name}-send", daemon=True,
        )
        sender.start()
        try:
            self._read_ahead(next_offset)
        except Exception:
            # a failed read-ahead only loses the shortcut; _read_batch reads it again
            log.debug("sink %s: read-ahead failed", self.name, exc_info=True)
            self._ahead = None
        finally:
            sender.join()
        if not box:  # the helper died outside _send's own handling (cannot normally happen)
            return [ItemResult(Outcome.RETRY, "send thread failed")] * len(records)
        return box[0]

    def _send(self, records: Sequence[SinkRecord]) -> Sequence[ItemResult]:
        try:
            self._ensure_started()
            results = self.sink.send(records)
        except SinkError as exc:
            return [ItemResult(exc.outcome, exc.reason, exc.retry_after)] * len(records)
        except Exception as exc:
            # An unexpected sink failure is treated as transient: retrying is safe (sinks
            # are idempotent) and dropping would lose evidence.
            log.exception("sink %s: send raised; retrying the batch", self.name)
            return [ItemResult(Outcome.RETRY, f"sink error: {type(exc).__name__}")] * len(records)
        if len(results) != len(records):
            log.error(
                "sink %s: returned %d results for %d records; retrying the batch",
                self.name, len(results), len(records),
            )
            return [ItemResult(Outcome.RETRY, "sink returned a wrong result count")] * len(
                records
            )
        return results

    def _write_dead_letters(self, batch: _Batch, start: int) -> None:
        letters = []
        for i in range(start, len(batch.offsets)):
            if batch.outcomes[i] is Outcome.DEAD_LETTER:
                rec = batch.records[i]
                letters.append(
                    DeadLetter(
                        offset=batch.offsets[i],
                        record_id=rec.record_id if rec is not None else "",
                        reason=batch.reasons[i] or "rejected",
                        raw=batch.raws[i],
                        doc=rec.doc if rec is not None else None,
                    )
                )
        if letters:
            self._dead.write(letters, int(self._clock() * 1e9))

    def _advance(self, batch: _Batch, start: int) -> int:
        """Move the position over the final prefix from `start`; return the new start."""
        i = start
        delivered = dead = 0
        n = len(batch.offsets)
        with self._lock:
            while i < n and batch.outcomes[i] is not None:
                # below _counted_through: counted before a crash (its re-send is
                # counted in _count_resends), not counted again
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
                self._head_time_ns = _time_ns(rec.doc) if rec is not None else None
            else:
                self._head_time_ns = None
        return i

    # ---- committing --------------------------------------------------------------

    def _maybe_commit(self, *, force: bool) -> None:
        due = time.monotonic() - self._last_commit >= self._cfg.commit_interval_s
        if force or due:
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

    # ---- state -------------------------------------------------------------------

    def _set_state(self, state: str, reason: str) -> None:
        """Record the outcome of an attempt; log a change of state once, never per retry."""
        with self._lock:
            previous = self._state
            if state == previous and reason == self._state_reason:
                return
            self._state, self._state_reason = state, reason
            self._blocked = reason if state == BLOCKED else None
            now = time.monotonic()
            if state != UP and previous in (STARTING, UP):
                self._down_since = now
            down_for = now - self._down_since
        if state == previous:  # same state, another reason: not a change worth a line
            log.debug("sink %s: still %s: %s", self.name, state, reason)
        elif state == UP:
            if previous != STARTING:
                records, seconds = self._lag()
                log.warning("sink %s: up again after being down for %.1fs; it was %d records "
                            "(%.1fs) behind", self.name, down_for, records, seconds)
        elif state == BLOCKED:
            log.error("sink %s: blocked, holding its records until the configuration or "
                      "credentials are fixed: %s", self.name, reason)
        else:
            log.warning("sink %s: down (%s); its records stay in the spool and are retried "
                        "with backoff", self.name, reason)

    def _oldest_time_ns(self, position: int) -> int | None:
        """The time of the oldest record not yet final: the record at `position`.

        Known without I/O while a batch is in hand; otherwise (the sink down before its
        first read, between batches) read from the spool with a reader of its own, opened
        and closed here so it never holds a segment open, and cached per position.
        """
        with self._lock:
            if self._head_time_ns is not None and self._position == position:
                return self._head_time_ns
        with self._probe_lock:
            if self._probe is not None and self._probe[0] == position:
                return self._probe[1]
            found: int | None = None
            reader = self._reader_factory()
            try:
                result = reader.read(position, _PROBE_RECORDS, 1 << 20, self._limit_offset())
            finally:
                reader.close()
            for offset, raw in result.entries:
                rec = decode(offset, raw)
                found = _time_ns(rec.doc) if rec is not None else None
                if found is not None:
                    break
            self._probe = (position, found)
            return found

    def _lag(self, end: int | None = None) -> tuple[int, float]:
        """Records not yet final for this sink, and the age of the oldest of them."""
        end = self._end_offset() if end is None else end
        with self._lock:
            position = self._position
        if end <= position:
            return 0, 0.0
        try:
            head = self._oldest_time_ns(position)
        except OSError:
            log.debug("sink %s: cannot read the oldest record's time", self.name, exc_info=True)
            head = None
        seconds = max(0.0, self._clock() - head / 1e9) if head is not None else 0.0
        return end - position, seconds

    def status(self, *, lag: bool = True) -> SinkStatus:
        """The sink's state now. `lag=False` skips the spool read the lag may need."""
        end = self._end_offset()
        lag_s = self._lag(end)[1] if lag else 0.0
        with self._lock:
            position = self._position
            counted = max(position, self._counted_through)
            accounted = self._counts.accounted
            return SinkStatus(
                sink=self.name,
                kind=self.sink.kind,
                position=position,
                committed=self._committed,
                end=max(end, position),
                delivered=self._counts.delivered,
                dead_lettered=self._counts.dead_lettered,
                dropped=dict(self._counts.dropped),
                retried=self._retried,
                redelivered=self._redelivered,
                lag_seconds=lag_s,
                last_success=self._last_success,
                blocked_reason=self._blocked,
                conservation_ok=self._consistent and counted == accounted and end >= position,
                batches=self.batches,
                state=self._state,
            )


def _time_ns(doc: Any) -> int | None:
    value = doc.get("time_ns") if isinstance(doc, dict) else None
    return value if isinstance(value, int) else None
