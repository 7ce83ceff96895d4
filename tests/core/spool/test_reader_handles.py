"""Readers pin no deleted segment: a reader holds no file open between
reads, so a segment gc deletes behind a long-lived reader frees its space at once."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from gpu_audit.spool import SpoolConfig, SpoolReader, SpoolWriter
from gpu_audit.spool.recovery import list_segments


def _open_segments(directory: Path) -> list[str]:
    """Segment files this process has open, apart from the writer's active segment."""
    active = str(list_segments(directory)[-1][1])
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(directory)) and ".seg" in target and target != active:
            found.append(target)
    return found


def test_caught_up_reader_holds_no_segment_open(make_config: Callable[..., SpoolConfig]) -> None:
    """A reader that has read everything (and then only asks at the durable limit, as a
    caught-up sink does) keeps no segment open, so gc'd segments are really gone; it
    goes on reading new records, and reports the gap when its position was collected."""
    cfg = make_config(segment_bytes=4096)
    with SpoolWriter(cfg) as writer, SpoolReader(cfg.directory) as reader:
        for i in range(40):
            writer.commit([b"%03d" % i + b"x" * 200] * 5)
        assert len(list_segments(cfg.directory)) > 4
        offset = 0
        while offset < writer.durable_offset:
            offset = reader.read(offset, 7, limit_offset=writer.durable_offset).next_offset
        assert offset == 200
        assert _open_segments(cfg.directory) == []
        assert reader.read(offset, limit_offset=writer.durable_offset).entries == []
        writer.gc(offset)
        assert _open_segments(cfg.directory) == []
        writer.commit([b"after gc"])
        result = reader.read(offset)
        assert result.entries == [(200, b"after gc")]
        assert _open_segments(cfg.directory) == []
        # a position inside collected segments: the gap is reported, nothing raises
        gap = reader.read(3)
        assert gap.skipped_to is not None and gap.skipped_to > 3


def test_segment_deleted_between_reads_is_skipped(make_config: Callable[..., SpoolConfig]) -> None:
    """A segment the reader had listed disappears before its next read (evicted or gc'd by
    the writer in another process): the reader lists again and reports the gap."""
    cfg = make_config(segment_bytes=4096)
    with SpoolWriter(cfg) as writer, SpoolReader(cfg.directory) as reader:
        for _ in range(20):
            writer.commit([b"y" * 300] * 5)
        first = reader.read(0, 3)
        assert [o for o, _ in first.entries] == [0, 1, 2]
        (_base, oldest), (second, _path) = list_segments(cfg.directory)[:2]
        oldest.unlink()
        result = reader.read(first.next_offset, 3)
        assert result.skipped_to == second
        assert [o for o, _ in result.entries] == [second, second + 1, second + 2]
