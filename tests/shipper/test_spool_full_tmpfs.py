"""A really full filesystem recovers without a restart.

The spool lives on a 2 MiB tmpfs (a loop-mounted ext4 image where tmpfs cannot be
mounted) with `max_bytes` far above the disk size, so the filesystem's free space
(`min_free_bytes`) is what bites, as in production. The real `SpoolWriter` and `Shipper`
run with an in-process sink that the test takes down and brings back. Space only comes
back when no spool reader keeps a handle on a segment that GC or eviction deleted.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_audit.spool import SpoolFull, SpoolWriter
from gpu_audit.spool.config import SpoolConfig
from gpu_audit.spool.recovery import list_segments
from shipper.config import ShipperConfig
from shipper.engine import Shipper
from tests.polling import wait_for
from tests.shipper.memsinks import MemorySink, record
from tests.smallfs import small_filesystem

DISK = 2 * 1024 * 1024
RECORD = 400  # bytes per record payload
BATCH = 5


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    with small_filesystem(tmp_path, DISK) as target:
        yield target


def _deleted_segments_open(directory: Path) -> list[str]:
    """Segment files this process still holds open although they were deleted."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed between the listing and the readlink
        if target.startswith(str(directory)) and target.endswith(".seg (deleted)"):
            found.append(target)
    return found


def _used(directory: Path) -> int:
    st = os.statvfs(directory)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _live_bytes(directory: Path) -> int:
    """What the live segments take on the filesystem (whole blocks)."""
    return sum(path.stat().st_blocks * 512 for _base, path in list_segments(directory))


class _Producer:
    """Commits fixed-size batches; remembers what was acknowledged and what was refused."""

    def __init__(self, writer: SpoolWriter) -> None:
        self.writer = writer
        self.seq = 0
        self.acked: list[int] = []
        self.refused = 0

    def batch(self) -> bool:
        first = self.seq
        payloads = [record(first + i, size=RECORD) for i in range(BATCH)]
        try:
            self.writer.commit(payloads)
        except SpoolFull:
            self.refused += BATCH
            return False
        self.acked.extend(range(first, first + BATCH))
        self.seq += BATCH
        return True


