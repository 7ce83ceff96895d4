"""Torn tails versus corrupt frames, and damage in older segments.

A torn tail is an incomplete last write (the frame runs past the end of the file, the file
ends inside a frame header, or the tail is zero-filled blocks that were never written): it
was never acknowledged and is truncated. A complete frame with a bad CRC is corruption of
an acknowledged record: the segment's bytes are kept under quarantine/, the damaged records
are counted (`SpoolCounters.records_corrupt`), every valid frame is still readable, and no
offset is ever handed out again. GC never deletes that evidence.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpu_audit.spool import SpoolConfig, SpoolWriter
from gpu_audit.spool.format import FRAME_HEAD_SIZE, HEADER_SIZE
from gpu_audit.spool.recovery import QUARANTINE_DIR, list_segments
from tests.core.spool.conftest import read_all

PAYLOADS = [bytes([65 + i % 26]) * (10 + (i * 37) % 300) for i in range(120)]


def _config(directory: Path, scan: str = "tail") -> SpoolConfig:
    return SpoolConfig(
        directory=directory,
        segment_bytes=4096,
        min_free_bytes=0,
        fsync_window_ms=0,
        recovery_scan=scan,
    )


def _build(directory: Path, payloads: list[bytes] = PAYLOADS) -> list[tuple[Path, int, list[int]]]:
    """A spool of several segments: (file, base offset, frame start positions) each."""
    with SpoolWriter(_config(directory)) as writer:
        for start in range(0, len(payloads), 7):
            writer.commit(payloads[start : start + 7])
    layout = []
    for base, path in list_segments(directory):
        starts = []
        pos = HEADER_SIZE
        size = path.stat().st_size
        while pos < size:
            starts.append(pos)
            pos += FRAME_HEAD_SIZE + len(payloads[base + len(starts) - 1])
        layout.append((path, base, starts))
    return layout


def _flip(path: Path, pos: int, mask: int = 0x40) -> bytes:
    """Flip bits of one byte; returns the damaged file's bytes."""
    data = bytearray(path.read_bytes())
    data[pos] ^= mask
    path.write_bytes(bytes(data))
    return bytes(data)


def _metric(shipper: Any, name: str) -> float | None:
    registry = CollectorRegistry()
    registry.register(shipper.collector())
    return registry.get_sample_value(name)


def _quarantine(directory: Path) -> list[bytes]:
    qdir = directory / QUARANTINE_DIR
    return [p.read_bytes() for p in sorted(qdir.iterdir())] if qdir.is_dir() else []


def test_flipped_byte_in_newest_frame_is_quarantined_not_truncated(tmp_path: Path) -> None:
    """One flipped payload byte in the newest, complete frame is corruption, not a torn
    tail: the record is counted as lost, the bytes are kept in quarantine/, nothing is
    truncated, and the next record gets a new offset (the damaged one is never reused)."""
    directory = tmp_path / "spool"
    layout = _build(directory)
    path, _base, starts = layout[-1]
    last = len(PAYLOADS) - 1
    damaged = _flip(path, starts[-1] + FRAME_HEAD_SIZE + 2)
    with SpoolWriter(_config(directory)) as writer:
        assert writer.counters.torn_tails_truncated == 0
        assert writer.counters.records_corrupt == 1
        assert writer.counters.segments_quarantined == 1
        assert writer.next_offset == len(PAYLOADS)
        assert writer.commit([b"after"]) == len(PAYLOADS)
    assert _quarantine(directory) == [damaged]
    entries, skips = read_all(directory)
    assert entries == [*enumerate(PAYLOADS[:last]), (len(PAYLOADS), b"after")]
    assert skips == [len(PAYLOADS)]


def test_damaged_length_of_newest_frame_is_corruption(tmp_path: Path) -> None:
    """A flipped bit in the newest frame's length field makes it seem to run past the end
    of the file; its CRC still matches the bytes that are there, so it is a complete
    record with a damaged header: quarantined and counted, its offset not reused."""
    directory = tmp_path / "spool"
    layout = _build(directory)
    path, _base, starts = layout[-1]
    damaged = _flip(path, starts[-1] + 1, 0x10)  # length += 4096
    with SpoolWriter(_config(directory)) as writer:
        assert writer.counters.torn_tails_truncated == 0
        assert writer.counters.records_corrupt == 1
        assert writer.next_offset == len(PAYLOADS)
    assert _quarantine(directory) == [damaged]


@pytest.mark.parametrize("where", ["after_last_frame", "inside_last_frame"])
def test_zero_filled_tail_is_torn_and_truncated(tmp_path: Path, where: str) -> None:
    """Blocks allocated but never written read back as zeros after a power cut: a tail of
    zeros (after the last frame, or from a block boundary inside it) is an incomplete
    write, truncated and counted as torn, with nothing quarantined."""
    directory = tmp_path / "spool"
    payloads = [*PAYLOADS[:20], b"x" * 3000]
    layout = _build(directory, payloads)
    path, _base, starts = layout[-1]
    data = bytearray(path.read_bytes())
    if where == "after_last_frame":
        data += bytes(4096)
        survivors = len(payloads)
    else:
        block = (starts[-1] + FRAME_HEAD_SIZE + 511) // 512 * 512
        data[block:] = bytes(len(data) - block)
        survivors = len(payloads) - 1
    path.write_bytes(bytes(data))
    with SpoolWriter(_config(directory)) as writer:
        assert writer.counters.torn_tails_truncated == 1
        assert writer.counters.records_corrupt == 0
        assert writer.counters.segments_quarantined == 0
        assert writer.next_offset == survivors
    assert _quarantine(directory) == []
    entries, skips = read_all(directory)
    assert entries == list(enumerate(payloads[:survivors]))
    assert skips == []


