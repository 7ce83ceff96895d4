"""The audit producer: chains each cycle's records and group-commits them to the spool.

Per stream, records get `seq` 1, 2, 3, ... and a hash chain (see canonical.py). A cycle's
records are committed in one `spool.commit` call (one group-commit fsync). The chain only
ever contains records the spool accepted: when a commit fails, its records are counted as
failed by reason and `seq` / `prev_hash` stay where they were, so the next cycle links to
the last record that really exists.

Restart: `start()` resumes the chain from the spool's last record when it belongs to this
stream; otherwise from a per-stream checkpoint file (AuditConfig.state_directory) plus a
scan of the spool after the checkpoint's offset (the spool is the truth; the checkpoint
only says where to look and survives the shipper deleting delivered segments); otherwise
by scanning the whole spool through a reader, when one was given; otherwise the stream
starts at seq 1.

This module must never raise out of `on_snapshot` for a spool problem (sampling and
/metrics go on), never log per cycle while the spool stays broken (one line per change
of reason), and never log the HMAC key.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from gpu_audit import atomicfile
from gpu_audit.audit.builder import PartsCache, Record, build_records, exporter_event
from gpu_audit.audit.canonical import ZERO_HASH, load_hmac_key, seal
from gpu_audit.audit.config import AuditConfig
from gpu_audit.audit.ports import SpoolReaderPort, SpoolWriterPort
from gpu_audit.model.snapshot import Snapshot
from gpu_audit.spool.errors import SpoolFull, SpoolWriteError

log = logging.getLogger(__name__)

_SCAN_BATCH = 4096
_SCAN_BYTES = 16 * 1024 * 1024


class AuditProducer:
    """Writes the audit records of every snapshot to the spool, hash-chained per stream."""

    def __init__(
        self,
        config: AuditConfig,
        spool: SpoolWriterPort,
        *,
        host: str,
        exporter_version: str,
        simulated: bool,
        reader: SpoolReaderPort | None = None,
        clock: Any = time.time,
        lifecycle_events: tuple[str, str] | None = ("exporter_start", "exporter_stop"),
    ) -> None:
        self._config = config
        # what start() and stop() write: the launcher's stream says launcher_start/stop;
        # None for a one-shot writer (the Slurm epilog adds one record per job)
        self._lifecycle = lifecycle_events
        self._spool = spool
        self._reader = reader
        self._host = host
        self._version = exporter_version
        self._simulated = simulated
        self._clock = clock
        self._stream = config.stream
        self._key: bytes | None = (
            load_hmac_key(config.hmac_key_file) if config.hmac_key_file is not None else None
        )
        self._chain_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self._last_seq = 0
        self._seq = 0
        self._prev_hash = ZERO_HASH
        self._prev_snap: Snapshot | None = None
        self._parts = PartsCache(fragments=True)
        self._written = 0
        self._failed: dict[str, int] = {}
        self._failing_reason: str | None = None
        self._writable = True
        self._started = False
        self._interval = 0.0

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Resume the chain from the spool (and checkpoint), then write exporter_start."""
        seq, prev = self._recover()
        with self._chain_lock:
            self._seq, self._prev_hash = seq, prev
            self._started = True
        with self._stats_lock:
            self._last_seq = seq
        log.info("audit stream %r resumes after seq %d", self._stream, seq)
        if self._config.enabled and self._lifecycle is not None:
            self._commit([self._exporter_event(self._lifecycle[0])])

    def on_snapshot(self, snap: Snapshot) -> None:
        """Build, chain and commit the records of one cycle. Never raises for the spool."""
        if not self._config.enabled:
            return
        self._interval = snap.interval_seconds
        records = build_records(
            snap,
            self._prev_snap,
            stream=self._stream,
            exporter_version=self._version,
            host=self._host,
            simulated=self._simulated or snap.backend.simulated,
            max_elapsed_intervals=self._config.max_elapsed_intervals,
            parts=self._parts,
        )
        self._prev_snap = snap
        self._commit(records)

    def commit_records(self, records: list[Record]) -> None:
        """Chain and commit records built elsewhere (the launcher's job events) into this
        producer's stream; same failure handling as a cycle's records. Never raises for
        the spool."""
        if self._config.enabled:
            self._commit(records)

    def stop(self) -> None:
        """Write exporter_stop. The caller closes the spool."""
        if self._config.enabled and self._started and self._lifecycle is not None:
            self._commit([self._exporter_event(self._lifecycle[1])])

    # --- state -------------------------------------------------------------------------

    def stats(self) -> Mapping[str, int]:
        """records_written, records_failed (all reasons), records_failed.<reason>, last_seq."""
        with self._stats_lock:
            out = {
                "records_written": self._written,
                "records_failed": sum(self._failed.values()),
                "last_seq": self._last_seq,
                "spool_writable": int(self._writable),
            }
            for reason, n in self._failed.items():
                out[f"records_failed.{reason}"] = n
            return out

    def failed_by_reason(self) -> Mapping[str, int]:
        with self._stats_lock:
            return dict(self._failed)

    @property
    def stream(self) -> str:
        return self._stream

    # --- internals ---------------------------------------------------------------------

    def _exporter_event(self, event: str) -> Record:
        return exporter_event(
            event,
            timestamp=self._clock(),
            host=self._host,
            stream=self._stream,
            exporter_version=self._version,
            simulated=self._simulated,
            interval_seconds=self._interval,
        )

    def _commit(self, records: list[Record]) -> None:
        if not records:
            return
        # The chain lock serialises commits (and is held while the spool fsyncs); the
        # counters have their own lock so a scrape never waits on the disk.
        with self._chain_lock:
            seq, prev = self._seq, self._prev_hash
            payloads = []
            for rec in records:
                seq += 1
                payloads.append(seal(rec, seq, prev, self._key))
                prev = rec["hash"]
            reason: str | None = None
            first_offset = -1
            try:
                first_offset = self._spool.commit(payloads)
            except (SpoolFull, SpoolWriteError) as exc:
                reason = exc.reason
            except OSError as exc:
                reason = errno.errorcode.get(exc.errno or 0, "oserror")
            if reason is not None:
                self._count_failure(reason, len(payloads))
                return
            if self._failing_reason is not None:
                log.warning(
                    "spool writable again after %s; the hash chain continues at seq %d",
                    self._failing_reason,
                    self._seq + 1,
                )
                self._failing_reason = None
            self._seq, self._prev_hash = seq, prev
            with self._stats_lock:
                self._writable = True
                self._written += len(payloads)
                self._last_seq = seq
            self._checkpoint(first_offset)

    def _count_failure(self, reason: str, n: int) -> None:
        with self._stats_lock:
            self._failed[reason] = self._failed.get(reason, 0) + n
            self._writable = False
        if reason != self._failing_reason:
            log.warning(
                "audit records not written to the spool (%s); counting them in "
                "gpu_audit_records_failed_total and carrying on",
                reason,
            )
            self._failing_reason = reason

    # The checkpoint is a hint: its own failure only costs a longer scan at the next start.
    def _checkpoint(self, first_offset: int) -> None:
        directory = self._config.state_directory
        if directory is None:
            return
        state = {"stream": self._stream, "seq": self._seq, "hash": self._prev_hash,
                 "offset": first_offset}
        path = self._state_path(directory)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            atomicfile.replace_file(path, orjson.dumps(state))
        except OSError as exc:
            log.debug("audit checkpoint %s not written: %s", path, exc)

    def _state_path(self, directory: Path) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in self._stream)
        return directory / f"audit-stream-{safe}.json"

    def _recover(self) -> tuple[int, str]:
        last = _parse(self._spool.last_payload())
        if last is not None and last.get("stream") == self._stream:
            found = _chain_point(last)
            if found is not None:
                return found
        start_offset: int | None = None
        best: tuple[int, str] | None = None
        directory = self._config.state_directory
        if directory is not None:
            state = _parse(_read_or_none(self._state_path(directory)))
            if state is not None and state.get("stream") == self._stream:
                best = _chain_point(state)
                off = state.get("offset")
                start_offset = off if isinstance(off, int) else None
        if self._reader is not None:
            scanned = self._scan(start_offset if best is not None else 0)
            if scanned is not None and (best is None or scanned[0] >= best[0]):
                best = scanned
        return best if best is not None else (0, ZERO_HASH)

    def _scan(self, offset: int | None) -> tuple[int, str] | None:
        assert self._reader is not None
        found: tuple[int, str] | None = None
        pos = offset or 0
        while True:
            result = self._reader.read(pos, _SCAN_BATCH, _SCAN_BYTES)
            for _off, payload in result.entries:
                rec = _parse(payload)
                if rec is not None and rec.get("stream") == self._stream:
                    point = _chain_point(rec)
                    if point is not None and (found is None or point[0] > found[0]):
                        found = point
            if not result.entries or result.next_offset <= pos:
                return found
            pos = result.next_offset


def _read_or_none(path: Path) -> bytes | None:
    with contextlib.suppress(OSError):
        return path.read_bytes()
    return None


def _parse(payload: bytes | None) -> dict[str, Any] | None:
    if payload is None:
        return None
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _chain_point(rec: Mapping[str, Any]) -> tuple[int, str] | None:
    seq, h = rec.get("seq"), rec.get("hash")
    if isinstance(seq, int) and isinstance(h, str) and len(h) == 64:
        return seq, h
    return None
