"""The sampling loop: the only place that calls the backend and reads /proc.

Each cycle reads every GPU (fast tier every `interval_seconds`, slow tier every
`slow_interval_seconds`), attributes processes, renders the exposition once, publishes
the result as the latest snapshot, and hands the snapshot to listeners (the audit
producer). Scrapes only read what the last cycle published, so Prometheus never
triggers NVML, /proc or network work, and the audit trail gets samples whether or not
anyone scrapes.

A failing listener or a failing cycle is logged and counted; it never ends the loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from exporter.backends.base import GpuBackend
from exporter.exposition.render import Renderer, RenderOptions
from gpu_audit.http.state import RenderedSnapshot
from gpu_audit.model.attribution import AttributedProcess
from gpu_audit.model.mig import with_site_weights
from gpu_audit.model.samples import BackendInfo, GpuSample
from gpu_audit.model.snapshot import Snapshot

log = logging.getLogger("gpu_audit.sampler")

SnapshotListener = Callable[[Snapshot], None]


class Attributor(Protocol):
    def attribute(self, gpus: Sequence[GpuSample]) -> dict[str, tuple[AttributedProcess, ...]]:
        ...


@dataclass(frozen=True, slots=True)
class Published:
    """What a scrape reads: the snapshot and its pre-rendered exposition."""

    snapshot: Snapshot
    rendered: RenderedSnapshot
    published_monotonic: float


@dataclass
class SamplerStats:
    cycles: int = 0
    failed_cycles: int = 0
    listener_errors: int = 0
    cpu_seconds: float = 0.0
    last_cycle_cpu_seconds: float = 0.0
    last_render_seconds: float = 0.0
    process_series_dropped: int = 0


class Sampler:
    """Runs the backend on a timer and publishes immutable snapshots."""

    def __init__(
        self,
        backend: GpuBackend,
        backend_info: BackendInfo,
        attributor: Attributor,
        *,
        host: str,
        interval_seconds: float,
        slow_interval_seconds: float,
        render_options: RenderOptions,
        listeners: Sequence[SnapshotListener] = (),
        publish: Callable[[Snapshot, RenderedSnapshot], None] | None = None,
        clock: Callable[[], float] = time.time,
        scenario_clock: Callable[[], float] | None = None,
        before_attribution: Callable[[Sequence[GpuSample]], None] | None = None,
        before_render: Callable[[Snapshot], Snapshot] | None = None,
        mig_weights: Mapping[str, float] | None = None,
    ) -> None:
        self._backend = backend
        self._info = backend_info
        self._attributor = attributor
        self._host = host
        self._interval = interval_seconds
        self._slow_every = max(1, round(slow_interval_seconds / interval_seconds))
        self._renderer = Renderer(render_options)
        self._listeners = list(listeners)
        self._publish = publish
        self._clock = clock
        # The simulator runs its own clock (scenario time can run faster than wall time);
        # snapshots then carry scenario time so accounting over them stays consistent.
        self._scenario_clock = scenario_clock
        self._before_attribution = before_attribution
        # Completes the cycle's snapshot before anyone sees it (the GPU inventory adds
        # GPUs no longer enumerated and what it recorded about them).
        self._before_render = before_render
        self._mig_weights = dict(mig_weights or {})  # exporter.mig_weights
        self._latest: Published | None = None
        self._failing_listeners: set[int] = set()  # by position: logged once until they recover
        self._prev: Snapshot | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.stats = SamplerStats()

    # -- reading --------------------------------------------------------------------------
    def latest(self) -> Published | None:
        return self._latest

    # -- one cycle -----------------------------------------------------------------------
    def run_cycle(self) -> Published:
        """Sample, attribute, render and publish once. Returns what was published."""
        started = time.monotonic()
        cpu_started = time.thread_time()
        cycle = self.stats.cycles
        slow = cycle % self._slow_every == 0
        now = self._scenario_clock() if self._scenario_clock else self._clock()
        gpus = tuple(self._backend.sample(now, slow))
        if self._mig_weights:
            gpus = with_site_weights(gpus, self._mig_weights)
        if self._before_attribution is not None:
            self._before_attribution(gpus)
        processes = self._attributor.attribute(gpus)
        prev = self._prev
        elapsed = max(0.0, now - prev.timestamp) if prev is not None else 0.0
        snap = Snapshot(
            timestamp=now,
            host=self._host,
            backend=self._info,
            gpus=gpus,
            processes=processes,
            interval_seconds=self._interval,
            elapsed_seconds=elapsed,
            sample_duration_seconds=time.monotonic() - started,
            cycle=cycle,
            slow_cycle=slow,
            error_counts=dict(self._backend.error_counts()),
        )
        if self._before_render is not None:
            snap = self._before_render(snap)
        render_started = time.thread_time()
        rendered = self._renderer.render(snap)
        self.stats.last_render_seconds = time.thread_time() - render_started
        self.stats.process_series_dropped += sum(rendered.dropped_process_series.values())
        published = Published(snap, rendered, time.monotonic())
        self._latest = published
        self._prev = snap
        if self._publish is not None:
            self._publish(snap, rendered)
        for i, listener in enumerate(self._listeners):
            try:
                listener(snap)
            except Exception:  # a listener bug must not stop sampling
                self.stats.listener_errors += 1
                if i in self._failing_listeners:
                    log.debug("snapshot listener %r failed again", listener, exc_info=True)
                else:
                    self._failing_listeners.add(i)
                    log.exception("snapshot listener %r failed (repeats are logged at "
                                  "debug level)", listener)
            else:
                if i in self._failing_listeners:
                    self._failing_listeners.discard(i)
                    log.info("snapshot listener %r works again", listener)
        self.stats.cycles += 1
        self.stats.last_cycle_cpu_seconds = time.thread_time() - cpu_started
        self.stats.cpu_seconds += self.stats.last_cycle_cpu_seconds
        return published

    # -- the loop --------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="gpu-audit-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        next_tick = time.monotonic()
        failing = 0  # consecutive failed cycles: the first is logged, then the recovery
        while not self._stop.is_set():
            try:
                self.run_cycle()
            except Exception:  # keep sampling; the next cycle may succeed
                self.stats.failed_cycles += 1
                failing += 1
                if failing == 1:
                    log.exception("sampling cycle failed; retrying every cycle (repeats of "
                                  "this failure are logged at debug level)")
                else:
                    log.debug("sampling cycle failed again (%d in a row)", failing,
                              exc_info=True)
            else:
                if failing:
                    log.info("sampling works again after %d failed cycles", failing)
                failing = 0
            next_tick += self._interval
            now = time.monotonic()
            if next_tick < now:  # overran: skip the missed ticks instead of bursting
                next_tick = now + self._interval - ((now - next_tick) % self._interval)
            self._stop.wait(max(0.0, next_tick - now))

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def counters(self) -> Mapping[str, float]:
        s = self.stats
        return {
            "cycles": s.cycles,
            "failed_cycles": s.failed_cycles,
            "listener_errors": s.listener_errors,
            "cpu_seconds": s.cpu_seconds,
            "process_series_dropped": s.process_series_dropped,
        }
