"""A sink's state (up, down, blocked, starting) and its lag, as sink_up, the log and
the lag metrics show them.

What it is for: recording the outcome of each attempt and logging a change of state
once (up -> down with the reason, down -> up with how long and how far behind), never
once per retry; and telling how far behind the sink is, in records and in the age of
the oldest record not yet final, whatever its state, so a lag alert fires for a sink
that never came up. The lag reads the spool only when no batch is in hand, with a
reader of its own that it opens and closes, so it never holds a segment open.
It never changes a sink's position or counts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gpu_audit.spool import SpoolReader
from shipper.delivery.batches import decode, time_ns_of
from shipper.delivery.progress import DeliveryProgress

log = logging.getLogger("shipper.worker")  # operators filter on the worker's logger

# "starting": no attempt has ended yet; "up": the last attempt got a record through (or
# the sink started with nothing to send); "down": the last attempt got no record through
# (connection refused, 5xx, timeouts); "blocked": the sink holds data (auth or
# configuration, HOLD).
STARTING, UP, DOWN, BLOCKED = "starting", "up", "down", "blocked"
_PROBE_RECORDS = 16  # records looked at to find the oldest undelivered record's time


class Lag:
    """Records not yet final for a sink, and the age of the oldest of them."""

    def __init__(
        self,
        name: str,
        progress: DeliveryProgress,
        *,
        reader_factory: Callable[[], SpoolReader],
        end_offset: Callable[[], int],
        limit_offset: Callable[[], int | None],
        clock: Callable[[], float],
    ) -> None:
        self._name = name
        self._progress = progress
        self._reader_factory = reader_factory
        self._end_offset = end_offset
        self._limit_offset = limit_offset
        self._clock = clock
        self._probe_lock = threading.Lock()
        self._probe: tuple[int, int | None] | None = None  # (position, its record's time_ns)

    def oldest_time_ns(self, position: int) -> int | None:
        """The time of the oldest record not yet final: the record at `position`.

        Known without I/O while a batch is in hand; otherwise (the sink down before its
        first read, between batches) read from the spool, and cached per position.
        """
        known, head = self._progress.head_time_ns(position)
        if known:
            return head
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
                found = time_ns_of(rec.doc) if rec is not None else None
                if found is not None:
                    break
            self._probe = (position, found)
            return found

    def measure(self, end: int | None = None) -> tuple[int, float]:
        """(records not yet final, seconds since the oldest of them)."""
        end = self._end_offset() if end is None else end
        position = self._progress.position
        if end <= position:
            return 0, 0.0
        try:
            head = self.oldest_time_ns(position)
        except OSError:
            log.debug("sink %s: cannot read the oldest record's time", self._name,
                      exc_info=True)
            head = None
        seconds = max(0.0, self._clock() - head / 1e9) if head is not None else 0.0
        return end - position, seconds


class SinkHealth:
    """The state of one sink, changed after every attempt, logged once per change."""

    def __init__(self, name: str, lag: Lag) -> None:
        self._name = name
        self._lag = lag
        self._lock = threading.Lock()
        self._state = STARTING
        self._reason = ""
        self._blocked: str | None = None
        self._down_since = 0.0  # monotonic time the current outage began

    @property
    def state(self) -> str:
        with self._lock:
            return self._state

    @property
    def blocked_reason(self) -> str | None:
        with self._lock:
            return self._blocked

    def set(self, state: str, reason: str) -> None:
        """Record the outcome of an attempt; log a change of state once, never per retry."""
        with self._lock:
            previous = self._state
            if state == previous and reason == self._reason:
                return
            self._state, self._reason = state, reason
            self._blocked = reason if state == BLOCKED else None
            now = time.monotonic()
            if state != UP and previous in (STARTING, UP):
                self._down_since = now
            down_for = now - self._down_since
        name = self._name
        if state == previous:  # same state, another reason: not a change worth a line
            log.debug("sink %s: still %s: %s", name, state, reason)
        elif state == UP:
            if previous != STARTING:
                records, seconds = self._lag.measure()
                log.warning("sink %s: up again after being down for %.1fs; it was %d records "
                            "(%.1fs) behind", name, down_for, records, seconds)
        elif state == BLOCKED:
            log.error("sink %s: blocked, holding its records until the configuration or "
                      "credentials are fixed: %s", name, reason)
        else:
            log.warning("sink %s: down (%s); its records stay in the spool and are retried "
                        "with backoff", name, reason)
