"""The exporter's side of the spool: the audit producer's writer, opened at start-up and
re-opened after failures, and, when the shipper runs in another process, the segment GC
the writer must run (only the spool's single writer may delete segments).

Never raises out of a cycle for a spool it cannot write: the producer counts the records
it could not write and the exporter keeps serving.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpu_audit.model.snapshot import Snapshot
from gpu_audit.spool import (
    CursorStore,
    SpoolError,
    SpoolLocked,
    SpoolWriteError,
    SpoolWriter,
    gc_floor,
)
from gpu_audit.spool.config import SpoolConfig

log = logging.getLogger("gpu_audit.exporter")


@dataclass(frozen=True, slots=True)
class SpoolGcPlan:
    """Split mode (`gpu-audit exporter` beside `gpu-audit shipper`): the exporter is the
    spool's only writer, so it deletes the segments these cursors have all passed."""

    cursor_names: tuple[str, ...]
    interval_s: float


class ReopeningSpool:
    """The spool writer, opened at start-up and re-opened after failures.

    A spool another live process writes is a refusal at start-up (`open_at_start` raises
    SpoolLocked): two writers would duplicate the trail. Any other spool that cannot be
    opened (permission, read-only or full disk) must not stop the exporter: commits fail
    with SpoolWriteError, the audit producer counts the records it could not write,
    /metrics keeps serving, and every cycle tries to open the spool again.
    """

    def __init__(self, config: SpoolConfig) -> None:
        self._config = config
        self._writer: SpoolWriter | None = None
        self._lock = threading.Lock()
        self.last_error = ""

    def open_at_start(self) -> None:
        """Open the writer (taking the spool's lock) before anything is written.

        Raises SpoolLocked when another live process writes this spool; any other
        failure is left to the producer to count, and the spool is re-opened lazily.
        """
        # the producer logs and counts the failure at its first record
        with self._lock, contextlib.suppress(SpoolWriteError):
            self._get(refuse_locked=True)

    def _get(self, *, refuse_locked: bool = False) -> SpoolWriter:
        if self._writer is None:
            try:
                self._writer = SpoolWriter(self._config)
                if self.last_error:
                    log.info("spool %s is writable again", self._config.directory)
                self.last_error = ""
            except SpoolWriteError:
                raise
            except OSError as exc:
                self.last_error = str(exc)
                raise SpoolWriteError.from_oserror(exc, self._config.directory, "open") from None
            except SpoolError as exc:  # SpoolLocked and friends: same outcome, other reason
                if refuse_locked and isinstance(exc, SpoolLocked):
                    raise
                self.last_error = str(exc)
                raise SpoolWriteError("unavailable", self._config.directory, str(exc)) from None
        return self._writer

    @property
    def writer(self) -> SpoolWriter | None:
        return self._writer

    def commit(self, payloads: Sequence[bytes]) -> int:
        with self._lock:
            return self._get().commit(payloads)

    def last_payload(self) -> bytes | None:
        with self._lock:
            try:
                return self._get().last_payload()
            except SpoolWriteError:
                return None

    def close(self) -> None:
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None


class SplitModeGc:
    """Spool garbage collection when the shipper runs in another process.

    Only the writer may delete segments, and in `gpu-audit exporter` + `gpu-audit shipper`
    the exporter is the writer: after a cycle, at most every `gc_interval_s`, it deletes
    the segments every configured sink's committed cursor has passed. A sink without a
    cursor yet pins the whole spool, so nothing it has not seen is ever deleted.
    """

    def __init__(self, spool_dir: Path, plan: SpoolGcPlan, spool: ReopeningSpool) -> None:
        self._cursors = CursorStore(spool_dir)
        self._names = plan.cursor_names
        self._interval = plan.interval_s
        self._spool = spool
        self._last = 0.0

    def __call__(self, _snap: Snapshot) -> None:
        now = time.monotonic()
        writer = self._spool.writer
        if writer is None or now - self._last < self._interval:
            return
        self._last = now
        writer.gc(gc_floor(self._cursors, self._names))
