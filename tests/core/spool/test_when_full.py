"""The spool's full-disk policies: `refuse` keeps what is stored and refuses new records;
`drop_oldest` evicts the oldest whole segments, counted, to take new ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_audit.spool import SpoolConfig, SpoolFull, SpoolReader, SpoolWriter

RECORD = b"x" * 900


def _config(tmp_path: Path, policy: str) -> SpoolConfig:
    return SpoolConfig(directory=tmp_path / "spool", segment_bytes=8192, max_bytes=32768,
                       min_free_bytes=0, when_full=policy)  # type: ignore[arg-type]


def test_refuse_keeps_every_stored_record_and_counts_the_refused(tmp_path: Path) -> None:
    """Under the default policy a full spool raises SpoolFull for new records, counts them
    by reason, and deletes nothing."""
    writer = SpoolWriter(_config(tmp_path, "refuse"))
    stored = 0
    with pytest.raises(SpoolFull) as exc:
        for _ in range(100):
            writer.commit([RECORD] * 4)
            stored += 4
    assert exc.value.reason == "max_bytes"
    assert writer.counters.refused["max_bytes"] == 4
    assert writer.counters.records_evicted == 0
    entries = SpoolReader(tmp_path / "spool").read(0, 1000, 1 << 20).entries
    assert [o for o, _ in entries] == list(range(stored))
    writer.close()


def test_drop_oldest_evicts_whole_old_segments_and_counts_them(tmp_path: Path) -> None:
    """Under drop_oldest the spool never refuses for size: the oldest segments go, every
    evicted record is counted, the newest records are all there, and a reader starting
    at 0 is told where the data resumes."""
    writer = SpoolWriter(_config(tmp_path, "drop_oldest"))
    total = 0
    for _ in range(100):
        writer.commit([RECORD] * 4)
        total += 4
    assert writer.counters.refused == {}
    assert writer.size_bytes <= 32768
    evicted = writer.counters.records_evicted
    assert evicted > 0
    result = SpoolReader(tmp_path / "spool").read(0, 10_000, 1 << 24)
    assert result.skipped_to == evicted  # the first record still stored
    offsets = [o for o, _ in result.entries]
    assert offsets == list(range(evicted, total))  # nothing missing after the gap
    assert writer.last_payload() == RECORD
    writer.close()


def test_drop_oldest_still_refuses_a_batch_larger_than_the_whole_spool(tmp_path: Path) -> None:
    """When even an emptied spool cannot hold the batch, it is refused and counted, and
    the segment holding the newest record survives."""
    writer = SpoolWriter(_config(tmp_path, "drop_oldest"))
    writer.commit([RECORD])
    with pytest.raises(SpoolFull):
        writer.commit([RECORD] * 60)
    assert writer.counters.refused["max_bytes"] == 60
    assert writer.last_payload() == RECORD
    writer.close()


def test_drop_oldest_evicts_on_enospc_too(tmp_path: Path) -> None:
    """A write that fails with ENOSPC (the filesystem filled faster than the cached free
    space said, e.g. by another process) makes drop_oldest evict and write again instead
    of losing the batch; under refuse it is a counted SpoolWriteError, nothing written."""
    import errno
    import os

    from gpu_audit.spool import SpoolWriteError

    failures = [0]

    def write(fd: int, data: memoryview) -> int:
        if failures[0]:
            failures[0] -= 1
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.write(fd, data)

    for policy in ("drop_oldest", "refuse"):
        cfg = SpoolConfig(directory=tmp_path / policy, segment_bytes=8192,
                          min_free_bytes=0, when_full=policy)  # type: ignore[arg-type]
        writer = SpoolWriter(cfg, write=write)
        for _ in range(20):
            writer.commit([RECORD] * 4)
        failures[0] = 1
        if policy == "drop_oldest":
            first = writer.commit([b"fits after eviction"])
            assert writer.counters.records_evicted > 0
            assert writer.counters.write_errors == {}
            entries = SpoolReader(cfg.directory).read(first, 10).entries
            assert entries == [(first, b"fits after eviction")]
        else:
            with pytest.raises(SpoolWriteError) as caught:
                writer.commit([b"refused"])
            assert caught.value.reason == "ENOSPC"
            assert writer.counters.records_evicted == 0
            assert writer.counters.write_errors == {"ENOSPC": 1}
        writer.close()
