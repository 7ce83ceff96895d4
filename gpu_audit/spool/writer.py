"""The spool's single writer: append frames, group-commit fsync, roll, bound, and gc segments.

A producer's record is acknowledged (``commit`` returns) only after an fsync covers it;
concurrent committers share one fsync. Disk bounds are checked before a byte is written,
and a failed write is truncated away, so the log never holds a torn frame written by a
live writer. This module must never drop an appended record silently: every refusal,
disk error and discarded unsynced record is counted.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType

from gpu_audit import atomicfile
from gpu_audit.errors import LockHeld
from gpu_audit.lockfile import ProcessLock
from gpu_audit.spool.config import SpoolConfig
from gpu_audit.spool.errors import SpoolFull, SpoolLocked, SpoolWriteError
from gpu_audit.spool.format import (
    HEADER_SIZE,
    MAX_PAYLOAD,
    encode_frames,
    encode_header,
    header_problem,
    scan_segment,
)
from gpu_audit.spool.format import segment_name as _segment_name
from gpu_audit.spool.recovery import (
    LAST_RECORD_FILE,
    LiveSegment,
    describe_damage,
    evidence_kept,
    quarantine,
    read_last_record,
    recover,
)

log = logging.getLogger("gpu_audit.spool")

LOCK_FILE = "LOCK"
# The spool never takes a filesystem's last bytes, whatever min_free_bytes says: the
# shipper must still be able to commit its cursors and ledgers there (new small files),
# or gc could never run and a full spool would stay full until a restart.
RESERVE_BYTES = 64 * 1024

FsyncFn = Callable[[int], None]
WriteFn = Callable[[int, memoryview], int]
StatvfsFn = Callable[[Path], os.statvfs_result]


@dataclass
class SpoolCounters:
    """Everything the writer did that a self-metric should show."""

    records_appended: int = 0
    fsyncs: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # records, by "max_bytes"/"min_free"
    write_errors: dict[str, int] = field(default_factory=dict)  # by errno name
    records_discarded_unsynced: int = 0  # appended, then lost with a failed fsync
    records_evicted: int = 0  # deleted unshipped to make room (when_full: drop_oldest)
    torn_tails_truncated: int = 0
    torn_bytes_truncated: int = 0
    # Records lost to damage (a corrupt frame, a bad header), counted once, when their
    # segment's bytes are first kept in quarantine/ (by recovery or by gc's check)
    records_corrupt: int = 0
    segments_quarantined: int = 0  # damaged segments kept in quarantine/ (link, copy, move)
    segments_deleted: int = 0


def _statvfs(path: Path) -> os.statvfs_result:
    return os.statvfs(path)


class SpoolWriter:
    """Append-only writer of one spool directory (exclusive: see `SpoolLocked`)."""

    def __init__(
        self,
        config: SpoolConfig,
        *,
        fsync: FsyncFn = os.fsync,
        write: WriteFn = os.write,
        statvfs: StatvfsFn = _statvfs,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config
        self._dir = Path(config.directory)
        self._fsync = fsync
        self._write = write
        self._statvfs = statvfs
        self._clock = clock
        self._wlock = threading.Lock()
        self._cond = threading.Condition(threading.Lock())
        self.counters = SpoolCounters()
        self._dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = self._acquire_lock()
        try:
            self._open_segments()
        except BaseException:
            self._release_lock()
            raise
        self._closed = False
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        if config.fsync_window_ms > 0:
            self._flusher = threading.Thread(
                target=self._flush_loop, name="spool-flusher", daemon=True
            )
            self._flusher.start()

    # -- opening -------------------------------------------------------------------------

    def _acquire_lock(self) -> ProcessLock:
        # taken before recovery reads or truncates anything, released with the process
        try:
            return ProcessLock.acquire(self._dir / LOCK_FILE, f"spool {self._dir}")
        except LockHeld as exc:
            raise SpoolLocked(self._dir, exc.holder) from None

    def _release_lock(self) -> None:
        self._lock_fd.release()

    def _open_segments(self) -> None:
        found = recover(self._dir, full_scan=self._config.recovery_scan == "full")
        for finding in found.findings:
            log.warning("spool recovery: %s", finding)
        self.counters.torn_tails_truncated = found.torn_tails
        self.counters.torn_bytes_truncated = found.torn_bytes
        self.counters.segments_quarantined = len(found.quarantined)
        self.counters.records_corrupt = found.corrupt_records
        self.recovery_findings = list(found.findings)
        self._verified = set(found.verified)
        self._gc_lock = threading.Lock()
        self._segments: list[LiveSegment] = found.segments
        self._next = found.next_offset
        last = read_last_record(self._dir, self._segments)
        self._last_payload = last[1] if last is not None else None
        # Records after the newest readable one that this recovery found unreadable
        # (damage, not a torn tail, whose offsets are handed out again): a producer may
        # have issued them, and its chain must not issue their seqs again.
        self._damaged_after_last = (max(0, found.next_offset - last[0] - 1)
                                    if last is not None and found.corrupt_records else 0)
        self._last_kept = (last[0] if last is not None
                           and not any(seg.size > HEADER_SIZE for seg in found.segments)
                           else None)
        self._starved = False
        if found.last_appendable:
            active = self._segments[-1]
            self._fd = os.open(self._dir / _segment_name(active.base), os.O_WRONLY | os.O_APPEND)
            # Whatever a crashed predecessor left in the page cache becomes durable now,
            # so everything recovered counts as durable.
            os.fsync(self._fd)
            self._active_records = self._next - active.base
        else:
            self._fd = self._create_segment(self._next)
            self._segments.append(LiveSegment(self._next, HEADER_SIZE))
            self._active_records = 0
        self._size = sum(segment.size for segment in self._segments)
        self._durable = self._next
        self._durable_pos = self._segments[-1].size
        self._epoch = 0
        self._epoch_end: dict[int, tuple[int, SpoolWriteError]] = {}
        self._syncing = False
        self._dirty_tail: int | None = None
        self._free: int | None = None
        self._free_at = 0.0

    def _create_segment(self, base: int) -> int:
        path = self._dir / _segment_name(base)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o640)
        try:
            self._write_all(fd, encode_header(base))
            self._fsync_dir()
        except OSError:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        return fd

    def _fsync_dir(self) -> None:
        dfd = os.open(self._dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self._fsync(dfd)
        finally:
            os.close(dfd)

    # -- public state ---------------------------------------------------------------------

    @property
    def directory(self) -> Path:
        return self._dir

    @property
    def next_offset(self) -> int:
        """The offset the next appended record will get."""
        return self._next

    @property
    def durable_offset(self) -> int:
        """One past the last record an fsync has covered."""
        return self._durable

    @property
    def size_bytes(self) -> int:
        """Bytes in live segments (what `max_bytes` bounds)."""
        return self._size

    def last_payload(self) -> bytes | None:
        """The newest record, or None for an empty spool."""
        return self._last_payload

    def damaged_after_last(self) -> int:
        """How many records after `last_payload()` recovery found unreadable (damage):
        offsets that may have held records of a producer's chain."""
        return self._damaged_after_last

    # -- appending -----------------------------------------------------------------------

    def append(self, payloads: Sequence[bytes]) -> int:
        """Write records with one write(); not yet durable. Returns the first offset."""
        with self._wlock:
            first, _epoch = self._append_locked(payloads)
        if payloads:
            self._dirty.set()
        return first

    def commit(self, payloads: Sequence[bytes]) -> int:
        """Append and return only once an fsync covers the records (shared with others)."""
        with self._wlock:
            first, epoch = self._append_locked(payloads)
            target = self._next
        self._sync_until(target, epoch)
        return first

    def sync(self) -> int:
        """Make everything appended so far durable; returns `durable_offset`."""
        with self._wlock:
            self._check_open()
            target, epoch = self._next, self._epoch
        self._sync_until(target, epoch)
        return self._durable

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"spool writer for {self._dir} is closed")

    def _append_locked(self, payloads: Sequence[bytes]) -> tuple[int, int]:
        self._check_open()
        first = self._next
        if not payloads:
            return first, self._epoch
        longest = max(map(len, payloads))  # (in C: a commit holds a whole cycle)
        if longest > MAX_PAYLOAD:
            raise ValueError(f"record of {longest} bytes exceeds {MAX_PAYLOAD}")
        data = encode_frames(first, payloads)
        active = self._segments[-1]
        roll = self._active_records > 0 and active.size + len(data) > self._config.segment_bytes
        self._check_space(len(data) + (HEADER_SIZE if roll else 0), len(payloads))
        if roll:
            self._roll()
            active = self._segments[-1]
        path = self._dir / _segment_name(active.base)
        if self._dirty_tail is not None:
            self._truncate_to(self._dirty_tail, path)
        while True:
            try:
                self._write_all(self._fd, data)
                break
            except OSError as exc:
                self._truncate_after_failed_write(active.size, path)
                if self._evict_for(exc):
                    continue
                raise self._write_error(exc, path, "write") from exc
        active.size += len(data)
        self._size += len(data)
        if self._free is not None:
            self._free -= len(data)
        self._next += len(payloads)
        self._active_records += len(payloads)
        self._last_payload = bytes(payloads[-1])
        self._starved = False
        self.counters.records_appended += len(payloads)
        return first, self._epoch

    def _write_all(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[self._write(fd, view) :]

    def _truncate_after_failed_write(self, good_size: int, path: Path) -> None:
        try:
            os.ftruncate(self._fd, good_size)
        except OSError:
            # Retried before the next write, which refuses to go ahead until it succeeds.
            self._dirty_tail = good_size
            log.exception("spool: cannot truncate %s after a failed write", path)

    def _truncate_to(self, size: int, path: Path) -> None:
        try:
            os.ftruncate(self._fd, size)
        except OSError as exc:
            raise self._write_error(exc, path, "truncate a failed write") from exc
        self._dirty_tail = None

    def _write_error(self, exc: OSError, path: Path, action: str) -> SpoolWriteError:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            self._starved = True
        error = SpoolWriteError.from_oserror(exc, path, action)
        errors = self.counters.write_errors
        errors[error.reason] = errors.get(error.reason, 0) + 1
        return error

    def _check_space(self, nbytes: int, records: int) -> None:
        """Raise SpoolFull (counted) when `nbytes` more would pass a bound.

        Under `when_full: drop_oldest` the oldest whole segments are evicted first, each
        eviction counted and logged, until the append fits or only the segment holding
        the newest record is left.
        """
        full = self._full(nbytes)
        if full is not None and self._config.when_full == "drop_oldest":
            while full is not None and self._evict_oldest():
                full = self._full(nbytes)
        if full is not None:
            self._refuse(full[0], records)
            raise SpoolFull(*full)

    def _full(self, nbytes: int) -> tuple[str, str] | None:
        """(reason, detail) when `nbytes` more would pass max_bytes or min_free."""
        cfg = self._config
        if self._size + nbytes > cfg.max_bytes:
            return ("max_bytes", f"{self._dir} holds {self._size} bytes; {nbytes} more would "
                                 f"pass max_bytes={cfg.max_bytes}")
        now = self._clock()
        if self._free is None or now - self._free_at >= cfg.statvfs_interval_s:
            try:
                stat = self._statvfs(self._dir)
            except OSError as exc:
                raise self._write_error(exc, self._dir, "statvfs") from exc
            self._free = stat.f_bavail * stat.f_frsize
            self._free_at = now
        floor = max(cfg.min_free_bytes, RESERVE_BYTES)
        if self._free - nbytes < floor:
            return ("min_free", f"{self._free} bytes free on the filesystem of {self._dir}; "
                                f"min_free_bytes={cfg.min_free_bytes} (at least "
                                f"{RESERVE_BYTES} are always left free)")
        return None

    def _evict_oldest(self) -> bool:
        """Delete the oldest segment to make room (drop_oldest); False when none may go.

        Never the active segment nor the one holding the newest record. Its records are
        counted in `records_evicted`; readers that had not passed them see a gap
        (`skipped_to`) and count it, so nothing disappears silently.
        """
        keep_from = len(self._segments) - (1 if self._newest_elsewhere() else 2)
        if len(self._segments) < 2 or keep_from <= 0:
            return False
        oldest, following = self._segments[0], self._segments[1]
        (self._dir / _segment_name(oldest.base)).unlink()
        self._segments.pop(0)
        self._size -= oldest.size
        if self._free is not None:
            self._free += oldest.size
        evicted = following.base - oldest.base
        self.counters.records_evicted += evicted
        self.counters.segments_deleted += 1
        self._fsync_dir()
        log.warning("spool %s full (when_full: drop_oldest): evicted %d records at offsets "
                    "%d..%d", self._dir, evicted, oldest.base, following.base - 1)
        return True

    def _evict_for(self, exc: OSError) -> bool:
        """Under drop_oldest a write that found the filesystem full (the cached free space
        was stale, or another process filled it) evicts the oldest segment and is tried
        again; False when that does not apply or nothing more may be evicted."""
        return (
            exc.errno in (errno.ENOSPC, errno.EDQUOT)
            and self._config.when_full == "drop_oldest"
            and self._dirty_tail is None
            and self._evict_oldest()
        )

    def _refuse(self, reason: str, records: int) -> None:
        self.counters.refused[reason] = self.counters.refused.get(reason, 0) + records
        self._starved = True

    def _roll(self) -> None:
        old = self._segments[-1]
        old_path = self._dir / _segment_name(old.base)
        try:
            self._fsync(self._fd)
        except OSError as exc:
            error = self._write_error(exc, old_path, "fsync before roll")
            self._discard_unsynced(error)
            raise error from exc
        with self._cond:
            self._durable = self._next
            self._cond.notify_all()
        base = self._next
        try:
            fd = self._create_segment(base)
        except OSError as exc:
            raise self._write_error(exc, self._dir / _segment_name(base), "create") from exc
        os.close(self._fd)
        self._fd = fd
        self._segments.append(LiveSegment(base, HEADER_SIZE))
        self._size += HEADER_SIZE
        self._active_records = 0
        with self._cond:
            self._durable_pos = HEADER_SIZE

    # -- group commit --------------------------------------------------------------------

    def _sync_until(self, target: int, epoch: int) -> None:
        while True:
            with self._cond:
                while True:
                    ended = self._epoch_end.get(epoch)
                    if ended is not None:
                        # A failed fsync ended this writer epoch: records past what was
                        # durable then were cut off and must be reported as not written.
                        if target > ended[0]:
                            raise ended[1]
                        return
                    if self._durable >= target:
                        return
                    if not self._syncing:
                        self._syncing = True
                        break
                    self._cond.wait()
            try:
                self._lead_sync()
            finally:
                with self._cond:
                    self._syncing = False
                    self._cond.notify_all()

    def _lead_sync(self) -> None:
        """One fsync covering everything appended so far (this thread is the leader)."""
        with self._wlock:
            self._check_open()
            target, epoch = self._next, self._epoch
            base, pos = self._segments[-1].base, self._segments[-1].size
            fd = os.dup(self._fd)
        try:
            self._fsync(fd)
        except OSError as exc:
            with self._wlock:
                if epoch == self._epoch and base == self._segments[-1].base:
                    path = self._dir / _segment_name(base)
                    error = self._write_error(exc, path, "fsync")
                    self._discard_unsynced(error)
                # Otherwise a roll fsynced the whole segment since: the records are durable.
            return
        finally:
            os.close(fd)
        with self._cond:
            self.counters.fsyncs += 1
            if epoch == self._epoch and target > self._durable:
                self._durable = target
                if base == self._segments[-1].base:
                    self._durable_pos = max(self._durable_pos, pos)

    def _discard_unsynced(self, error: SpoolWriteError) -> None:
        """After a failed fsync the unsynced bytes may or may not be on disk: cut them off
        so nothing is ever read back that was never acknowledged (caller holds _wlock)."""
        with self._cond:
            active = self._segments[-1]
            keep = self._durable_pos
            lost = self._next - self._durable
            try:
                os.ftruncate(self._fd, keep)
            except OSError:
                self._dirty_tail = keep
            self._size -= active.size - keep
            active.size = keep
            self._active_records -= lost
            self._next = self._durable
            self.counters.records_discarded_unsynced += lost
            self._epoch_end[self._epoch] = (self._durable, error)
            self._epoch += 1
            self._cond.notify_all()
        if lost:
            last = read_last_record(self._dir, self._segments)
            self._last_payload = last[1] if last is not None else None

    def _flush_loop(self) -> None:
        window = self._config.fsync_window_ms / 1000.0
        while True:
            self._dirty.wait()
            if self._stop.wait(window):
                return
            self._dirty.clear()
            try:
                self.sync()
            except SpoolWriteError as exc:
                log.error("spool: background fsync failed: %s", exc)
            except ValueError:
                return

    # -- garbage collection ------------------------------------------------------------

    def _newest_elsewhere(self) -> bool:
        """Whether the newest record is not in a segment before the active one: in the
        active segment, or kept in the last-record file."""
        return self._active_records > 0 or self._last_kept == self._next - 1

    def _release_active(self, min_offset: int) -> None:
        """A starved spool (refused for space) whose active segment every sink has
        passed: keep its newest record in the last-record file, then start a new active
        segment, so gc may delete the old one. Without this a spool whose records all fit
        in one segment (a filesystem smaller than `segment_bytes`) never wrote again."""
        with self._wlock:
            self._check_open()
            if not (self._starved and self._active_records and min_offset >= self._next
                    and self._last_payload is not None and self._dirty_tail is None):
                return
            last = self._next - 1
            frame = encode_frames(last, [self._last_payload])
            atomicfile.replace_file(self._dir / LAST_RECORD_FILE, frame, mode=0o640)
            self._last_kept = last
            self._roll()
            log.info("spool %s: every sink has passed the active segment and the spool is "
                     "full: released it (the newest record, offset %d, is kept in %s)",
                     self._dir, last, LAST_RECORD_FILE)

    def gc(self, min_offset: int) -> int:
        """Delete whole segments whose records are all below `min_offset`, oldest first.

        Never the active segment, nor the one holding the newest record (unless the
        last-record file keeps it). A spool refusing records for space releases its
        active segment once every sink has passed it (`_release_active`). Each segment is
        CRC-checked before it goes (unless recovery already did): a damaged one has its
        bytes kept in quarantine/ first and its lost records counted, so gc never deletes
        the only evidence of corruption. Returns bytes freed.
        """
        with self._gc_lock:
            try:
                self._release_active(min_offset)
            except OSError as exc:  # no room even for that: the next gc tries again
                log.warning("spool %s: releasing the active segment failed: %s", self._dir, exc)
            with self._wlock:
                self._check_open()
                keep_from = max(len(self._segments) - (1 if self._newest_elsewhere() else 2), 0)
                # bases grow, so this is a prefix: segments go oldest first
                doomed = [
                    (seg.base, seg.size, following.base)
                    for seg, following in zip(
                        self._segments[:keep_from], self._segments[1:], strict=False
                    )
                    if following.base <= min_offset
                ]
            # Segments below the active one never change: check them without the lock.
            keep = {
                base for base, size, following in doomed
                if base not in self._verified and self._damaged(base, size, following)
            }
            freed = 0
            with self._wlock:
                for base, size, _following in doomed:
                    if not self._segments or self._segments[0].base != base:
                        continue  # evicted meanwhile (when_full: drop_oldest)
                    path = self._dir / _segment_name(base)
                    if base in keep:
                        # the evidence: moved, which needs no space on a full disk
                        name = quarantine(path)
                        self.counters.segments_quarantined += 1
                        log.error("spool gc: %s kept as quarantine/%s", path.name, name)
                    else:
                        path.unlink()
                        freed += size
                    self._segments.pop(0)
                    self._verified.discard(base)
                    self._size -= size
                    self.counters.segments_deleted += 1
                if doomed:
                    self._fsync_dir()
                    # ask the filesystem again on the next append: a refusing spool
                    # (min_free) must see the space come back at once
                    self._free = None
        return freed

    def _damaged(self, base: int, size: int, following: int) -> bool:
        """Before gc deletes a segment: whether it is damaged evidence that quarantine/
        does not hold yet (its lost records are counted here, once)."""
        path = self._dir / _segment_name(base)
        try:
            with path.open("rb") as handle:
                data = handle.read(size)
        except FileNotFoundError:
            return False  # evicted meanwhile (when_full: drop_oldest): nothing to keep
        problem = header_problem(data, base)
        if problem is None:
            scan = scan_segment(data, base)
            # a segment below the active one was fsynced whole: an incomplete frame in it
            # is damage too
            if not scan.damage and scan.torn_pos is None:
                return False
            lost = scan.lost + (following - scan.next_offset if scan.torn_pos is not None else 0)
            detail = describe_damage(path.name, scan)
        else:
            lost = following - base
            detail = f"{path.name}: byte 0: {problem}"
        if evidence_kept(path, data):
            return False
        self.counters.records_corrupt += lost
        log.error("spool gc: %s; %d record(s) lost", detail, lost)
        return True

    # -- closing -------------------------------------------------------------------------

    def close(self) -> None:
        """Sync, stop the flusher and release the lock. Safe to call twice."""
        if self._closed:
            return
        self._stop.set()
        self._dirty.set()
        if self._flusher is not None:
            self._flusher.join()
        try:
            self.sync()
        finally:
            with self._wlock:
                self._closed = True
                os.close(self._fd)
                self._release_lock()

    def counters_snapshot(self) -> SpoolCounters:
        return replace(
            self.counters,
            refused=dict(self.counters.refused),
            write_errors=dict(self.counters.write_errors),
        )

    def __enter__(self) -> SpoolWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
