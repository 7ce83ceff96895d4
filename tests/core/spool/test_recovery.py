"""Crash recovery: torn tails are truncated, corruption is quarantined, numbering continues."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_audit.spool import SpoolConfig, SpoolReader, SpoolWriter
from gpu_audit.spool.format import FRAME_HEAD_SIZE, HEADER_SIZE
from gpu_audit.spool.recovery import QUARANTINE_DIR, list_segments
from tests.core.spool.conftest import read_all

PAYLOADS = [bytes([i % 251]) * (10 + (i * 37) % 300) for i in range(120)]


def _build(directory: Path) -> list[tuple[Path, int, list[int]]]:
    """A spool of several segments; returns (file, size, frame end positions) per segment."""
    cfg = SpoolConfig(directory=directory, segment_bytes=4096, min_free_bytes=0, fsync_window_ms=0)
    with SpoolWriter(cfg) as writer:
        for start in range(0, len(PAYLOADS), 7):
            writer.commit(PAYLOADS[start : start + 7])
    layout = []
    offset = 0
    for base, path in list_segments(directory):
        assert base == offset
        ends = []
        pos = HEADER_SIZE
        size = path.stat().st_size
        while pos < size:
            pos += FRAME_HEAD_SIZE + len(PAYLOADS[offset])
            ends.append(pos)
            offset += 1
        layout.append((path, size, ends))
    return layout


_TEMPLATE: dict[str, Path] = {}


def _template() -> Path:
    if "dir" not in _TEMPLATE:
        root = Path(tempfile.mkdtemp(prefix="spool-template-"))
        _build(root / "spool")
        _TEMPLATE["dir"] = root / "spool"
    return _TEMPLATE["dir"]


@settings(max_examples=120, deadline=None)
@given(cut_fraction=st.floats(min_value=0.0, max_value=1.0))
def test_truncation_at_any_byte_recovers_every_complete_frame(cut_fraction: float) -> None:
    """Cut the spool's byte stream anywhere: reopening keeps every complete frame before
    the cut, truncates the torn tail, and the next append continues at the right offset."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "spool"
        shutil.copytree(_template(), directory)
        layout = []
        offset = 0
        for base, path in list_segments(directory):
            size = path.stat().st_size
            count = 0
            pos = HEADER_SIZE
            while pos < size:
                pos += FRAME_HEAD_SIZE + len(PAYLOADS[base + count])
                count += 1
            layout.append((path, size, base, count))
            offset += count
        total = sum(size for _p, size, _b, _c in layout)
        cut = int(cut_fraction * total)
        survivors = 0
        consumed = 0
        cut_done = False
        for path, size, base, _count in layout:
            if cut_done:
                path.unlink()
                continue
            if consumed + size <= cut:
                consumed += size
                survivors = base + _count
                continue
            keep = cut - consumed
            with path.open("r+b") as handle:
                handle.truncate(keep)
            pos = HEADER_SIZE
            survivors = base
            while keep >= HEADER_SIZE:
                nxt = pos + FRAME_HEAD_SIZE + len(PAYLOADS[survivors])
                if nxt > keep:
                    break
                pos = nxt
                survivors += 1
            cut_done = True
        cfg = SpoolConfig(
            directory=directory, segment_bytes=4096, min_free_bytes=0, fsync_window_ms=0
        )
        with SpoolWriter(cfg) as writer:
            assert writer.next_offset == survivors
            assert writer.counters.segments_quarantined == 0
            assert writer.last_payload() == (PAYLOADS[survivors - 1] if survivors else None)
            assert writer.commit([b"after-recovery"]) == survivors
        entries, skips = read_all(directory)
        assert skips == []
        assert entries == [*enumerate(PAYLOADS[:survivors]), (survivors, b"after-recovery")]


def _flip(path: Path, pos: int) -> None:
    with path.open("r+b") as handle:
        handle.seek(pos)
        byte = handle.read(1)
        handle.seek(pos)
        handle.write(bytes([byte[0] ^ 0x40]))


def test_bit_flip_in_last_segment_is_quarantined_and_numbering_continues(
    tmp_path: Path,
) -> None:
    """A flipped payload byte mid-way through the newest segment: a copy of the segment is
    kept in quarantine/, every valid record (before and after the damage) stays readable,
    the reader skips just the damaged one, and new records never reuse an offset that was
    handed out."""
    directory = tmp_path / "spool"
    layout = _build(directory)
    path, _size, ends = layout[-1]
    base = len(PAYLOADS) - len(ends)
    damaged = base + 2
    _flip(path, ends[1] + FRAME_HEAD_SIZE + 3)
    cfg = SpoolConfig(directory=directory, segment_bytes=4096, min_free_bytes=0, fsync_window_ms=0)
    with SpoolWriter(cfg) as writer:
        assert writer.counters.segments_quarantined == 1
        assert writer.next_offset == len(PAYLOADS)
        assert writer.commit([b"new"]) == len(PAYLOADS)
    assert len(list((directory / QUARANTINE_DIR).iterdir())) == 1
    entries, skips = read_all(directory)
    assert skips == [damaged + 1]
    assert entries == [
        *((o, p) for o, p in enumerate(PAYLOADS) if o != damaged),
        (len(PAYLOADS), b"new"),
    ]


def test_bit_flip_in_older_segment_reader_resyncs_and_full_scan_quarantines(
    tmp_path: Path,
) -> None:
    """Damage inside an older segment: a reader skips just the damaged record (resync on the
    next frame), and a writer opened with recovery_scan=full keeps a copy of that segment
    in quarantine/ while its valid frames stay readable."""
    directory = tmp_path / "spool"
    layout = _build(directory)
    path, _size, ends = layout[1]
    base = len(layout[0][2])
    _flip(path, ends[0] + FRAME_HEAD_SIZE + 1)  # payload of offset base + 1
    entries, skips = read_all(directory)
    assert skips == [base + 2]
    assert [o for o, _ in entries] == [o for o in range(len(PAYLOADS)) if o != base + 1]
    assert all(PAYLOADS[o] == p for o, p in entries)
    cfg = SpoolConfig(
        directory=directory,
        segment_bytes=4096,
        min_free_bytes=0,
        fsync_window_ms=0,
        recovery_scan="full",
    )
    with SpoolWriter(cfg) as writer:
        assert writer.counters.segments_quarantined == 1
        assert writer.next_offset == len(PAYLOADS)
    entries, skips = read_all(directory)
    assert skips == [base + 2]
    assert [o for o, _ in entries] == [o for o in range(len(PAYLOADS)) if o != base + 1]


def test_bad_magic_segment_is_quarantined(tmp_path: Path) -> None:
    """A segment whose header is not ours is moved aside, never fatal; the rest is read."""
    directory = tmp_path / "spool"
    layout = _build(directory)
    path, _size, ends = layout[1]
    with path.open("r+b") as handle:
        handle.write(b"NOTASPOL")
    cfg = SpoolConfig(
        directory=directory,
        segment_bytes=4096,
        min_free_bytes=0,
        fsync_window_ms=0,
        recovery_scan="full",
    )
    with SpoolWriter(cfg) as writer:
        assert writer.counters.segments_quarantined == 1
        assert writer.next_offset == len(PAYLOADS)
    with SpoolReader(directory) as reader:
        result = reader.read(len(layout[0][2]))
        assert result.skipped_to == len(layout[0][2]) + len(ends)
