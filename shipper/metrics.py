"""The shipper's own metrics, as a prometheus_client Collector built fresh on each scrape.

Nothing here is a global gauge mutated from a loop: the workers keep plain counters under
their own locks, and `ShipperCollector.collect()` turns one consistent status per sink
into new metric families. The delivered / dead-lettered / dropped counters are cumulative
over the life of the spool (they continue from the persisted ledger after a restart), so
they agree with the conservation check:

    produced = delivered + dead_lettered + dropped + pending     (per sink)

where produced is the spool's next offset (offsets are dense and start at 0, so it is the
number of records ever acknowledged into this spool) and pending = produced - the sink's
position. This module never touches the spool or a sink; it only reads statuses.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

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
    redelivered: int  # re-sent after a crash, absorbed by the idempotent sink
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


DROP_REASONS = ("spool_skipped",)


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
        sink = ["sink"]
        delivered = CounterMetricFamily(
            "gpu_audit_shipper_records_delivered",
            "Records the sink's backend acknowledged (a 409 already-exists counts).",
            labels=sink,
        )
        retried = CounterMetricFamily(
            "gpu_audit_shipper_records_retried",
            "Record sends that got a transient or hold outcome and were sent again.",
            labels=sink,
        )
        redelivered = CounterMetricFamily(
            "gpu_audit_shipper_records_redelivered",
            "Records re-sent after a restart because their cursor was not yet committed "
            "(the idempotent sink stores them once).",
            labels=sink,
        )
        dead = CounterMetricFamily(
            "gpu_audit_shipper_records_dead_lettered",
            "Records the backend rejected for good, written to the sink's dead-letter file.",
            labels=sink,
        )
        dropped = CounterMetricFamily(
            "gpu_audit_shipper_records_dropped",
            "Records this sink will never get, by reason (expected to stay 0).",
            labels=["sink", "reason"],
        )
        lag_records = GaugeMetricFamily(
            "gpu_audit_shipper_cursor_lag_records",
            "Records in the spool not yet delivered to the sink.",
            labels=sink,
        )
        lag_seconds = GaugeMetricFamily(
            "gpu_audit_shipper_cursor_lag_seconds",
            "Age of the oldest record not yet delivered to the sink (0 when caught up).",
            labels=sink,
        )
        cursor = GaugeMetricFamily(
            "gpu_audit_shipper_cursor_offset",
            "The sink's committed (durable) cursor in the spool.",
            labels=sink,
        )
        last_success = GaugeMetricFamily(
            "gpu_audit_shipper_last_success_timestamp_seconds",
            "Unix time of the sink's last batch with a delivered record.",
            labels=sink,
        )
        blocked = GaugeMetricFamily(
            "gpu_audit_shipper_sink_blocked",
            "1 while the sink holds data because of an auth or configuration error.",
            labels=["sink", "reason"],
        )
        up = GaugeMetricFamily(
            "gpu_audit_shipper_sink_up",
            "1 when the sink's last attempt got records through (or it started with nothing "
            "to send), 0 while it is down, blocked or not yet started.",
            labels=sink,
        )
        conservation = GaugeMetricFamily(
            "gpu_audit_shipper_conservation_ok",
            "1 when produced = delivered + dead_lettered + dropped + pending for the sink.",
            labels=sink,
        )
        batches = HistogramMetricFamily(
            "gpu_audit_shipper_batch_duration_seconds",
            "Time of one send of a batch to the sink, whatever its outcome.",
            labels=sink,
        )
        for st in statuses:
            labels = [st.sink]
            delivered.add_metric(labels, st.delivered)
            retried.add_metric(labels, st.retried)
            redelivered.add_metric(labels, st.redelivered)
            dead.add_metric(labels, st.dead_lettered)
            for reason in sorted({*DROP_REASONS, *st.dropped}):
                dropped.add_metric([st.sink, reason], st.dropped.get(reason, 0))
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

        yield GaugeMetricFamily(
            "gpu_audit_spool_bytes", "Bytes the spool's segments take on disk.", value=spool.bytes
        )
        yield GaugeMetricFamily(
            "gpu_audit_spool_segments", "Segment files in the spool.", value=spool.segments
        )
        yield CounterMetricFamily(
            "gpu_audit_records_produced",
            "Records ever acknowledged into the spool (its next offset).",
            value=spool.produced,
        )
        full = GaugeMetricFamily(
            "gpu_audit_spool_full",
            "1 while the spool refuses new records (max_bytes or min_free_bytes reached).",
            labels=["reason"],
        )
        full.add_metric([spool.full_reason or ""], 1 if spool.full_reason else 0)
        yield full
        refused = CounterMetricFamily(
            "gpu_audit_spool_refused_records",
            "Records the spool refused because it was full, by reason (max_bytes, min_free).",
            labels=["reason"],
        )
        for reason in sorted({"max_bytes", "min_free", *spool.refused}):
            refused.add_metric([reason], spool.refused.get(reason, 0))
        yield refused
        yield CounterMetricFamily(
            "gpu_audit_spool_evicted_records",
            "Records deleted before every sink had them, to make room (spool.when_full: "
            "drop_oldest). Each sink also counts them as dropped{reason=spool_skipped}.",
            value=spool.evicted,
        )
