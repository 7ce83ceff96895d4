"""No seq is ever issued twice: a byte flipped in the newest spool
frame after that record was shipped. The producer used to resume after the frame before
it and issue the shipped record's seq again (the archive then held one seq twice and a
chain break, with or without audit.state_directory), and the spool's log called the
shipped record lost."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import orjson
import pytest

from gpu_audit.archive import read_lines
from gpu_audit.archive.verify import verify_archive
from gpu_audit.audit.config import AuditConfig
from gpu_audit.audit.producer import AuditProducer
from gpu_audit.spool import SpoolConfig, SpoolReader, SpoolWriter
from gpu_audit.spool.cursors import CursorStore
from gpu_audit.spool.recovery import list_segments
from shipper.sinks.archive.config import ArchiveSinkConfig
from shipper.sinks.archive.sink import ArchiveSink
from shipper.sinks.base import SinkRecord
from tests.core.audit.factory import HOST, T0, advance, realistic


class Clock:
    def __init__(self) -> None:
        self.t = T0 - 100.0

    def __call__(self) -> float:
        self.t += 0.25
        return self.t


def _run(spool: Path, clock: Clock, cycles: int, state: Path | None, start: float) -> None:
    """One exporter life: start, `cycles` snapshots, stop."""
    writer = SpoolWriter(SpoolConfig(directory=spool, min_free_bytes=0, fsync_window_ms=0))
    try:
        p = AuditProducer(AuditConfig(state_directory=state), writer,
                          host=HOST, exporter_version="t", simulated=False, clock=clock)
        p.start()
        s = realistic(start)
        for _ in range(cycles):
            p.on_snapshot(s)
            s = advance(s)
        p.stop()
    finally:
        writer.close()


def _ship(spool: Path, archive: Path) -> None:
    """Deliver every record from the archive sink's cursor on, and commit the cursor."""
    cursors = CursorStore(spool)
    pos = cursors.get("archive")
    sink = ArchiveSink(ArchiveSinkConfig.model_validate(
        {"type": "archive", "directory": archive, "fsync": False}), "archive", archive)
    sink.start()
    with SpoolReader(spool) as reader:
        while True:
            result = reader.read(pos, 1000, 1 << 24)
            if not result.entries:
                break
            batch = []
            for off, raw in result.entries:
                doc = orjson.loads(raw)
                batch.append(SinkRecord(offset=off, record_id=doc["id"], doc=doc, raw=raw))
            sink.send(batch)
            pos = result.next_offset
    sink.close()
    cursors.commit("archive", pos)


def _flip_newest_frame(spool: Path) -> None:
    _base, path = list_segments(spool)[-1]
    data = bytearray(path.read_bytes())
    data[-10] ^= 0x55  # inside the last record's payload
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("with_state", [False, True])
def test_a_damaged_newest_frame_that_was_shipped_never_gets_its_seq_again(
        tmp_path: Path, with_state: bool, caplog: pytest.LogCaptureFixture) -> None:
    spool, archive = tmp_path / "spool", tmp_path / "archive"
    state = tmp_path / "state" if with_state else None
    clock = Clock()
    _run(spool, clock, 4, state, T0)
    _ship(spool, archive)
    _flip_newest_frame(spool)
    with caplog.at_level(logging.WARNING):
        _run(spool, clock, 3, state, T0 + 100)
    _ship(spool, archive)
    report = verify_archive(archive, None)
    assert not {"duplicate_seq", "chain_break"} & set(report.counts), report.render()
    assert report.ok, report.render()
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "already delivered to every sink" in said and "lost" not in said.split(
        "already delivered")[0].rsplit(";", 1)[-1]
    records = [orjson.loads(line.raw) for line in read_lines(archive)]
    seqs = [r["seq"] for r in records]
    assert len(seqs) == len(set(seqs)) and seqs == sorted(seqs)
    restarts = [r for r in records if r.get("event") == "chain_restart"]
    if with_state:
        # the checkpoint knew the shipped record: the chain just goes on
        assert restarts == []
        assert seqs == list(range(1, len(seqs) + 1))
    else:
        [restart] = restarts
        damaged = restart["lost_from"]
        assert restart["lost_to"] == damaged and restart["after_seq"] == damaged - 1
        assert damaged in seqs  # it was shipped: in the archive, not lost
        assert restart["seq"] == damaged + 1 and restart["prev_hash"] == "0" * 64


def test_unshipped_damage_is_a_named_gap_the_restart_explains(tmp_path: Path) -> None:
    """The same damage before the record was shipped: the record is gone; the archive
    shows the gap, named as the chain_restart's declared loss, and no seq twice."""
    spool, archive = tmp_path / "spool", tmp_path / "archive"
    clock = Clock()
    _run(spool, clock, 4, None, T0)
    _flip_newest_frame(spool)
    _run(spool, clock, 2, None, T0 + 100)
    _ship(spool, archive)
    report = verify_archive(archive, None)
    assert set(report.counts) == {"gap"}, report.render()
    [gap] = [p for p in report.problems if p.kind == "gap"]
    assert "declared lost by the chain_restart" in gap.detail
    os.sync()
