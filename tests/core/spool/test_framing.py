"""Framing round-trips: whatever is committed is read back byte for byte, in order."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_audit.spool import SpoolConfig, SpoolReader, SpoolWriter
from gpu_audit.spool.format import FRAME_HEAD_SIZE, HEADER_SIZE, encode_frames, scan_frames
from tests.core.spool.conftest import read_all

payload = st.one_of(
    st.binary(max_size=64),
    st.binary(min_size=0, max_size=3000),
    st.just(b""),
)
batches = st.lists(st.lists(payload, max_size=20), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(batches=batches, segment_bytes=st.sampled_from([4096, 8192, 1 << 20]))
def test_round_trip_across_segment_rolls(batches: list[list[bytes]], segment_bytes: int) -> None:
    """Arbitrary batches (empty and large payloads included) come back in order with
    dense offsets, however the segments rolled, and survive a reopen."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = SpoolConfig(
            directory=Path(tmp), segment_bytes=segment_bytes, min_free_bytes=0, fsync_window_ms=0
        )
        expected: list[bytes] = []
        with SpoolWriter(cfg) as writer:
            for batch in batches:
                first = writer.commit(batch)
                assert first == len(expected)
                expected.extend(batch)
            assert writer.durable_offset == len(expected)
        entries, skips = read_all(Path(tmp))
        assert skips == []
        assert entries == list(enumerate(expected))
        with SpoolWriter(cfg) as writer:
            assert writer.next_offset == len(expected)
            assert writer.last_payload() == (expected[-1] if expected else None)


@settings(max_examples=100, deadline=None)
@given(first=st.integers(0, 2**40), payloads=st.lists(st.binary(max_size=200), max_size=30))
def test_encoded_frames_scan_back(first: int, payloads: list[bytes]) -> None:
    """The frame encoder and the scanner agree: every frame validates, ends where it should."""
    data = b"\0" * HEADER_SIZE + encode_frames(first, payloads)
    result = scan_frames(data, HEADER_SIZE, first)
    assert result.problem is None
    assert result.records == len(payloads)
    assert result.next_offset == first + len(payloads)
    assert result.end == HEADER_SIZE + sum(FRAME_HEAD_SIZE + len(p) for p in payloads)


def test_reader_respects_limits(make_config) -> None:  # type: ignore[no-untyped-def]
    """max_records, max_bytes (at least one record) and limit_offset bound a read."""
    cfg = make_config()
    with SpoolWriter(cfg) as writer:
        writer.commit([bytes([i]) * 100 for i in range(50)])
    with SpoolReader(cfg.directory) as reader:
        assert len(reader.read(0, max_records=7).entries) == 7
        assert len(reader.read(0, max_bytes=250).entries) == 3
        assert len(reader.read(0, max_bytes=1).entries) == 1
        result = reader.read(10, limit_offset=15)
        assert [o for o, _ in result.entries] == [10, 11, 12, 13, 14]
        assert result.next_offset == 15
        assert reader.read(15, limit_offset=15).entries == []
        assert reader.read(50).entries == []
        assert reader.read(50).next_offset == 50
