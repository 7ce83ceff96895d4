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

The pieces it drives live beside it: reading batches (batches.py), the position, counts
and commits (progress.py), and the state and lag (sinkstate.py).

A worker never drops a record it could read (undecodable bytes are dead-lettered with
reason "undecodable"), never touches another sink's cursor, and never blocks another
worker: the only thing workers share is the read-only spool.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpu_audit.spool import CursorStore, SpoolReader
from shipper.config import ShipperConfig
from shipper.deadletter import DeadLetter, DeadLetterFile
from shipper.delivery.backoff import Backoff
from shipper.delivery.batches import Batch, BatchReader, first_time_ns
from shipper.delivery.progress import DeliveryProgress
from shipper.delivery.sinkstate import BLOCKED, DOWN, UP, Lag, SinkHealth
from shipper.ledger import Ledger
from shipper.metrics import Histogram, SinkStatus
from shipper.sinks.base import ItemResult, Outcome, Sink, SinkError, SinkRecord
from shipper.sinks.httputil import exception_reason

log = logging.getLogger("shipper.worker")  # the name operators filter on (kept across the move)

_FINAL = (Outcome.DELIVERED, Outcome.DEAD_LETTER)


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
        self._dead = deadletters
        self._end_offset = end_offset
        self._backoff = backoff
        self._clock = clock
        self._sleep = sleep
        self._stopping = stopping
        self.batches = Histogram()
        self.thread: threading.Thread | None = None
        self._progress = DeliveryProgress(self.name, cursors, ledger)
        self._reader = BatchReader(
            config, reader_factory(), limit_offset=limit_offset, stopping=stopping,
            pause=self._pause, on_skip=self._progress.account_skip,
        )
        self._lag = Lag(self.name, self._progress, reader_factory=reader_factory,
                        end_offset=end_offset, limit_offset=limit_offset, clock=clock)
        self._health = SinkHealth(self.name, self._lag)
        self._sink_started = False
        self._start_attempts = 0
        self._next_start = 0.0  # monotonic time of the next idle start attempt

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

    def _maybe_commit(self) -> None:
        self._progress.maybe_commit(self._cfg.commit_interval_s)

    def commit(self) -> None:
        """Persist the ledger, then the cursor, if the position moved since the last commit."""
        self._progress.commit()

    def _run(self) -> None:
        try:
            failures = 0
            while not self._stopping.is_set():
                try:
                    batch = self._read_batch()
                    if batch is None:
                        # idle: the last records' commit is at most commit_interval_s late
                        self._maybe_commit()
                        self._idle_start()
                        self._pause(self._cfg.poll_interval_s)
                        continue
                    self._deliver(batch)
                    self._maybe_commit()
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

    def _read_batch(self) -> Batch | None:
        batch = self._reader.read(self._progress.position)
        if batch is not None:
            self._progress.set_head(first_time_ns(batch))
        return batch

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
            self._health.set(BLOCKED if exc.outcome is Outcome.HOLD else DOWN, exc.reason)
            delay = self._backoff.delay(self._start_attempts, exc.retry_after)
            self._start_attempts += 1
            self._next_start = time.monotonic() + delay
            return
        self._start_attempts = 0
        self._health.set(UP, "")

    # ---- delivering --------------------------------------------------------------

    def _deliver(self, batch: Batch) -> None:
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
            done = self._progress.advance(batch, done)
            if not todo:
                return
            if delay is not None:
                # commit the final prefix before a possibly long wait
                self._maybe_commit()
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
            if attempt == 0 and not self._reader.has_ahead:
                results = self._send_overlapped(records, batch.offsets[-1] + 1)
            else:
                results = self._send(records)
            self.batches.observe(time.monotonic() - started)
            self._progress.count_resends(records, results)
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
                self._progress.delivered_at(self._clock())
            if hold is not None:
                self._health.set(BLOCKED, hold)
            elif len(retry) < len(results):
                self._health.set(UP, "")
            elif results:
                self._health.set(DOWN, results[0].reason or "retry")
            todo = retry
            if retry:
                self._progress.count_retried(len(retry))
                delay = self._backoff.delay(attempt, retry_after)
                attempt += 1
                log.debug("sink %s: %d records to retry in %.2fs", self.name, len(retry), delay)

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
            self._reader.read_ahead(next_offset)
        except Exception:
            # a failed read-ahead only loses the shortcut; _read_batch reads it again
            log.debug("sink %s: read-ahead failed", self.name, exc_info=True)
            self._reader.drop_ahead()
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

    def _write_dead_letters(self, batch: Batch, start: int) -> None:
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

    # ---- state -------------------------------------------------------------------

    def status(self, *, lag: bool = True) -> SinkStatus:
        """The sink's state now. `lag=False` skips the spool read the lag may need."""
        end = self._end_offset()
        lag_s = self._lag.measure(end)[1] if lag else 0.0
        p = self._progress.snapshot()
        return SinkStatus(
            sink=self.name,
            kind=self.sink.kind,
            position=p.position,
            committed=p.committed,
            end=max(end, p.position),
            delivered=p.delivered,
            dead_lettered=p.dead_lettered,
            dropped=p.dropped,
            retried=p.retried,
            redelivered=p.redelivered,
            lag_seconds=lag_s,
            last_success=p.last_success,
            blocked_reason=self._health.blocked_reason,
            conservation_ok=(p.consistent and p.counted_through == p.accounted
                             and end >= p.position),
            batches=self.batches,
            state=self._health.state,
        )
