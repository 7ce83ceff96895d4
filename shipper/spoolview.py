"""What the shipper sees of the spool and its directories: the spool's end for a shipper
without the writer in-process, whether the spool refuses records now, the spool's size
for the metrics, and the one-shipper-per-directory locks.

Read-only towards the spool: nothing here deletes, writes or moves a cursor. The locks
are taken before any cursor, ledger or dead-letter file is read, so two shippers never
work on the same state (`LockHeld` names the holder's pid); they die with the process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

from gpu_audit.lockfile import ProcessLock
from gpu_audit.spool import SpoolReader, SpoolWriter
from shipper.metrics import SpoolStatus

LOCK_FILE = ".shipper.lock"


class SpoolEnd:
    """The spool's end as a reader sees it, for a shipper without the writer in-process.

    It reads forward from where it last stopped, so each record is scanned once in total;
    a fresh reader each time so that no cached segment state can hide new records.
    """

    def __init__(self, directory: Path, max_age: float = 0.5) -> None:
        self._dir = directory
        self._end = 0
        self._at = -max_age
        self._max_age = max_age  # every sink's status asks; one scan serves them all
        self._lock = threading.Lock()

    def end(self) -> int:
        with self._lock:
            if time.monotonic() - self._at < self._max_age:
                return self._end
            with SpoolReader(self._dir) as reader:
                while True:
                    result = reader.read(self._end, 4096, 4 * 1024 * 1024)
                    if result.next_offset == self._end:
                        break
                    self._end = result.next_offset
            self._at = time.monotonic()
            return self._end


class FullState:
    """Whether the spool refuses records now: from the first refused append until the
    next append that succeeds (the writer keeps counters, not a state)."""

    def __init__(self) -> None:
        self._refused: dict[str, int] = {}
        self._appended = 0
        self._reason: str | None = None
        self._lock = threading.Lock()

    def update(self, refused: dict[str, int], appended: int) -> str | None:
        with self._lock:
            grew = [r for r, n in refused.items() if n > self._refused.get(r, 0)]
            if grew:
                self._reason = sorted(grew)[0]
            elif appended > self._appended:
                self._reason = None
            self._refused = dict(refused)
            self._appended = appended
            return self._reason


def spool_status(
    spool_dir: Path, writer: SpoolWriter | None, end_probe: SpoolEnd, full: FullState
) -> SpoolStatus:
    """The spool's size, end and refusals now (the writer's counters when in-process)."""
    segments = 0
    size = 0
    for seg in spool_dir.glob("*.seg"):
        try:
            size += seg.stat().st_size
        except FileNotFoundError:
            continue  # deleted by GC between the listing and the stat
        segments += 1
    if writer is None:
        return SpoolStatus(size, segments, end_probe.end(), None, {})
    counters = writer.counters_snapshot()
    return SpoolStatus(
        bytes=size,
        segments=segments,
        produced=writer.next_offset,
        full_reason=full.update(counters.refused, counters.records_appended),
        refused=dict(counters.refused),
        evicted=counters.records_evicted,
        corrupt=counters.records_corrupt,
    )


def lock_directories(
    spool_dir: Path, ledger_dir: Path, deadletter_dir: Path, archive_dirs: Sequence[Path]
) -> list[ProcessLock]:
    """Lock the shipper state of the spool, the dead-letter directory and every archive
    directory (each once), or lock none and raise LockHeld."""
    wanted = [
        (ledger_dir, f"the shipper state (cursors, ledgers) of spool {spool_dir}"),
        (deadletter_dir, f"dead-letter directory {deadletter_dir}"),
        *((directory, f"archive directory {directory}") for directory in archive_dirs),
    ]
    held: list[ProcessLock] = []
    seen: set[Path] = set()
    try:
        for directory, what in wanted:
            key = directory.resolve()
            if key in seen:  # flock conflicts even within one process: lock once
                continue
            seen.add(key)
            held.append(ProcessLock.acquire(directory / LOCK_FILE, what))
    except BaseException:
        for lock in held:
            lock.release()
        raise
    return held
