"""Writer behaviour: group commit, disk bounds, disk errors, locking, gc, last_payload."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import pytest

from gpu_audit.spool import SpoolFull, SpoolLocked, SpoolReader, SpoolWriteError, SpoolWriter
from gpu_audit.spool.writer import RESERVE_BYTES
from tests.core.spool.conftest import read_all


def test_concurrent_committers_share_fsyncs_and_return_only_when_durable(make_config) -> None:  # type: ignore[no-untyped-def]
    """Many threads committing at once share fsyncs (fewer fsyncs than commits), and every
    commit returns only after an fsync that started after its records were written."""
    lock = threading.Lock()
    fsynced_upto: list[int] = []  # writer.next_offset seen at the start of each fsync
    holder: dict[str, SpoolWriter] = {}

    def slow_fsync(fd: int) -> None:
        with lock:
            start = holder["w"].next_offset if "w" in holder else 0
        time.sleep(0.004)  # a disk that takes its time: committers pile up behind it
        os.fsync(fd)
        with lock:
            fsynced_upto.append(start)

    cfg = make_config(segment_bytes=1 << 24)
    writer = SpoolWriter(cfg, fsync=slow_fsync)
    holder["w"] = writer
    commits_per_thread, threads = 25, 8
    violations: list[str] = []

    def producer(tag: int) -> None:
        for i in range(commits_per_thread):
            first = writer.commit([f"{tag}-{i}".encode()])
            if writer.durable_offset <= first:
                violations.append(f"commit of {first} returned before durable")
            with lock:
                if not any(start > first for start in fsynced_upto):
                    violations.append(f"no fsync covered {first}")

    pool = [threading.Thread(target=producer, args=(t,)) for t in range(threads)]
    fsyncs_before = writer.counters.fsyncs
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    total = commits_per_thread * threads
    shared = writer.counters.fsyncs - fsyncs_before
    writer.close()
    assert violations == []
    assert shared < total / 2, f"{shared} fsyncs for {total} commits"
    entries, _ = read_all(cfg.directory)
    assert sorted(p for _o, p in entries) == sorted(
        f"{t}-{i}".encode() for t in range(threads) for i in range(commits_per_thread)
    )


def test_append_is_made_durable_by_the_background_window(make_config) -> None:  # type: ignore[no-untyped-def]
    """append() alone is not acknowledged, but the flusher syncs it within the window."""
    cfg = make_config(fsync_window_ms=20)
    with SpoolWriter(cfg) as writer:
        writer.append([b"a", b"b"])
        deadline = time.monotonic() + 5
        while writer.durable_offset < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert writer.durable_offset == 2


def test_max_bytes_refuses_whole_batch_and_counts(make_config) -> None:  # type: ignore[no-untyped-def]
    """Reaching max_bytes raises SpoolFull("max_bytes"), counts the refused records, writes
    nothing of the batch, and the writer keeps working once gc frees space."""
    cfg = make_config(max_bytes=8192, segment_bytes=4096)
    with SpoolWriter(cfg) as writer:
        writer.commit([b"x" * 1000] * 3)
        size = writer.size_bytes
        with pytest.raises(SpoolFull) as caught:
            writer.commit([b"y" * 1000] * 6)
        assert caught.value.reason == "max_bytes"
        assert writer.counters.refused == {"max_bytes": 6}
        assert writer.size_bytes == size
        assert writer.next_offset == 3
        writer.commit([b"z" * 1000] * 3)  # rolls into a second segment, still fits
        writer.gc(min_offset=3)
        writer.commit([b"w" * 1000] * 3)
    entries, skips = read_all(cfg.directory)
    assert [o for o, _ in entries] == [3, 4, 5, 6, 7, 8] and skips == [3]


class FakeStatvfs:
    def __init__(self, free: int) -> None:
        self.free = free
        self.calls = 0

    def __call__(self, path: Path) -> os.statvfs_result:
        self.calls += 1
        return os.statvfs_result((4096, 1, 1000, self.free, self.free, 10, 10, 10, 0, 255))


def test_min_free_refuses_and_statvfs_is_cached(make_config) -> None:  # type: ignore[no-untyped-def]
    """Below min_free_bytes the append raises SpoolFull("min_free") with nothing written;
    statvfs is consulted at most once per interval and writes in between are subtracted."""
    now = [0.0]
    # (offset by the reserve the writer always leaves, so min_free_bytes is what bites)
    fake = FakeStatvfs(free=RESERVE_BYTES + 10_000)
    cfg = make_config(min_free_bytes=RESERVE_BYTES + 5_000, statvfs_interval_s=1.0)
    with SpoolWriter(cfg, statvfs=fake, clock=lambda: now[0]) as writer:
        writer.commit([b"a" * 1000] * 2)
        writer.commit([b"a" * 1000] * 2)  # cached free shrinks by what was written
        with pytest.raises(SpoolFull) as caught:
            writer.commit([b"b" * 1000] * 2)
        assert caught.value.reason == "min_free"
        assert fake.calls == 1
        assert writer.counters.refused == {"min_free": 2}
        assert writer.next_offset == 4
        fake.free = 1_000_000
        with pytest.raises(SpoolFull):
            writer.commit([b"c" * 1000])  # the cached figure still applies
        now[0] = 2.0
        assert writer.commit([b"c"]) == 4
        assert fake.calls == 2


def test_last_bytes_of_the_filesystem_are_never_taken(make_config) -> None:  # type: ignore[no-untyped-def]
    """Even with min_free_bytes: 0 the spool refuses (reason min_free) before the
    filesystem is full, so the shipper can still commit its cursors there and gc can
    free space; otherwise a spool that filled its disk stayed full until a restart."""
    fake = FakeStatvfs(free=RESERVE_BYTES + 1_500)
    cfg = make_config(min_free_bytes=0)
    with SpoolWriter(cfg, statvfs=fake, clock=lambda: 0.0) as writer:
        writer.commit([b"a" * 1000])
        with pytest.raises(SpoolFull) as caught:
            writer.commit([b"b" * 1000])
        assert caught.value.reason == "min_free"
        assert writer.counters.refused == {"min_free": 1}


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS])
def test_write_error_leaves_no_torn_frame_and_recovers(make_config, code: int) -> None:  # type: ignore[no-untyped-def]
    """A disk error half-way through a write raises SpoolWriteError(errno name), the
    partial frame is truncated away, and appends work again once the disk recovers."""
    failing = [True]

    def flaky_write(fd: int, data: memoryview) -> int:
        if failing[0] and len(data) > 100:
            os.write(fd, data[: len(data) // 2])  # half lands on disk, then the error
            raise OSError(code, os.strerror(code))
        return os.write(fd, data)

    cfg = make_config()
    with SpoolWriter(cfg, write=flaky_write) as writer:
        writer.commit([b"ok"])
        with pytest.raises(SpoolWriteError) as caught:
            writer.commit([b"big" * 100, b"more"])
        assert caught.value.reason == errno.errorcode[code]
        assert writer.counters.write_errors == {errno.errorcode[code]: 1}
        assert writer.next_offset == 1
        failing[0] = False
        assert writer.commit([b"after" * 50]) == 1
    entries, _ = read_all(cfg.directory)
    assert entries == [(0, b"ok"), (1, b"after" * 50)]
    with SpoolWriter(cfg) as writer:
        assert writer.counters.torn_tails_truncated == 0


def test_fsync_error_fails_the_commit_and_discards_unsynced_records(make_config) -> None:  # type: ignore[no-untyped-def]
    """ENOSPC from fsync: the commit raises, its records are cut off (never read back as
    if acknowledged), durable records stay, and later commits succeed."""
    failing = [False]

    def flaky_fsync(fd: int) -> None:
        if failing[0]:
            raise OSError(errno.ENOSPC, "No space left on device")
        os.fsync(fd)

    cfg = make_config()
    with SpoolWriter(cfg, fsync=flaky_fsync) as writer:
        writer.commit([b"durable"])
        failing[0] = True
        with pytest.raises(SpoolWriteError) as caught:
            writer.commit([b"lost-1", b"lost-2"])
        assert caught.value.reason == "ENOSPC"
        assert writer.counters.records_discarded_unsynced == 2
        assert writer.next_offset == 1 and writer.durable_offset == 1
        assert writer.last_payload() == b"durable"
        failing[0] = False
        assert writer.commit([b"later"]) == 1
    entries, _ = read_all(cfg.directory)
    assert entries == [(0, b"durable"), (1, b"later")]


def test_second_writer_is_refused(make_config) -> None:  # type: ignore[no-untyped-def]
    """A spool has one writer: a second one (even in the same process) gets SpoolLocked
    naming the holder, and can open once the first closes."""
    cfg = make_config()
    with SpoolWriter(cfg), pytest.raises(SpoolLocked, match=f"pid {os.getpid()}"):
        SpoolWriter(cfg)
    with SpoolWriter(cfg) as writer:
        assert writer.next_offset == 0


def test_gc_keeps_active_newest_and_needed_segments(make_config) -> None:  # type: ignore[no-untyped-def]
    """gc deletes only whole segments below min_offset, oldest first; never the active
    segment nor the one holding the newest record, whatever min_offset says."""
    cfg = make_config(segment_bytes=4096)
    with SpoolWriter(cfg) as writer:
        for _ in range(4):
            writer.commit([b"r" * 1000] * 3)  # one segment per commit: bases 0, 3, 6, 9
        segments = sorted(p.name for p in cfg.directory.glob("*.seg"))
        assert len(segments) == 4
        assert writer.gc(min_offset=5) > 0  # only segment 0 is wholly below 5
        assert sorted(p.name for p in cfg.directory.glob("*.seg")) == segments[1:]
        writer.gc(min_offset=10**9)
        assert sorted(p.name for p in cfg.directory.glob("*.seg")) == segments[3:]
        assert writer.last_payload() == b"r" * 1000
    with SpoolReader(cfg.directory) as reader:
        result = reader.read(0)
        assert result.skipped_to == 9 and [o for o, _ in result.entries] == [9, 10, 11]


def test_gc_keeps_newest_record_after_roll_to_empty_segment(make_config) -> None:  # type: ignore[no-untyped-def]
    """When the active segment holds no record yet, the newest record's segment stays."""
    cfg = make_config(segment_bytes=4096)
    with SpoolWriter(cfg) as writer:
        writer.commit([b"r" * 3000])
        writer.commit([b"s" * 3000])  # rolls: segment 1 is active and holds offset 1
        writer.gc(min_offset=10**9)
        assert writer.last_payload() == b"s" * 3000
        assert len(list(cfg.directory.glob("*.seg"))) == 1
    with SpoolWriter(cfg) as writer:
        assert writer.last_payload() == b"s" * 3000
        assert writer.next_offset == 2


def test_reader_follows_a_concurrent_writer(make_config) -> None:  # type: ignore[no-untyped-def]
    """A reader polling while a writer appends across segment rolls sees every record
    exactly once, in order, and never beyond the durable limit it is given."""
    cfg = make_config(segment_bytes=8192)
    total = 3000
    writer = SpoolWriter(cfg)
    done = threading.Event()

    def produce() -> None:
        for start in range(0, total, 17):
            writer.commit([f"rec-{i}".encode() * 9 for i in range(start, min(start + 17, total))])
        done.set()

    thread = threading.Thread(target=produce)
    thread.start()
    seen: list[int] = []
    with SpoolReader(cfg.directory) as reader:
        offset = 0
        deadline = time.monotonic() + 60
        while len(seen) < total and time.monotonic() < deadline:
            limit = writer.durable_offset
            result = reader.read(offset, max_records=50, limit_offset=limit)
            assert result.skipped_to is None
            for o, payload in result.entries:
                assert o < limit
                assert payload == f"rec-{o}".encode() * 9
                seen.append(o)
            offset = result.next_offset
    thread.join()
    writer.close()
    assert seen == list(range(total))