def test_frame_cut_short_is_still_a_torn_tail(tmp_path: Path) -> None:
    """A newest frame that runs past the end of the file (the write stopped part-way) is
    truncated; its offset was never acknowledged and is handed out again."""
    directory = tmp_path / "spool"
    layout = _build(directory)
    path, _base, starts = layout[-1]
    with path.open("r+b") as handle:
        handle.truncate(starts[-1] + FRAME_HEAD_SIZE + 3)
    with SpoolWriter(_config(directory)) as writer:
        assert writer.counters.torn_tails_truncated == 1
        assert writer.counters.records_corrupt == 0
        assert writer.next_offset == len(PAYLOADS) - 1


@pytest.mark.parametrize("scan", ["tail", "full"])
def test_older_segment_damage_keeps_evidence_and_every_valid_frame(
    tmp_path: Path, scan: str
) -> None:
    """A flipped byte inside an older segment: every valid frame (including the ones after
    the damage) is still read, exactly the damaged record is skipped, the segment's bytes
    are kept in quarantine/ once, the record is counted once, and GC past it never deletes
    the evidence (whether recovery found it, with `full`, or GC's own check, with `tail`)."""
    directory = tmp_path / "spool"
    layout = _build(directory)
    path, base, starts = layout[1]
    lost = base + 1
    damaged = _flip(path, starts[1] + FRAME_HEAD_SIZE + 1)
    with SpoolWriter(_config(directory, scan)) as writer:
        entries, skips = read_all(directory)
        assert [o for o, _ in entries] == [o for o in range(len(PAYLOADS)) if o != lost]
        assert all(PAYLOADS[o] == p for o, p in entries)
        assert skips == [lost + 1]
        assert writer.counters.records_corrupt == (1 if scan == "full" else 0)
        writer.commit([b"new"])
        writer.gc(writer.next_offset)
        assert writer.counters.records_corrupt == 1
        assert writer.counters.segments_quarantined == 1
        assert not path.exists()
    assert _quarantine(directory) == [damaged]
    # A restart finds nothing new to count or copy.
    with SpoolWriter(_config(directory, scan)) as writer:
        assert writer.counters.records_corrupt == 0
        writer.gc(writer.next_offset)
        assert writer.counters.records_corrupt == 0
    assert _quarantine(directory) == [damaged]


def test_full_scan_restart_does_not_count_or_copy_twice(tmp_path: Path) -> None:
    """With `recovery_scan: full`, damage still live in an older segment is found at every
    open; it is copied to quarantine/ and counted only the first time."""
    directory = tmp_path / "spool"
    layout = _build(directory)
    path, _base, starts = layout[2]
    damaged = _flip(path, starts[0] + FRAME_HEAD_SIZE)
    for expected in (1, 0):
        with SpoolWriter(_config(directory, "full")) as writer:
            assert writer.counters.records_corrupt == expected
    assert _quarantine(directory) == [damaged]


@pytest.mark.parametrize("scan", ["tail", "full"])
def test_sink_gets_every_valid_record_and_counts_exactly_the_damaged_one(
    tmp_path: Path, scan: str
) -> None:
    """End to end through the shipper: after damage in an older segment and in the newest
    frame, the sink receives every valid record once, and exactly the two damaged records
    are counted as dropped{reason=spool_skipped}."""
    from shipper.config import ShipperConfig
    from shipper.engine import Shipper
    from tests.polling import wait_for
    from tests.shipper.memsinks import MemorySink, record

    directory = tmp_path / "spool"
    payloads = [record(i, size=150) for i in range(120)]
    layout = _build(directory, payloads)
    path, base, starts = layout[1]
    _flip(path, starts[2] + FRAME_HEAD_SIZE + 5)
    last_path, _b, last_starts = layout[-1]
    _flip(last_path, last_starts[-1] + FRAME_HEAD_SIZE + 5)
    lost = {base + 2, len(payloads) - 1}
    config = ShipperConfig(sinks=[], batch_max_records=50, batch_max_wait_s=0.01,
                           poll_interval_s=0.01, commit_interval_s=0, gc_interval_s=0.05)
    cfg = _config(directory, scan)
    writer = SpoolWriter(cfg)
    sink = MemorySink("archive")
    shipper = Shipper(config, cfg, writer=writer, sinks=[sink])
    shipper.start()
    try:
        writer.commit([record(1000)])
        wait_for(lambda: shipper.statuses()[0].position >= writer.durable_offset,
                   what="sink caught up")
        status = shipper.statuses()[0]
        assert status.dropped == {"spool_skipped": 2}
        # the spool's own count reaches 2 too: at recovery (full scan, or the newest
        # segment) or when gc checks the older segment before deleting it (tail scan)
        wait_for(lambda: _metric(shipper, "gpu_audit_spool_corrupt_records_total") == 2,
                   what="gpu_audit_spool_corrupt_records_total == 2")
    finally:
        shipper.stop(5)
        writer.close()
    expected = {f"test-{i:012d}" for i in range(120) if i not in lost} | {"test-000000001000"}
    assert set(sink.docs) == expected
    assert sink.duplicates() == 0
