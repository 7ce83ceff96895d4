"""The audit producer: chains each cycle's records and group-commits them to the spool.

Per host and stream, records get `seq` 1, 2, 3, ... and a hash chain (see canonical.py).
A cycle's records are committed in one `spool.commit` call (one group-commit fsync). The
chain only ever contains records the spool accepted: when a commit fails, its records are
counted as failed by reason and `seq` / `prev_hash` stay where they were, so the next
cycle links to the last record that really exists.

Two cadences (AuditConfig.interval_seconds against the snapshots' sampling interval):
equal, every cycle writes its per-cycle records (schema 2, gpu_audit.audit.builder);
longer, every cycle writes only its events and adds its usage to the interval
(gpu_audit.audit.interval), whose records (schema 3) are written with the cycle that
crosses a multiple of the interval (UTC-aligned), and with `stop()`.

Restart: `start()` resumes the chain from the newest of: the spool's last record when it
is this host's and stream's; a per-stream checkpoint file (AuditConfig.state_directory)
plus a scan of the spool after the checkpoint's offset (the spool is the truth; the
checkpoint only says where to look and survives the shipper deleting delivered
segments); a scan of the whole spool through a reader, when one was given; otherwise
the stream starts at seq 1. When the spool found records after its last readable one
unreadable (damage) and no checkpoint accounts for them, some of them may have been this
stream's, already shipped: their seqs are never issued again. The stream then goes on
after them with a `chain_restart` record (schema 3: a fresh chain, `prev_hash` zeros,
naming the last record known, the seqs that may be lost and the spool offsets).
With `restart_gap_seconds` (the exporter: 1 s), the new life's first record is dated at
least that long after the newest record found: cycles of one stream stay at least 1 s
apart across a restart too, which is what keeps one point per record in a sink with
millisecond points (VictoriaMetrics, shipper/sinks/influxdb/encode.py).

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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from gpu_audit import atomicfile
from gpu_audit.audit.accounting import elapsed_for
from gpu_audit.audit.builder import PartsCache, Record, build_cycle, exporter_event
from gpu_audit.audit.canonical import (
    SCHEMA_V3,
    ZERO_HASH,
    Encoded,
    format_time_ns,
    load_hmac_key,
    record_id,
    seal_chain,
    to_time_ns,
)
from gpu_audit.audit.config import AuditConfig
from gpu_audit.audit.interval import IntervalUsage
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
        restart_gap_seconds: float = 0.0,
        sleep: Any = time.sleep,
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
        self._last_hash = ZERO_HASH  # the hash of record _last_seq: the head a witness keeps
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
        self._usage = IntervalUsage(host=host, stream=config.stream)
        self._usage_ns = round(config.interval_seconds * 1e9)
        self._usage_snap: Snapshot | None = None  # the last sample added to the interval
        self._usage_start = 0  # time_ns where the current interval started
        self._restart: Record | None = None
        # a new life's first record is dated at least this long after the previous life's
        # last one (sinks with millisecond points spread a cycle over 1 s: docs/SHIPPER.md)
        self._restart_gap = restart_gap_seconds
        self._sleep = sleep
        self._last_time_ns = 0  # the newest record of this stream found at start

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Resume the chain from the spool (and checkpoint), then write exporter_start."""
        seq, prev = self._recover()
        with self._chain_lock:
            self._seq, self._prev_hash = seq, prev
            self._started = True
        with self._stats_lock:
            self._last_seq, self._last_hash = seq, prev
        log.info("audit stream %r resumes after seq %d", self._stream, seq)
        self._keep_restart_gap()
        if self._config.enabled:
            first = [self._restart] if self._restart is not None else []
            if self._lifecycle is not None:
                first.append(self._exporter_event(self._lifecycle[0]))
            if first:
                self._commit(first)
        self._restart = None

    def _keep_restart_gap(self) -> None:
        """Wait until the restart gap has passed since the previous life's last record
        (at most the gap itself: a clock set back does not stall the start)."""
        if self._restart_gap <= 0 or not self._last_time_ns:
            return
        wait = self._last_time_ns / 1e9 + self._restart_gap - float(self._clock())
        if wait > 0:
            self._sleep(min(wait, self._restart_gap))

    def on_snapshot(self, snap: Snapshot) -> None:
        """Build, chain and commit the records of one cycle. Never raises for the spool."""
        if not self._config.enabled:
            return
        self._interval = snap.interval_seconds
        per_cycle = self._usage_ns <= round(snap.interval_seconds * 1e9)
        simulated = self._simulated or snap.backend.simulated
        records = build_cycle(
            snap,
            self._prev_snap,
            stream=self._stream,
            exporter_version=self._version,
            host=self._host,
            simulated=simulated,
            max_elapsed_intervals=self._config.max_elapsed_intervals,
            parts=self._parts,
            usage=per_cycle,
        )
        if not per_cycle:
            records = [*self._interval_usage(snap, simulated), *records]
        self._prev_snap = snap
        self._commit(records)

    def _interval_usage(self, snap: Snapshot, simulated: bool) -> list[Record]:
        """Add the cycle to the interval; the interval's records when it crossed a
        multiple of the interval (since the last interval ended)."""
        prev = self._prev_snap
        if prev is not None:
            elapsed = elapsed_for(snap.timestamp, prev.timestamp, snap.interval_seconds,
                                  self._config.max_elapsed_intervals)
            real = snap.timestamp - prev.timestamp
            share = elapsed / real if 0 < elapsed < real else 1.0
            self._usage.add(snap, prev, elapsed, share)
        last = self._usage_snap
        self._usage_snap = snap
        if last is None:  # the first sample: where the first interval starts
            self._usage_start = to_time_ns(snap.timestamp)
            return []
        now = to_time_ns(snap.timestamp)
        if now // self._usage_ns == self._usage_start // self._usage_ns:
            return []
        self._usage_start = now
        return self._usage.emit(now, simulated=simulated)

    def commit_records(self, records: list[Record]) -> None:
        """Chain and commit records built elsewhere (the launcher's job events) into this
        producer's stream; same failure handling as a cycle's records. Never raises for
        the spool."""
        if self._config.enabled:
            self._commit(records)

    def stop(self) -> None:
        """Write the interval so far (its usage ends at the last sample) and
        the stop event (none for a one-shot writer). The caller closes the spool."""
        if self._config.enabled and self._started:
            records: list[Record] = []
            last = self._usage_snap
            if last is not None and self._usage.pending:
                records = self._usage.emit(
                    to_time_ns(last.timestamp),
                    simulated=self._simulated or last.backend.simulated)
            if self._lifecycle is not None:
                records.append(self._exporter_event(self._lifecycle[1]))
            if records:
                self._commit(records)

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

    def head(self) -> tuple[str, int, str]:
        """(host, seq, hash) of the newest record written: the chain head a witness
        keeps (gpu_audit.audit.witness); seq 0 before the first."""
        with self._stats_lock:
            return self._host, self._last_seq, self._last_hash

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

    def _commit(self, records: Sequence[Record | Encoded]) -> None:
        if not records:
            return
        # The chain lock serialises commits (and is held while the spool fsyncs); the
        # counters have their own lock so a scrape never waits on the disk.
        with self._chain_lock:
            payloads, seq, prev = seal_chain(records, self._seq, self._prev_hash, self._key)
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
            self._last_time_ns = max(self._last_time_ns, _time_ns(records[-1]))
            with self._stats_lock:
                self._writable = True
                self._written += len(payloads)
                self._last_seq, self._last_hash = seq, prev
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
        state = {"stream": self._stream, "host": self._host, "seq": self._seq,
                 "hash": self._prev_hash, "offset": first_offset,
                 "time_ns": self._last_time_ns}
        path = self._state_path(directory)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            atomicfile.replace_file(path, orjson.dumps(state))
        except OSError as exc:
            log.debug("audit checkpoint %s not written: %s", path, exc)

    def _state_path(self, directory: Path) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in self._stream)
        return directory / f"audit-stream-{safe}.json"

    def _mine(self, rec: Mapping[str, Any] | None) -> bool:
        """Whether a record (or checkpoint) belongs to this producer's chain: seq and
        prev_hash run per host and stream (records without a host: older checkpoints)."""
        if rec is None or rec.get("stream") != self._stream:
            return False
        host = rec.get("host")
        return host is None or host == self._host

    def _recover(self) -> tuple[int, str]:
        last = _parse(self._spool.last_payload())
        spool_point = _chain_point(last) if last is not None and self._mine(last) else None
        if spool_point is not None and last is not None:
            self._last_time_ns = _time_ns(last)
        damaged_fn = getattr(self._spool, "damaged_after_last", None)
        damaged = int(damaged_fn()) if callable(damaged_fn) else 0
        start_offset: int | None = None
        checkpoint: tuple[int, str] | None = None
        directory = self._config.state_directory
        if directory is not None:
            state = _parse(_read_or_none(self._state_path(directory)))
            if state is not None and self._mine(state):
                checkpoint = _chain_point(state)
                self._last_time_ns = max(self._last_time_ns, _time_ns(state))
                off = state.get("offset")
                start_offset = off if isinstance(off, int) else None
        candidates = [p for p in (spool_point, checkpoint) if p is not None]
        if self._reader is not None and (spool_point is None or damaged):
            scanned = self._scan(start_offset if checkpoint is not None else 0)
            if scanned is not None:
                candidates.append(scanned)
        best = max(candidates, default=(0, ZERO_HASH), key=lambda p: p[0])
        spool_seq = spool_point[0] if spool_point is not None else 0
        if damaged and (checkpoint is None or checkpoint[0] < spool_seq):
            # Up to `damaged` records after the newest readable one may have been ours
            # (and shipped before the damage): skip their seqs, never issue them again.
            # A checkpoint at or past the spool's last record was written after each
            # commit of ours, so it knows: with one, the chain simply goes on.
            self._restart = self._chain_restart(best, damaged)
            log.warning(
                "audit stream %r: %d spool record(s) after seq %d are unreadable; seqs "
                "%d..%d may have been written and are not issued again; the chain restarts "
                "at seq %d (a chain_restart record says so)", self._stream, damaged,
                best[0], best[0] + 1, best[0] + damaged, best[0] + damaged + 1)
            return best[0] + damaged, ZERO_HASH
        return best

    def _chain_restart(self, known: tuple[int, str], damaged: int) -> Record:
        now = self._clock()
        time_ns = to_time_ns(now)
        rec: Record = {
            "schema": SCHEMA_V3, "kind": "event", "event": "chain_restart",
            "id": record_id(self._host, self._stream, "event", event="chain_restart",
                            time_ns=time_ns, gpu_uuid="", process_key=str(known[0]),
                            xid_key=""),
            "stream": self._stream, "host": self._host, "time_ns": time_ns,
            "time": format_time_ns(time_ns),
            "after_seq": known[0], "after_hash": known[1],
            "lost_from": known[0] + 1, "lost_to": known[0] + damaged,
            "reason": f"{damaged} spool record(s) after the newest readable one were "
                      "unreadable when the producer started",
        }
        if self._simulated:
            rec["sim"] = True
        return rec

    def _scan(self, offset: int | None) -> tuple[int, str] | None:
        assert self._reader is not None
        found: tuple[int, str] | None = None
        pos = offset or 0
        while True:
            result = self._reader.read(pos, _SCAN_BATCH, _SCAN_BYTES)
            for _off, payload in result.entries:
                rec = _parse(payload)
                if rec is not None and self._mine(rec):
                    self._last_time_ns = max(self._last_time_ns, _time_ns(rec))
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


def _time_ns(rec: Mapping[str, Any] | Encoded) -> int:
    t = rec[-1] if isinstance(rec, tuple) else rec.get("time_ns")
    return t if isinstance(t, int) and t > 0 else 0


def _chain_point(rec: Mapping[str, Any]) -> tuple[int, str] | None:
    seq, h = rec.get("seq"), rec.get("hash")
    if isinstance(seq, int) and isinstance(h, str) and len(h) == 64:
        return seq, h
    return None
