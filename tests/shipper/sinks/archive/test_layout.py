"""The archive layout (names, part order) and its ordered reader, as the sink writes it and
as `audit verify` and chargeback read it."""

from __future__ import annotations

import datetime as dt
import gzip
from pathlib import Path

import orjson
import pytest

from gpu_audit.archive import (
    ParsedName,
    legacy_part_name,
    list_parts,
    parse_name,
    part_name,
    read_lines,
    read_records,
)
from gpu_audit_app.cli import main
from shipper.sinks.archive.config import ArchiveSinkConfig
from shipper.sinks.archive.sink import ArchiveSink
from shipper.sinks.base import SinkRecord
from tests.shipper.producer import chained

MIDNIGHT_NS = 1_790_035_200 * 1_000_000_000  # 2026-09-22T00:00:00Z
DAY1, DAY2 = dt.date(2026, 9, 21), dt.date(2026, 9, 22)


def handmade_archive(directory: Path, per_part: int = 2, parts_per_day: int = 13) -> list[bytes]:
    """A legacy archive (written before parts were named by host and stream): a trail over
    two days, 13 parts per day (.10, .11, .12 included), every third part left plain and
    the rest gzip, written file by file in write order."""
    n = 2 * per_part * parts_per_day
    raws = chained(n, MIDNIGHT_NS - (n // 2 + 1) * 1_000_000)
    i = 0
    for day in (DAY1, DAY2):
        for number in range(parts_per_day):
            chunk = b"".join(r + b"\n" for r in raws[i : i + per_part])
            i += per_part
            compressed = number % 3 != 1
            path = directory / legacy_part_name("gpu-audit", day, number,
                                                compressed=compressed)
            path.write_bytes(gzip.compress(chunk, mtime=0) if compressed else chunk)
    assert i == n
    return raws


def test_verify_reads_a_rotated_archive_in_write_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`audit verify ARCHIVE_DIR` on 26 legacy parts over two days,
    mixed .gz and plain, passes: the base file comes before `.1`, and `.10` after `.9`,
    not in name order."""
    raws = handmade_archive(tmp_path)
    assert main(["audit", "verify", str(tmp_path)]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert f"{len(raws)} records" in out and "OK" in out


def test_verify_still_sees_parts_in_the_wrong_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The archive order is not a blanket excuse: two parts whose contents are swapped
    are reported as reordered."""
    handmade_archive(tmp_path)
    a = tmp_path / "gpu-audit-2026-09-21.3.jsonl.gz"
    b = tmp_path / "gpu-audit-2026-09-21.12.jsonl.gz"
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    assert main(["audit", "verify", str(tmp_path)]) == 1
    assert "reordered" in capsys.readouterr().out


def test_legacy_part_order_is_day_then_part_number(tmp_path: Path) -> None:
    """Legacy parts sort by day, then part number as a number; a part present both plain
    and compressed (a compression interrupted after the rename) is listed once, as .gz;
    temporary files and foreign names are not parts."""
    names = ["gpu-audit-2026-09-22.jsonl", "gpu-audit-2026-09-21.10.jsonl.gz",
             "gpu-audit-2026-09-21.2.jsonl", "gpu-audit-2026-09-21.1.jsonl.gz",
             "gpu-audit-2026-09-21.jsonl.gz", "gpu-audit-2026-09-21.9.jsonl.gz",
             "gpu-audit-2026-09-21.9.jsonl", "gpu-audit-2026-09-21.3.jsonl.gz.tmp",
             ".archive-state.json", "notes.jsonl", "gpu-audit-2026-09-21.01.jsonl"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    got = [p.path.name for p in list_parts(tmp_path)]
    assert got == ["gpu-audit-2026-09-21.jsonl.gz", "gpu-audit-2026-09-21.1.jsonl.gz",
                   "gpu-audit-2026-09-21.2.jsonl", "gpu-audit-2026-09-21.9.jsonl.gz",
                   "gpu-audit-2026-09-21.10.jsonl.gz", "gpu-audit-2026-09-22.jsonl"]
    assert parse_name("my-archive-2026-09-21.12.jsonl.gz") == ParsedName(
        "my-archive", "", "", DAY1, 12, True)
    assert legacy_part_name("gpu-audit", DAY1, 0) == "gpu-audit-2026-09-21.jsonl"


def test_series_names_carry_host_and_stream_and_sort_by_part_number(tmp_path: Path) -> None:
    """A part's name says whose chain it holds: host and stream, percent-encoded so a
    `_`, `/` or `%` of theirs cannot make the name ambiguous; a series' parts sort by
    their number (the write order, across days), after the legacy parts; seals are not
    parts."""
    name = part_name("gpu-audit", DAY2, 12, host="node_7.example", stream="a/b%c")
    assert name == "gpu-audit_node%5F7.example_a%2Fb%25c_2026-09-22.12.jsonl"
    assert parse_name(name) == ParsedName("gpu-audit", "node_7.example", "a/b%c", DAY2, 12,
                                          False)
    assert parse_name("my_arch_h_s_2026-09-21.jsonl.gz") == ParsedName(
        "my_arch", "h", "s", DAY1, 0, True)
    assert parse_name("x_h%5f_s_2026-09-21.jsonl") is None  # not how the sink spells it
    names = [part_name("gpu-audit", DAY2, 10, host="n1", stream="exporter"),
             part_name("gpu-audit", DAY1, 9, host="n1", stream="exporter", compressed=True),
             part_name("gpu-audit", DAY1, 0, host="n2", stream="exporter"),
             legacy_part_name("gpu-audit", DAY2, 0),
             "gpu-audit_n1_exporter_2026-09-21.9.seal.json"]
    for n in names:
        (tmp_path / n).write_bytes(b"")
    got = [(p.host, p.number) for p in list_parts(tmp_path)]
    assert got == [("", 0), ("n1", 9), ("n1", 10), ("n2", 0)]


def _records(raws: list[bytes]) -> list[SinkRecord]:
    out = []
    for offset, raw in enumerate(raws):
        doc = orjson.loads(raw)
        out.append(SinkRecord(offset=offset, record_id=doc["id"], doc=doc, raw=raw))
    return out


@pytest.mark.parametrize("compress", [True, False])
def test_the_reader_gives_back_what_the_sink_wrote_in_order(
    tmp_path: Path, compress: bool
) -> None:
    """More than ten parts a day over two days, written by the sink: the ordered reader
    yields every line once, in the order the sink was given them, and `read_records`
    picks one day's range from the parts of that day only."""
    raws = chained(120, MIDNIGHT_NS - 60 * 1_000_000, pad=600)
    recs = _records(raws)
    cfg = ArchiveSinkConfig.model_validate({"type": "archive", "directory": tmp_path,
                                            "max_file_bytes": 4096, "compress": compress})
    sink = ArchiveSink(cfg, "archive", tmp_path)
    sink.start()
    for i in range(0, len(recs), 7):
        sink.send(recs[i : i + 7])
    parts = list_parts(tmp_path)
    assert max(p.number for p in parts if p.day == DAY1) >= 10
    assert max(p.number for p in parts if p.day == DAY2) >= 10
    assert any(p.compressed for p in parts) is compress
    assert [line.raw for line in read_lines(tmp_path)] == raws
    second_day = list(read_records(tmp_path, MIDNIGHT_NS, MIDNIGHT_NS + 86_400 * 10**9))
    assert [d["seq"] for d in second_day] == list(range(60, 121))
    assert main(["audit", "verify", str(tmp_path)]) == 0
