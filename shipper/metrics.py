"""The shipper's own metrics, as a prometheus_client Collector built fresh on each scrape.

Nothing here is a global gauge mutated from a loop: the workers keep plain counters under
their own locks, and `ShipperCollector.collect()` turns one consistent status per sink
into new metric families. The delivered / dead-lettered / dropped counters are cumulative
over the life of the spool (they continue from the persisted ledger after a restart), so
they agree with the conservation check:

    produced = delivered + dead_lettered + dropped + pending     (per sink)

where produced is the spool's next offset (offsets are dense and start at 0, so it is the
number of records ever acknowledged into this spool) and pending = produced - the sink's
position. This module never touches the spool or a sink; it only reads statuses. Names,
types, HELP and label names come from gpu_audit.selfmetrics (documented in
docs/METRICS.md; a test scrapes a live run and compares).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client.registry import Collector

from gpu_audit import selfmetrics as sm

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

BATCH_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Histogram:
    """A thread-safe cumulative histogram of durations (seconds)."""

    def __init__(self, buckets: Sequence[float] = BATCH_BUCKETS) -> None:
        self.buckets = tuple(buckets)
        self._counts = [0] * (len(self.buckets) + 1)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self._lock:
            self._counts[bisect.bisect_left(self.buckets, value)] += 1
            self._sum += value

    def snapshot(self) -> tuple[list[tuple[str, float]], float]:
        """Cumulative (le, count) pairs ending with +Inf, and the sum."""
        with self._lock:
            counts = list(self._counts)
            total = self._sum
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*map(str, self.buckets), "+Inf"), counts, strict=True):
            running += n
            out.append((bound, float(running)))
        return out, total


@dataclass(frozen=True)
class SinkStatus:
    """One sink's state at one moment, as the worker reports it."""

    sink: str
    kind: str
    position: int  # every record below it has a final outcome
    committed: int  # the durable cursor in the spool's CursorStore
    end: int  # the spool offset the worker may read up to (produced, for pending)
    delivered: int
    dead_lettered: int
    dropped: dict[str, int]
    retried: int
    redelivered: int  # record sends repeating an earlier send of the same record
    lag_seconds: float
    last_success: float | None
    blocked_reason: str | None
    conservation_ok: bool
    batches: Histogram = field(compare=False)
    # "starting" (no attempt ended yet), "up", "down" (nothing got through: the backend
    # cannot be reached or answers 5xx/429) or "blocked" (HOLD: auth or configuration)
    state: str = "starting"

    @property
    def lag_records(self) -> int:
        return max(0, self.end - self.position)


@dataclass(frozen=True)
class SpoolStatus:
    bytes: int
    segments: int
    produced: int  # the spool's next offset
    full_reason: str | None  # why the producer is refused right now, None when it is not
    refused: dict[str, int]  # records the spool refused, by reason (embedded mode only)
    evicted: int = 0  # records deleted unshipped under when_full: drop_oldest (embedded)
    corrupt: int = 0  # records lost to damage, counted when kept in quarantine/ (embedded)


class ShipperCollector(Collector):
    """Exposes the statuses returned by `statuses()` and `spool()` on every scrape."""

    def __init__(
        self,
        statuses: Callable[[], Sequence[SinkStatus]],
        spool: Callable[[], SpoolStatus],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._statuses = statuses
        self._spool = spool
        self._clock = clock

    def describe(self) -> Iterator[Metric]:
        # no describe: the registry would otherwise call collect() at registration
        return iter(())

    def collect(self) -> Iterator[Metric]:
        statuses = list(self._statuses())
        spool = self._spool()
        delivered = sm.SHIPPER_DELIVERED.counter()
        retried = sm.SHIPPER_RETRIED.counter()
        redelivered = sm.SHIPPER_REDELIVERED.counter()
        dead = sm.SHIPPER_DEAD_LETTERED.counter()
        dropped = sm.SHIPPER_DROPPED.counter()
        lag_records = sm.SHIPPER_LAG_RECORDS.gauge()
        lag_seconds = sm.SHIPPER_LAG_SECONDS.gauge()
        cursor = sm.SHIPPER_CURSOR.gauge()
        last_success = sm.SHIPPER_LAST_SUCCESS.gauge()
        blocked = sm.SHIPPER_BLOCKED.gauge()
        conservation = sm.SHIPPER_CONSERVATION.gauge()
        batches = sm.SHIPPER_BATCH_DURATION.histogram()
        up = sm.SHIPPER_SINK_UP.gauge()
        for st in statuses:
            labels = [st.sink]
            delivered.add_metric(labels, st.delivered)
            retried.add_metric(labels, st.retried)
            redelivered.add_metric(labels, st.redelivered)
            dead.add_metric(labels, st.dead_lettered)
            for reason, n in sm.SHIPPER_DROPPED.with_known(st.dropped):
                dropped.add_metric([st.sink, reason], n)
            lag_records.add_metric(labels, st.lag_records)
            lag_seconds.add_metric(labels, st.lag_seconds)
            cursor.add_metric(labels, st.committed)
            if st.last_success is not None:
                last_success.add_metric(labels, st.last_success)
            blocked.add_metric([st.sink, st.blocked_reason or ""], 1 if st.blocked_reason else 0)
            up.add_metric(labels, 1 if st.state == "up" else 0)
            conservation.add_metric(labels, 1 if st.conservation_ok else 0)
            buckets, total = st.batches.snapshot()
            batches.add_metric(labels, buckets, total)
        yield from (delivered, retried, redelivered, dead, dropped, lag_records, lag_seconds)
        yield from (cursor, last_success, blocked, up, conservation, batches)

        yield sm.SPOOL_BYTES.gauge(value=spool.bytes)
        yield sm.SPOOL_SEGMENTS.gauge(value=spool.segments)
        yield sm.RECORDS_PRODUCED.counter(value=spool.produced)
        full = sm.SPOOL_FULL.gauge()
        full.add_metric([spool.full_reason or ""], 1 if spool.full_reason else 0)
        yield full
        refused = sm.SPOOL_REFUSED.counter()
        for reason, n in sm.SPOOL_REFUSED.with_known(spool.refused):
            refused.add_metric([reason], n)
        yield refused
        yield sm.SPOOL_EVICTED.counter(value=spool.evicted)
        yield sm.SPOOL_CORRUPT.counter(value=spool.corrupt)
