"""What the HTTP endpoint serves: the latest rendered snapshot, readiness, and the live
metrics computed at scrape time (snapshot age, scrapes, series dropped by the cap).

The sampler thread calls `LatestState.publish` once per cycle; HTTP handler threads call
`LatestState.state()`, which only swaps a reference, so a scrape never waits for a cycle.
This module must never sample hardware or read /proc.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gpu_audit import selfmetrics as sm
from gpu_audit.model.snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class RenderedSnapshot:
    """The cached exposition of one cycle."""

    body: bytes
    series: int
    dropped_process_series: Mapping[str, int]
    generated_at: float  # wall-clock unix seconds of the render (snapshot age counts from it)
    snapshot_timestamp: float = 0.0
    families: int = 0


@dataclass(frozen=True, slots=True)
class ServingState:
    """One consistent view for a request."""

    rendered: RenderedSnapshot | None
    snapshot: Snapshot | None
    backend_ready: bool
    backend_error: str
    stale_after_seconds: float
    recent_cycle_seconds: tuple[float, ...] = ()
    dropped_process_series_total: Mapping[str, int] = field(default_factory=dict)
    # False for an endpoint that only serves live counters (the standalone shipper):
    # readiness then does not wait for a snapshot.
    snapshots_expected: bool = True


class StateProvider(Protocol):
    def state(self) -> ServingState: ...


class LatestState:
    """Thread-safe holder of the latest cycle, fed by the sampler thread."""

    def __init__(self, stale_after_seconds: float, keep_cycles: int = 20, *,
                 snapshots_expected: bool = True) -> None:
        self._lock = threading.Lock()
        self._stale_after = stale_after_seconds
        self._durations: deque[float] = deque(maxlen=keep_cycles)
        self._dropped: dict[str, int] = {}
        self._state = ServingState(None, None, False, "backend not initialised yet",
                                   stale_after_seconds, snapshots_expected=snapshots_expected)

    def set_backend(self, ready: bool, error: str = "") -> None:
        with self._lock:
            s = self._state
            self._state = ServingState(s.rendered, s.snapshot, ready, error, self._stale_after,
                                       s.recent_cycle_seconds, s.dropped_process_series_total,
                                       s.snapshots_expected)

    def publish(self, snapshot: Snapshot, rendered: RenderedSnapshot) -> None:
        with self._lock:
            self._durations.append(snapshot.sample_duration_seconds)
            for uuid, n in rendered.dropped_process_series.items():
                self._dropped[uuid] = self._dropped.get(uuid, 0) + n
            s = self._state
            self._state = ServingState(rendered, snapshot, s.backend_ready, s.backend_error,
                                       self._stale_after, tuple(self._durations),
                                       dict(self._dropped), s.snapshots_expected)

    def state(self) -> ServingState:
        return self._state  # a reference swap: readers never block the sampler


def snapshot_age(state: ServingState, now: float | None = None) -> float | None:
    if state.rendered is None:
        return None
    return max(0.0, (time.time() if now is None else now) - state.rendered.generated_at)


def readiness(state: ServingState, now: float | None = None) -> tuple[bool, str]:
    """(ready, reason): backend initialised and the snapshot no older than stale_after."""
    if not state.backend_ready:
        return False, f"backend not ready: {state.backend_error or 'not initialised'}"
    if not state.snapshots_expected:
        return True, "ok"
    age = snapshot_age(state, now)
    if age is None:
        return False, "no snapshot yet"
    if age > state.stale_after_seconds:
        return False, (f"snapshot is stale: {age:.1f}s old, limit"
                       f" {state.stale_after_seconds:.1f}s")
    return True, "ok"


class ServingCollector(Collector):
    """Scrape-time families: snapshot age, scrapes served, process series dropped."""

    def __init__(self, provider: StateProvider) -> None:
        self._provider = provider
        self._scrapes = 0
        self._lock = threading.Lock()

    def count_scrape(self) -> None:
        with self._lock:
            self._scrapes += 1

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        state = self._provider.state()
        age = snapshot_age(state)
        if age is not None:
            yield GaugeMetricFamily(sm.SNAPSHOT_AGE.name, sm.SNAPSHOT_AGE.full_help,
                                    value=age)
        # prometheus_client appends _total itself; give it the base name.
        scrapes = CounterMetricFamily(sm.SCRAPES.name.removesuffix("_total"),
                                      sm.SCRAPES.full_help, value=self._scrapes)
        yield scrapes
        dropped = CounterMetricFamily(sm.PROCESS_SERIES_DROPPED.name.removesuffix("_total"),
                                      sm.PROCESS_SERIES_DROPPED.full_help,
                                      labels=list(sm.PROCESS_SERIES_DROPPED.labels))
        snap = state.snapshot
        index = {g.uuid: str(g.info.index) for g in snap.gpus} if snap else {}
        # every GPU at 0 from the start (the cap's first drop then shows in increase())
        totals = {**dict.fromkeys(index, 0), **state.dropped_process_series_total}
        for uuid in sorted(totals):
            dropped.add_metric([index.get(uuid, ""), uuid], totals[uuid])
        yield dropped
