"""The archive sink: exact bytes, day and size rotation, gzip, crash-safe idempotence."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest

from gpu_audit.archive import read_lines
from shipper.sinks.archive.config import ArchiveSinkConfig
from shipper.sinks.archive.sink import STATE_FILE, ArchiveSink
from shipper.sinks.base import Outcome, SinkError, SinkRecord
from tests.shipper.sinks.records import BASE_NS, make_batch, make_record

DAY = 86_400 * 1_000_000_000
PART = "gpu-audit_node-1_node-1%2Fexporter_"  # host node-1, stream node-1/exporter


def sink(tmp_path: Path, **kw: object) -> ArchiveSink:
    cfg = ArchiveSinkConfig.model_validate({"type": "archive", "directory": tmp_path, **kw})
    s = ArchiveSink(cfg, "archive", tmp_path)
    s.start()
    return s


def all_lines(tmp_path: Path) -> list[bytes]:
    """Every line of the archive, in archive order (legacy parts, then each series)."""
    return [line.raw for line in read_lines(tmp_path)]


def test_lines_are_the_exact_record_bytes(tmp_path: Path) -> None:
    """Each archived line is byte-for-byte the spooled record, in order."""
    s = sink(tmp_path)
    batch = make_batch(5)
    assert [r.outcome for r in s.send(batch)] == [Outcome.DELIVERED] * 5
    assert all_lines(tmp_path) == [r.raw for r in batch]
    assert (tmp_path / (PART + "2026-09-21.jsonl")).exists()


def test_day_rotation_uses_record_time_and_compresses_closed_days(tmp_path: Path) -> None:
    """A record of a later day closes the earlier day's file as .jsonl.gz and seals it;
    the new day's part is the series' next number."""
    s = sink(tmp_path)
    s.send(make_batch(3))
    s.send([make_record(10, time_ns=BASE_NS + DAY)])
    names = sorted(p.name for p in tmp_path.glob(PART + "*.jsonl*"))
    assert names == [PART + "2026-09-21.jsonl.gz", PART + "2026-09-22.1.jsonl"]
    assert (tmp_path / (PART + "2026-09-21.seal.json")).exists()
    assert not (tmp_path / (PART + "2026-09-22.1.seal.json")).exists()
    assert len(all_lines(tmp_path)) == 4


def test_late_record_for_a_closed_day_goes_to_a_new_part(tmp_path: Path) -> None:
    """A record for a day already compressed opens a new part of that day (the series'
    next number: part 2, after day 1's part 0 and day 2's part 1); nothing is
    rewritten."""
    s = sink(tmp_path)
    s.send(make_batch(2))
    s.send([make_record(10, time_ns=BASE_NS + DAY)])
    s.send([make_record(11, time_ns=BASE_NS + 5)])
    names = sorted(p.name for p in tmp_path.glob(PART + "*.jsonl*"))
    assert PART + "2026-09-21.2.jsonl" in names  # open: the newest part of its series
    assert len(all_lines(tmp_path)) == 4


def test_size_rotation(tmp_path: Path) -> None:
    """Files rotate past max_file_bytes; every record is kept once, in order."""
    s = sink(tmp_path, max_file_bytes=4096)
    batch = make_batch(30)
    for i in range(0, 30, 5):
        s.send(batch[i : i + 5])
    files = sorted(p.name for p in tmp_path.glob(PART + "*.jsonl*"))
    assert len(files) > 2
    assert sum(name.endswith(".gz") for name in files) == len(files) - 1
    assert sorted(all_lines(tmp_path)) == sorted(r.raw for r in batch)


def test_resend_after_restart_is_not_written_twice(tmp_path: Path) -> None:
    """After a restart, the last batch resent (cursor not committed) is skipped."""
    s = sink(tmp_path)
    batch = make_batch(10)
    s.send(batch)
    s.close()
    s2 = sink(tmp_path)
    assert [r.outcome for r in s2.send(batch)] == [Outcome.DELIVERED] * 10
    assert s2.skipped == 10
    s2.send(make_batch(5, start=10))
    assert len(all_lines(tmp_path)) == 15


def test_lines_the_state_does_not_account_for_hold_the_sink(tmp_path: Path) -> None:
    """Complete lines past what the write-ahead state planned cannot come from a crash of
    this sink (the plan is on disk before any line): start refuses with HOLD, names the
    part, and changes nothing, instead of guessing which lines are duplicates."""
    s = sink(tmp_path)
    s.send(make_batch(3))
    state = (tmp_path / STATE_FILE).read_bytes()
    s.send(make_batch(4, start=3))
    s.close()
    (tmp_path / STATE_FILE).write_bytes(state)  # a state from before the second batch
    before = all_lines(tmp_path)
    s2 = ArchiveSink(ArchiveSinkConfig.model_validate(
        {"type": "archive", "directory": tmp_path}), "archive", tmp_path)
    with pytest.raises(SinkError) as err:
        s2.start()
    assert err.value.outcome is Outcome.HOLD
    assert PART + "2026-09-21.jsonl" in err.value.reason
    assert all_lines(tmp_path) == before


def test_torn_tail_is_truncated_and_the_record_resent(tmp_path: Path) -> None:
    """A half-written last line (crash mid-write) is cut; the resend writes it whole."""
    s = sink(tmp_path)
    batch = make_batch(3)
    s.send(batch[:2])
    s.close()
    active = tmp_path / (PART + "2026-09-21.jsonl")
    with active.open("ab") as fh:
        fh.write(batch[2].raw[:40])
    s2 = sink(tmp_path)
    s2.send(batch[2:])
    assert all_lines(tmp_path) == [r.raw for r in batch]


def test_crash_during_compression_recovers(tmp_path: Path) -> None:
    """A leftover .gz.tmp is removed; a .jsonl beside its complete .gz is removed."""
    s = sink(tmp_path)
    s.send(make_batch(3))
    s.send([make_record(10, time_ns=BASE_NS + DAY)])
    s.close()
    gz = tmp_path / (PART + "2026-09-21.jsonl.gz")
    (tmp_path / (PART + "2026-09-21.jsonl")).write_bytes(gzip.decompress(gz.read_bytes()))
    (tmp_path / "junk.jsonl.gz.tmp").write_bytes(b"partial")
    sink(tmp_path)
    assert not (tmp_path / (PART + "2026-09-21.jsonl")).exists()
    assert not (tmp_path / "junk.jsonl.gz.tmp").exists()
    assert len(all_lines(tmp_path)) == 4


def test_read_back_covers_plain_and_compressed_files(tmp_path: Path) -> None:
    """read_back yields the records in [start, end) from .jsonl and .jsonl.gz alike."""
    s = sink(tmp_path)
    s.send(make_batch(5))
    s.send([make_record(10, time_ns=BASE_NS + DAY)])
    got = list(s.read_back(BASE_NS + 1_000_000, BASE_NS + DAY + 1))
    assert [r["seq"] for r in got] == [1, 2, 3, 4, 10]
    assert got[0] == orjson.loads(make_record(1).raw)


def test_bad_records_are_dead_letters_not_drops(tmp_path: Path) -> None:
    """A record without time_ns or spanning lines is a dead letter with a reason."""
    s = sink(tmp_path)
    good = make_record(1)
    no_time = SinkRecord(2, "x", {"kind": "gpu"}, b'{"kind":"gpu"}')
    multi = SinkRecord(3, "y", dict(good.doc), b'{\n"a":1}')
    out = s.send([good, no_time, multi])
    assert [r.outcome for r in out] == [Outcome.DELIVERED, Outcome.DEAD_LETTER,
                                        Outcome.DEAD_LETTER]
    assert out[1].reason and out[2].reason


def test_a_state_file_it_did_not_write_holds_the_sink(tmp_path: Path) -> None:
    """A state file of the wrong shape stops the sink with HOLD naming the file (the
    worker retries start), rather than crashing its thread or guessing."""
    (tmp_path / STATE_FILE).write_bytes(b'{"version": 2}')
    s = ArchiveSink(ArchiveSinkConfig.model_validate(
        {"type": "archive", "directory": tmp_path}), "archive", tmp_path)
    with pytest.raises(SinkError) as err:
        s.start()
    assert err.value.outcome is Outcome.HOLD
    assert STATE_FILE in err.value.reason


def test_a_write_error_cuts_the_partial_batch_and_asks_for_a_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC in the middle of a batch: the torn line is cut at once (the lines completed
    before it stay and count as archived), the batch is answered RETRY, and the re-send
    writes only what is missing: every record once, in order."""
    import errno
    import os

    import shipper.sinks.archive.sink as archive_mod

    s = sink(tmp_path)
    first, second = make_batch(3), make_batch(3, start=3)
    s.send(first)
    real_write = os.write
    calls = []

    def full_disk(fd: int, data: bytes) -> int:
        calls.append(fd)
        if len(calls) == 3:  # the journal (one write), then the second half of the lines
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    class Os:
        def __getattr__(self, name: str) -> object:
            return full_disk if name == "write" else getattr(os, name)

    monkeypatch.setattr(archive_mod, "os", Os())
    with pytest.raises(SinkError) as err:
        s.send(second)
    monkeypatch.undo()
    assert err.value.outcome is Outcome.RETRY
    kept = all_lines(tmp_path)
    assert kept[:3] == [r.raw for r in first] and len(kept) < 6
    assert kept[3:] == [r.raw for r in second[: len(kept) - 3]]
    assert (tmp_path / (PART + "2026-09-21.jsonl")).read_bytes().endswith(b"\n")
    s.send(first + second)
    assert all_lines(tmp_path) == [r.raw for r in first + second]