@pytest.mark.parametrize("min_free", [256 * 1024, 0])
@pytest.mark.parametrize("when_full", ["refuse", "drop_oldest"])
def test_full_filesystem_recovers_without_restart(
    small_fs: Path, fast_config: ShipperConfig, when_full: str, min_free: int
) -> None:
    """Fill a real 2 MiB filesystem with the sink down, bring the sink back: with no
    restart the deleted segments' space is returned (no deleted segment is held open),
    and new records are written again. Under drop_oldest every eviction frees its bytes
    on the filesystem while the sink is still down. With min_free_bytes: 0 the spool
    still leaves the shipper room to commit its cursor, or gc could never free a byte."""
    spool_dir = small_fs / "spool"
    cfg = SpoolConfig(
        directory=spool_dir,
        segment_bytes=32 * 1024,
        max_bytes=64 * DISK,  # far above the disk: the filesystem is what fills up
        min_free_bytes=min_free,
        statvfs_interval_s=1e-6,  # every append asks the filesystem
        fsync_window_ms=1,
        when_full=when_full,
    )
    writer = SpoolWriter(cfg)
    sink = MemorySink("archive")
    shipper = Shipper(fast_config, cfg, writer=writer, sinks=[sink])
    shipper.start()
    producer = _Producer(writer)
    try:
        # Phase 0: the sink keeps up over several segments, and GC deletes them behind it.
        while len(list_segments(spool_dir)) < 6:
            assert producer.batch()
        wait_for(lambda: sink.count() == len(producer.acked), what="first records delivered")
        wait_for(lambda: shipper.gc() >= 0 and len(list_segments(spool_dir)) <= 2,
                   what="delivered segments collected")
        assert _deleted_segments_open(spool_dir) == []

        # Phase 1: the sink is down until the filesystem is full.
        sink.down = True
        if when_full == "refuse":
            while producer.batch():
                assert producer.seq < 100_000, "the filesystem never filled up"
            assert producer.refused
        else:
            while writer.counters.records_evicted == 0:
                assert producer.batch(), "drop_oldest refused instead of evicting"
            # Keep writing well past a disk's worth: every batch fits because each
            # eviction really frees its bytes on the filesystem.
            for _ in range(2 * DISK // (BATCH * RECORD)):
                assert producer.batch(), (
                    f"refused although {writer.counters.records_evicted} records were evicted; "
                    f"deleted segments still open: {_deleted_segments_open(spool_dir)}"
                )
            assert _deleted_segments_open(spool_dir) == []
            # What the filesystem uses is the live segments plus small files (cursor,
            # ledger, directories), not the evicted segments.
            assert _used(spool_dir) <= _live_bytes(spool_dir) + 64 * 1024

        # Phase 2: the sink returns; the backlog is delivered, GC frees it, and with no
        # restart the spool accepts records again.
        sink.down = False
        wait_for(lambda: _caught_up(shipper, writer), what="backlog delivered")
        wait_for(lambda: shipper.gc() >= 0 and _deleted_segments_open(spool_dir) == [],
                   what=f"no deleted segment held open ({_deleted_segments_open(spool_dir)})")
        before = len(producer.acked)
        wait_for(producer.batch, what="the spool accepting records again")
        for _ in range(20):
            assert producer.batch()
        assert len(producer.acked) == before + 21 * BATCH
        wait_for(lambda: _caught_up(shipper, writer), what="the new records delivered")
        assert _used(spool_dir) <= _live_bytes(spool_dir) + 64 * 1024
    finally:
        shipper.stop(5)
        writer.close()
    assert sink.duplicates() == 0
    assert _deleted_segments_open(spool_dir) == []
    missing = {record_id(seq) for seq in producer.acked} - set(sink.docs)
    if when_full == "refuse":
        assert missing == set()
    else:
        # evicted unshipped records are the only ones missing, and each was counted
        assert 0 < len(missing) <= writer.counters.records_evicted


def record_id(seq: int) -> str:
    return f"test-{seq:012d}"


def _caught_up(shipper: Shipper, writer: SpoolWriter) -> bool:
    return all(status.position >= writer.durable_offset for status in shipper.statuses())


@pytest.mark.parametrize("min_free", [256 * 1024, 0])
def test_a_full_filesystem_with_one_default_segment_writes_again(
    small_fs: Path, fast_config: ShipperConfig, min_free: int
) -> None:
    """With the default segment_bytes (64 MiB) on a 2 MiB filesystem
    every record is in the one active segment. Fill it with the sink down, bring the sink
    back: once every record is delivered, gc releases the active segment (a new one
    takes over, the newest record is kept beside it) and the spool writes again, with no
    restart. Defaults otherwise, but the free-space floor (the default 512 MiB would
    refuse every record on 2 MiB) and a statvfs on every append."""
    spool_dir = small_fs / "spool"
    cfg = SpoolConfig(directory=spool_dir, min_free_bytes=min_free, statvfs_interval_s=1e-6)
    assert cfg.segment_bytes == 64 * 1024 * 1024 > DISK
    writer = SpoolWriter(cfg)
    sink = MemorySink("archive")
    shipper = Shipper(fast_config, cfg, writer=writer, sinks=[sink])
    shipper.start()
    producer = _Producer(writer)
    try:
        sink.down = True
        while producer.batch():
            assert producer.seq < 100_000, "the filesystem never filled up"
        assert len(list_segments(spool_dir)) == 1
        last = writer.last_payload()
        sink.down = False
        wait_for(lambda: _caught_up(shipper, writer), what="backlog delivered")
        before = len(producer.acked)
        wait_for(lambda: shipper.gc() >= 0 and producer.batch(),
                   what="the spool accepting records again")
        for _ in range(20):
            assert producer.batch()
        assert len(producer.acked) == before + 21 * BATCH
        wait_for(lambda: _caught_up(shipper, writer), what="the new records delivered")
        assert last is not None
    finally:
        shipper.stop(5)
        writer.close()
    assert sink.duplicates() == 0
    assert {record_id(seq) for seq in producer.acked} <= set(sink.docs)
    # the newest record survives a restart although its segment was released
    reopened = SpoolWriter(cfg)
    try:
        assert reopened.last_payload() == record(producer.seq - 1, size=RECORD)
    finally:
        reopened.close()
