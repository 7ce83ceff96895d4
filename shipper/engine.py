"""The shipper: one durable log (the spool), one worker thread and cursor per sink.

`Shipper` wires the spool (reader, cursor store, and the writer when the producer runs in
the same process) to the sinks, runs a `SinkWorker` per sink, deletes spool segments
that every configured sink's committed cursor has passed, and reports its state as a
stats dict and a Prometheus collector.

Two ways to run:
- embedded (`gpu-audit run`): the producer's `SpoolWriter` is passed in; workers read up
  to its durable (fsynced) offset, so nothing is shipped that a crash could still lose,
  and the engine runs the spool's segment GC.
- standalone (`gpu-audit shipper`): another process writes the spool and holds its
  single-writer lock, so it runs the GC (`gpu_audit.spool.gc_floor` gives it the
  offset); this engine only reads what is readable and commits cursors.

What it sees of the spool (its end, whether it refuses records, its size) and the
directory locks are shipper/spoolview.py; one sink's loop is shipper/delivery/worker.py.

One shipper at a time per spool: the engine locks `<spool>/shipper/.shipper.lock` (the
cursors and ledgers), its dead-letter directory and every archive directory before it
reads any of their state, and a second shipper on any of them is refused (`LockHeld`
naming the holder's pid). The locks die with the process.

A sink's cursor never moves because of another sink, a sink removed from the
configuration keeps its cursor file but no longer holds back GC (a warning says so), and
nothing here ever drops a record: every record is delivered, dead-lettered with a reason,
or counted as dropped with a reason.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from gpu_audit.errors import EXIT_FAILURE, EXIT_OK
from gpu_audit.lockfile import ProcessLock
from gpu_audit.spool import CursorStore, SpoolReader, SpoolWriter, gc_floor
from gpu_audit.spool.config import SpoolConfig, default_deadletter_dir
from shipper.config import ShipperConfig
from shipper.deadletter import DeadLetterFile
from shipper.delivery.backoff import Backoff
from shipper.delivery.worker import SinkWorker
from shipper.ledger import Ledger
from shipper.metrics import ShipperCollector, SinkStatus, SpoolStatus
from shipper.sinks.archive.config import ArchiveSinkConfig
from shipper.sinks.base import Sink
from shipper.sinks.registry import create_sink
from shipper.spoolview import FullState, SpoolEnd, lock_directories, spool_status

log = logging.getLogger(__name__)



class Shipper:
    def __init__(
        self,
        config: ShipperConfig,
        spool_config: SpoolConfig,
        *,
        writer: SpoolWriter | None = None,
        sinks: Sequence[Sink] | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Any] | None = None,
        backoff: Backoff | None = None,
        seal_key: bytes | None = None,
    ) -> None:
        self.config = config
        self.spool_dir = Path(spool_config.directory)
        self._writer = writer
        self._clock = clock
        self._stopping = threading.Event()
        # the default sleep wakes up at once when stop() is called
        self._sleep: Callable[[float], Any] = sleep or self._stopping.wait
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        self._end_probe = SpoolEnd(self.spool_dir)
        self._full = FullState()
        self._cursors = CursorStore(self.spool_dir)
        if sinks is None:
            sinks = [create_sink(cfg, spool_dir=self.spool_dir, seal_key=seal_key)
                     for cfg in config.sinks]
        self.sinks = list(sinks)
        names = [s.name for s in self.sinks]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise ValueError(f"sink names must be unique (they name cursors): {duplicated}")
        self._check_removed(names)
        deadletter_dir = config.deadletter_dir or default_deadletter_dir(self.spool_dir)
        ledger_dir = self.spool_dir / "shipper"
        # before any cursor, ledger or dead-letter file is read: another shipper's state
        # read now would be stale the moment it writes again
        self._locks = self._lock_directories(ledger_dir, deadletter_dir)
        try:
            self._build_workers(config, ledger_dir, deadletter_dir, clock, backoff)
        except BaseException:
            self._release_locks()
            raise
        self._gc_thread: threading.Thread | None = None
        self._gc_freed = 0
        self._started = False

    def _lock_directories(self, ledger_dir: Path, deadletter_dir: Path) -> list[ProcessLock]:
        archives = [cfg.directory_for(self.spool_dir) for cfg in self.config.sinks
                    if isinstance(cfg, ArchiveSinkConfig)]
        return lock_directories(self.spool_dir, ledger_dir, deadletter_dir, archives)

    def _release_locks(self) -> None:
        for lock in self._locks:
            lock.release()

    def _build_workers(
        self,
        config: ShipperConfig,
        ledger_dir: Path,
        deadletter_dir: Path,
        clock: Callable[[], float],
        backoff: Backoff | None,
    ) -> None:
        backoff = backoff or Backoff(
            base=config.backoff_base_s,
            cap=config.backoff_cap_s,
            retry_after_max=config.retry_after_max_s,
        )
        self.workers = [
            SinkWorker(
                sink,
                config=config,
                # readers keep position state: one each
                reader_factory=lambda: SpoolReader(self.spool_dir),
                cursors=self._cursors,
                deadletters=DeadLetterFile(deadletter_dir, sink.name),
                ledger=Ledger(ledger_dir, sink.name),
                end_offset=self._end_offset,
                limit_offset=self._limit_offset,
                backoff=backoff,
                clock=clock,
                sleep=self._sleep,
                stopping=self._stopping,
            )
            for sink in self.sinks
        ]

    def _check_removed(self, names: Sequence[str]) -> None:
        for orphan in sorted(set(self._cursors.names()) - set(names)):
            log.warning(
                "spool %s has a cursor for sink %r, which is not configured: it no longer "
                "holds back segment deletion (delete %s once that sink is gone for good)",
                self.spool_dir, orphan, self._cursors.path(orphan),
            )

    # ---- spool positions ---------------------------------------------------------

    def _limit_offset(self) -> int | None:
        # embedded: never ship what is not yet fsynced (a crash could still lose it)
        return self._writer.durable_offset if self._writer is not None else None

    def _end_offset(self) -> int:
        if self._writer is not None:
            return self._writer.durable_offset
        return self._end_probe.end()

    # ---- lifecycle ---------------------------------------------------------------

    @property
    def started(self) -> bool:
        return self._started

    def start(self) -> None:
        if self._started:
            raise RuntimeError("shipper already started")
        if not self._locks or not self._locks[0].held:
            raise RuntimeError("shipper already stopped (its locks are released)")
        self._started = True
        for worker in self.workers:
            worker.start()
        if self._writer is not None:
            self._gc_thread = threading.Thread(target=self._gc_loop, name="shipper-gc", daemon=True)
            self._gc_thread.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Stop reading, let in-flight sends finish, commit cursors, close sinks.

        Waits up to `timeout` (default: shutdown_grace_s) for the workers. Returns False
        when one was still inside a send at the end (its position is committed anyway;
        what it was sending stays in the spool).
        """
        grace = self.config.shutdown_grace_s if timeout is None else timeout
        self._stopping.set()
        if not self._started:  # a failed start-up: nothing ran, nothing to commit
            self._release_locks()
            return True
        try:
            return self._stop_workers(grace)
        finally:
            self._release_locks()

    def _stop_workers(self, grace: float) -> bool:
        deadline = time.monotonic() + grace
        clean = True
        for worker in self.workers:
            if worker.thread is None:
                continue
            worker.thread.join(max(0.0, deadline - time.monotonic()))
            if worker.thread.is_alive():
                clean = False
                log.warning("sink %s: still sending after %.1fs; leaving it", worker.name, grace)
        for worker in self.workers:
            worker.commit()
        if self._gc_thread is not None:
            self._gc_thread.join(max(0.0, deadline - time.monotonic()))
        if self._writer is not None:
            self.gc()
        return clean

    def drain(self, timeout: float | None = None) -> bool:
        """Before a graceful stop: deliver what the spool holds now.

        Waits until every sink that is not blocked (auth/config hold) has passed the
        current end of the spool, at most `timeout` (default shutdown_grace_s). Returns
        False when time ran out; what is left stays in the spool for the next start.
        """
        grace = self.config.shutdown_grace_s if timeout is None else timeout
        target = self._end_offset()
        deadline = time.monotonic() + grace
        while True:
            pending = [s.sink for s in (w.status(lag=False) for w in self.workers)
                       if s.blocked_reason is None and s.position < target]
            if not pending:
                return True
            if time.monotonic() >= deadline:
                log.warning("shutdown: sinks %s did not catch up within %.1fs; their "
                            "records stay in the spool", ", ".join(pending), grace)
                return False
            time.sleep(0.05)

    def run_forever(self) -> int:
        """Standalone mode: run until SIGTERM/SIGINT, then stop cleanly; the exit code."""

        requested = threading.Event()

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            log.info("received %s: delivering what is spooled, then stopping",
                     signal.Signals(signum).name)
            requested.set()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            interval = self.config.log_summary_interval_seconds
            next_summary = time.monotonic() + interval
            while not requested.wait(min(1.0, interval or 1.0)) and not self._stopping.is_set():
                if interval > 0 and time.monotonic() >= next_summary:
                    next_summary = time.monotonic() + interval
                    log.info("%s", self.summary_line())
            self.drain()
            clean = self.stop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return EXIT_OK if clean else EXIT_FAILURE

    def summary_line(self) -> str:
        """One line for the standalone shipper's periodic log: spool and every sink."""
        spool = self.spool_status()
        state = f"REFUSING records ({spool.full_reason})" if spool.full_reason else "accepting"
        sinks = []
        for st in self.statuses():
            text = (f"{st.sink} {st.state}, {st.delivered} delivered, lag {st.lag_records} "
                    f"records/{st.lag_seconds:.0f}s")
            if st.blocked_reason:
                text += f" (held: {st.blocked_reason})"
            sinks.append(text)
        return (f"shipping: spool {spool.bytes} bytes in {spool.segments} segments, {state}; "
                f"sinks: {', '.join(sinks) or 'none'}")

    # ---- segment GC ----------------------------------------------------------------

    def gc(self) -> int:
        """Delete spool segments every configured sink's committed cursor has passed."""
        if self._writer is None:
            return 0
        floor = gc_floor(self._cursors, [w.name for w in self.workers])
        freed = self._writer.gc(floor)
        self._gc_freed += freed
        return freed

    def _gc_loop(self) -> None:
        while not self._stopping.wait(self.config.gc_interval_s):
            try:
                self.gc()
            except OSError:
                # a failed unlink leaves the segment for the next round; nothing is lost
                log.exception("spool GC failed; retrying in %.0fs", self.config.gc_interval_s)

    # ---- observability -----------------------------------------------------------

    def statuses(self) -> list[SinkStatus]:
        return [w.status() for w in self.workers]

    def spool_status(self) -> SpoolStatus:
        return spool_status(self.spool_dir, self._writer, self._end_probe, self._full)

    def collector(self) -> ShipperCollector:
        return ShipperCollector(self.statuses, self.spool_status, self._clock)

    def stats(self) -> dict[str, Any]:
        spool = self.spool_status()
        sinks: dict[str, Any] = {}
        for st in self.statuses():
            sinks[st.sink] = {
                "kind": st.kind,
                "position": st.position,
                "committed": st.committed,
                "delivered": st.delivered,
                "dead_lettered": st.dead_lettered,
                "dropped": dict(st.dropped),
                "retried": st.retried,
                "redelivered": st.redelivered,
                "lag_records": st.lag_records,
                "lag_seconds": st.lag_seconds,
                "last_success": st.last_success,
                "blocked": st.blocked_reason,
                "state": st.state,
                "conservation_ok": st.conservation_ok,
            }
        return {
            "spool": {
                "bytes": spool.bytes,
                "segments": spool.segments,
                "produced": spool.produced,
                "full_reason": spool.full_reason,
                "gc_freed_bytes": self._gc_freed,
            },
            "sinks": sinks,
        }
