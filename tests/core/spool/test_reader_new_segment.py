"""A reader that sees a new segment before its header is written does not stall there."""

from __future__ import annotations

from pathlib import Path

from gpu_audit.spool import SpoolConfig, SpoolReader, SpoolWriter
from gpu_audit.spool.format import encode_frames, encode_header, segment_name


def test_reader_continues_once_a_half_created_segment_gets_its_header(tmp_path: Path) -> None:
    """The writer creates a segment file, then writes its header: a reader looking in
    between finds an empty file. Once the header and frames arrive, the same reader (same
    inode) must read on instead of treating the segment as damaged forever."""
    spool = tmp_path / "spool"
    with SpoolWriter(SpoolConfig(directory=spool, min_free_bytes=0)) as writer:
        writer.commit([b"r%d" % i for i in range(10)])
    reader = SpoolReader(spool)
    assert len(reader.read(0, 100, 1 << 20).entries) == 10
    nxt = spool / segment_name(10)
    nxt.touch()  # created, header not yet written
    assert reader.read(10, 100, 1 << 20).entries == []
    with nxt.open("ab") as f:  # same inode: header and frames land in the same file
        f.write(encode_header(10) + encode_frames(10, [b"late-1", b"late-2"]))
    got = reader.read(10, 100, 1 << 20).entries
    assert got == [(10, b"late-1"), (11, b"late-2")]
    reader.close()