def test_a_version_1_state_is_upgraded(tmp_path: Path) -> None:
    """The state of earlier releases (saved after the lines) is upgraded: bytes past the
    sizes it recorded were never acknowledged and are cut, its last offset is kept, and
    the re-sent records are archived once (the legacy part, named before parts carried
    host and stream, is closed: the new records go to the host's series)."""
    batch = make_batch(6)
    active = tmp_path / "gpu-audit-2026-09-21.jsonl"
    acked = b"".join(r.raw + b"\n" for r in batch[:3])
    active.write_bytes(acked + batch[3].raw + b"\n" + batch[4].raw[:20])
    (tmp_path / STATE_FILE).write_bytes(orjson.dumps(
        {"version": 1, "last_offset": 2, "files": {active.name: len(acked)}, "recent": []}))
    s = sink(tmp_path)
    assert gzip.decompress((tmp_path / (active.name + ".gz")).read_bytes()) == acked
    s.send(batch)
    assert all_lines(tmp_path) == [r.raw for r in batch]
    assert s.skipped == 3


def test_a_part_deleted_behind_the_sinks_back_holds_it(tmp_path: Path) -> None:
    """The part the last batch appended to is gone: HOLD naming it, nothing guessed."""
    s = sink(tmp_path)
    s.send(make_batch(2))
    s.send(make_batch(2, start=2))
    s.close()
    (tmp_path / (PART + "2026-09-21.jsonl")).unlink()
    s2 = ArchiveSink(ArchiveSinkConfig.model_validate(
        {"type": "archive", "directory": tmp_path}), "archive", tmp_path)
    with pytest.raises(SinkError) as err:
        s2.start()
    assert err.value.outcome is Outcome.HOLD and "gone" in err.value.reason


