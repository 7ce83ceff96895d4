"""`spool verify` finds damage and says where; `spool stats` summarises."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_audit.spool import CursorStore, SpoolConfig, SpoolWriter, spool_stats, verify_spool
from gpu_audit.spool.format import FRAME_HEAD_SIZE, HEADER_SIZE
from gpu_audit.spool.recovery import list_segments


def _spool(tmp_path: Path) -> Path:
    directory = tmp_path / "spool"
    cfg = SpoolConfig(directory=directory, segment_bytes=4096, min_free_bytes=0, fsync_window_ms=0)
    with SpoolWriter(cfg) as writer:
        for _ in range(4):
            writer.commit([b"p" * 100] * 30)  # 30 records per segment
    CursorStore(directory).commit("es", 45)
    return directory


def test_clean_spool_verifies(tmp_path: Path) -> None:
    """A healthy spool is OK, with counts, offsets and cursor lag in the rendering."""
    report = verify_spool(_spool(tmp_path))
    assert report.ok, report.render()
    assert (report.segments, report.records, report.next_offset) == (4, 120, 120)
    assert "cursor es: 45 (lag 75)" in report.render()
    stats = spool_stats(tmp_path / "spool")
    assert stats["next_offset"] == 120 and stats["records"] == 120
    assert stats["cursors"] == {"es": {"offset": 45, "lag_records": 75}}
    assert stats["writer_active"] is False


def test_flipped_byte_is_found_with_file_and_position(tmp_path: Path) -> None:
    """A flipped payload byte is reported with its segment file and byte position."""
    directory = _spool(tmp_path)
    _base, path = list_segments(directory)[1]
    pos = HEADER_SIZE + 2 * (FRAME_HEAD_SIZE + 100)  # third frame of segment 30
    with path.open("r+b") as handle:
        handle.seek(pos + FRAME_HEAD_SIZE + 5)
        handle.write(b"X")
    report = verify_spool(directory)
    assert not report.ok
    assert any(
        f"{path.name}: byte {pos}: CRC mismatch" in problem and "offsets 32..32" in problem
        for problem in report.problems
    ), report.problems


def test_truncated_middle_segment_and_offset_gap_are_found(tmp_path: Path) -> None:
    """A middle segment cut short shows as a torn frame and an offset gap to the next."""
    directory = _spool(tmp_path)
    _base, path = list_segments(directory)[1]
    cut = HEADER_SIZE + 10 * (FRAME_HEAD_SIZE + 100) + 50
    with path.open("r+b") as handle:
        handle.truncate(cut)
    report = verify_spool(directory)
    assert not report.ok
    text = "\n".join(report.problems)
    assert f"{path.name}: byte {cut - 50}: incomplete frame" in text
    assert "offsets 40..59 are missing" in text


def test_deleted_segment_gap_and_bad_cursor(tmp_path: Path) -> None:
    """A missing middle segment is an offset gap; a cursor behind the oldest record or a
    damaged cursor file is reported by name."""
    directory = _spool(tmp_path)
    list_segments(directory)[2][1].unlink()
    (directory / "cursors" / "influx.json").write_text("{}")
    report = verify_spool(directory)
    text = "\n".join(report.problems)
    assert "offsets 60..89 are missing" in text
    assert "influx.json" in text
    CursorStore(directory).commit("old", 10)
    list_segments(directory)[0][1].unlink()
    report = verify_spool(directory)
    assert any("old.json: cursor 10 is behind the oldest record" in p for p in report.problems)


def test_spool_verify_json_is_the_report_as_data(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`gpu-audit spool verify --json` prints the report as one JSON document (ok, counts,
    offsets, cursors, problems) and keeps the exit code: 0 clean, 1 with a problem."""
    from gpu_audit_app.cli import main

    directory = _spool(tmp_path)
    assert main(["spool", "verify", "--json", str(directory)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and doc["problems"] == []
    assert (doc["segments"], doc["records"], doc["next_offset"]) == (4, 120, 120)
    assert doc["cursors"] == {"es": 45}
    assert doc["directory"] == str(directory)

    _base, path = list_segments(directory)[1]
    with path.open("r+b") as handle:
        handle.seek(HEADER_SIZE + FRAME_HEAD_SIZE + 5)
        handle.write(b"X")
    assert main(["spool", "verify", "--json", str(directory)]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False
    assert any("CRC mismatch" in p for p in doc["problems"])
