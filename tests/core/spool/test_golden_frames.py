"""Golden spool bytes: the on-disk format is pinned by a checked-in file.

`golden/00000000000000000300.seg` holds the exact bytes of a segment (header + frames) for
known payloads at known offsets. Every test here fails if framing, the CRC, the header or
the byte order changes: a stored spool written by an older version must stay readable, so
such a change needs a new format version, not a quiet edit. Never regenerate the file to
make a test pass.
"""

from __future__ import annotations

import shutil
import struct
import zlib
from pathlib import Path

from gpu_audit.spool import SpoolConfig, SpoolReader, SpoolWriter
from gpu_audit.spool.recovery import list_segments

GOLDEN = Path(__file__).parent / "golden" / "00000000000000000300.seg"
BASE = 300  # 0x012c: an offset whose two low bytes differ, so byte order shows
PAYLOADS = [
    b"",
    b"hello",
    b'{"id":"gpu-0000000000000301","seq":301}',
    bytes(range(256)),
]


def _write_spool(directory: Path) -> Path:
    """A spool whose second segment starts at BASE and holds exactly PAYLOADS."""
    cfg = SpoolConfig(directory=directory, segment_bytes=4096, min_free_bytes=0,
                      fsync_window_ms=0)
    with SpoolWriter(cfg) as writer:
        writer.commit([b""] * BASE)  # 300 frames of 16 bytes: the next batch rolls
        assert writer.commit(PAYLOADS) == BASE
    (base, path), = list_segments(directory)[1:]
    assert base == BASE
    return path


def test_writer_produces_the_golden_bytes(tmp_path: Path) -> None:
    """The writer's segment for the golden payloads is byte-for-byte the checked-in file."""
    produced = _write_spool(tmp_path / "spool").read_bytes()
    assert produced == GOLDEN.read_bytes()


def test_reader_reads_the_golden_bytes(tmp_path: Path) -> None:
    """The checked-in bytes, dropped into an empty spool directory, read back as the golden
    payloads at offsets 300..303."""
    directory = tmp_path / "spool"
    directory.mkdir()
    shutil.copy(GOLDEN, directory / GOLDEN.name)
    with SpoolReader(directory) as reader:
        result = reader.read(0)
    assert result.skipped_to == BASE
    assert result.entries == [(BASE + i, p) for i, p in enumerate(PAYLOADS)]


def test_golden_bytes_match_the_documented_layout() -> None:
    """The golden file decoded by hand with the layout of docs/SPOOL.md: little-endian
    header (magic, version 1, flags 0, base offset) and frames (length, CRC-32 over the
    8 offset bytes then the payload, offset, payload)."""
    data = GOLDEN.read_bytes()
    assert data[:24] == b"GPUASPL\x00" + bytes.fromhex("01000000" "00000000" "2c01000000000000")
    pos = 24
    for i, payload in enumerate(PAYLOADS):
        length, crc, offset = struct.unpack_from("<IIQ", data, pos)
        assert (length, offset) == (len(payload), BASE + i)
        assert crc == zlib.crc32(struct.pack("<Q", offset) + payload)
        assert data[pos + 16 : pos + 16 + length] == payload
        pos += 16 + length
    assert pos == len(data)
    # the first two frames, spelled out as in docs/SPOOL.md
    assert data[24:61].hex() == (
        "00000000" "c4a38c6d" "2c01000000000000"
        "05000000" "fd70b190" "2d01000000000000" "68656c6c6f"
    )