def test_rotation_lists_no_directory_whatever_the_number_of_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every rotation listed the whole directory (97 ms at 2,635
    files), so a small max_file_bytes made delivery fall behind without bound. The sink
    lists the directory once, when it starts; hundreds of rotations after that list
    nothing, so a rotation costs the same with 10 parts or 10,000."""
    import os as real_os
    from pathlib import Path as P

    s = sink(tmp_path, max_file_bytes=4096)
    listings: list[str] = []
    real_iterdir, real_scandir, real_listdir = P.iterdir, real_os.scandir, real_os.listdir

    def iterdir(self: P) -> object:
        listings.append(str(self))
        return real_iterdir(self)

    def scandir(path: object = ".") -> object:
        listings.append(str(path))
        return real_scandir(path)  # type: ignore[arg-type]

    def listdir(path: object = ".") -> list[str]:
        listings.append(str(path))
        return real_listdir(path)  # type: ignore[arg-type]

    monkeypatch.setattr(P, "iterdir", iterdir)
    monkeypatch.setattr(real_os, "scandir", scandir)
    monkeypatch.setattr(real_os, "listdir", listdir)
    batch = make_batch(400, pad=900)
    for i in range(0, len(batch), 4):
        s.send(batch[i : i + 4])
    monkeypatch.undo()
    parts = [p for p in tmp_path.iterdir() if ".jsonl" in p.name]
    assert len(parts) > 80
    assert listings == [], f"{len(listings)} listing(s) during {len(parts)} rotations"
