"""The archive after crashes at every boundary: exactly once, in order, any number in a row.

A crash is injected deterministically: the archive module's `os` is replaced by a proxy
that counts every call that changes the disk (open for writing, write, fsync, rename,
unlink, truncate) and raises `Crash` (a BaseException, so no handler of the sink can
absorb it) at the Nth. The sink writes with unbuffered `os` calls and splits each line
write in two, so "crash at call N" leaves exactly what a kill -9 there would leave,
including a torn line. fsync is counted but not performed: a killed process keeps the
page cache, and that is the fault under test.

Each "life" opens a fresh sink from the directory (recovery runs inside the fault
window too) and plays the engine: send batches from the last committed cursor, commit
the cursor only after every second batch (so a crash re-sends up to two batches), and
finish the spool. After the crashes, a last clean life finishes the spool; then the
ordered archive reader must give exactly the spooled records, once each, in offset
order, and `audit verify` must pass on the directory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

import shipper.sinks.archive.sink as archive_mod
from gpu_audit.archive import list_parts, read_lines
from gpu_audit.archive.verify import verify_archive
from gpu_audit.audit.verify import VerifyReport
from shipper.sinks.archive.config import ArchiveSinkConfig
from shipper.sinks.archive.sink import ArchiveSink
from shipper.sinks.base import Outcome, SinkRecord
from tests.shipper.producer import chained
from tests.shipper.sinks.records import make_batch

MIDNIGHT_NS = 1_790_035_200 * 1_000_000_000  # 2026-09-22T00:00:00Z
N = 40
BATCH = 3


class Crash(BaseException):
    """The process dies here."""


class FaultyOs:
    """The `os` module, except that the Nth disk-changing call raises Crash.

    `labels` records, per call, what it was ("write:part", "replace:state", ...), so the
    test can show that every kind of boundary was hit.
    """

    WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT

    def __init__(self, crash_at: int | None) -> None:
        self.crash_at = crash_at
        self.calls = 0
        self.labels: list[str] = []
        self._fds: dict[int, str] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    @staticmethod
    def _kind(path: Any) -> str:
        name = os.fspath(path)
        if name.endswith(".gz.tmp"):
            return "gz"
        if ".seal.json" in name:
            return "seal"
        if ".archive-state" in name:
            return "state"
        if name.endswith(".jsonl"):
            return "part"
        return "dir"

    def _point(self, label: str) -> None:
        self.calls += 1
        self.labels.append(label)
        if self.crash_at is not None and self.calls == self.crash_at:
            raise Crash(label)

    def open(self, path: Any, flags: int, mode: int = 0o777) -> int:
        kind = self._kind(path)
        if flags & self.WRITE_FLAGS:
            self._point(f"open:{kind}")
        fd = os.open(path, flags, mode)
        self._fds[fd] = kind
        return fd

    def write(self, fd: int, data: Any) -> int:
        self._point(f"write:{self._fds.get(fd, '?')}")
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        self._point(f"fsync:{self._fds.get(fd, '?')}")

    def ftruncate(self, fd: int, size: int) -> None:
        self._point(f"ftruncate:{self._fds.get(fd, '?')}")
        os.ftruncate(fd, size)

    def replace(self, src: Any, dst: Any) -> None:
        self._point(f"replace:{self._kind(src)}")
        os.replace(src, dst)

    def unlink(self, path: Any) -> None:
        self._point(f"unlink:{self._kind(path)}")
        os.unlink(path)


def spool_records() -> list[SinkRecord]:
    """N hash-chained records (seq 1..N) around midnight: two days, ~1 KB each."""
    raws = chained(N, MIDNIGHT_NS - N // 2 * 1_000_000, pad=600)
    out = []
    for offset, raw in enumerate(raws):
        doc = orjson.loads(raw)
        out.append(SinkRecord(offset=offset, record_id=doc["id"], doc=doc, raw=raw))
    return out


RECORDS = spool_records()


def new_sink(directory: Path) -> ArchiveSink:
    cfg = ArchiveSinkConfig.model_validate(
        {"type": "archive", "directory": directory, "max_file_bytes": 4096}
    )
    return ArchiveSink(cfg, "archive", directory)


def life(directory: Path, cursor: int, faults: FaultyOs,
         monkeypatch: pytest.MonkeyPatch) -> int:
    """One process: start the sink, ship from `cursor` to the end; the committed cursor.

    Raises Crash (with the cursor committed so far in `faults.committed`).
    """
    monkeypatch.setattr(archive_mod, "os", faults)
    faults.committed = cursor  # type: ignore[attr-defined]
    sink: ArchiveSink | None = None
    try:
        sink = new_sink(directory)
        sink.start()
        pos, sent = cursor, 0
        while pos < N:
            batch = RECORDS[pos : pos + BATCH]
            assert [r.outcome for r in sink.send(batch)] == [Outcome.DELIVERED] * len(batch)
            pos += len(batch)
            sent += 1
            if sent % 2 == 0:
                faults.committed = pos  # type: ignore[attr-defined]
        sink.close()
        return pos
    except Crash:
        # the kernel closes a dead process's files: so do we (thousands of lives)
        if sink is not None:
            sink._close_fds()
        raise
    finally:
        monkeypatch.setattr(archive_mod, "os", os)


def run(directory: Path, crashes: list[int], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Crash at call crashes[0] of the first life, crashes[1] of the second, ...; then a
    clean life. Returns the labels of the crash points actually hit."""
    cursor = 0
    hit = []
    for at in crashes:
        faults = FaultyOs(at)
        try:
            cursor = life(directory, cursor, faults, monkeypatch)
        except Crash as crash:
            hit.append(str(crash))
            cursor = faults.committed  # type: ignore[attr-defined]
    final = FaultyOs(None)
    assert life(directory, cursor, final, monkeypatch) == N
    return hit


def check(directory: Path, what: str) -> None:
    lines = [line.raw for line in read_lines(directory)]
    if lines != [r.raw for r in RECORDS]:
        seqs = [orjson.loads(raw)["seq"] for raw in lines]
        dup = sorted(s for s, n in Counter(seqs).items() if n > 1)
        raise AssertionError(f"{what}: {len(lines)} lines for {N} records; seqs {seqs}, "
                             f"duplicated {dup}")
    report: VerifyReport = verify_archive(directory, None)
    assert report.ok, f"{what}: {report.render()}"
    fast = verify_archive(directory, None, fast=True, rollups=False)
    assert fast.ok, f"{what}: {fast.render()}"
    closed = list_parts(directory)[:-1]
    assert all(p.seal_path.exists() for p in closed), f"{what}: a closed part is unsealed"
    names = [p.name for p in directory.iterdir()]
    assert not [n for n in names if n.endswith(".tmp")], f"{what}: {names}"
    parts = list_parts(directory)
    assert len({(p.day, p.number) for p in parts}) == len(parts) == len(
        [n for n in names if ".jsonl" in n]), f"{what}: a part exists twice: {names}"
    assert all(p.compressed for p in parts[:-1]), f"{what}: closed part left plain: {names}"


def calls_of_clean_run(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> FaultyOs:
    faults = FaultyOs(None)
    life(tmp, 0, faults, monkeypatch)
    return faults


@pytest.fixture
def fast_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on /dev/shm where there is one: thousands of scenarios open files, and
    what a crash leaves does not depend on the filesystem (nothing is fsynced here)."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    d = Path(tempfile.mkdtemp(prefix="archive-crash-", dir=shm))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def scenario_dirs(base: Path) -> Iterator[Path]:
    i = 0
    while True:
        d = base / f"s{i}"
        yield d
        shutil.rmtree(d, ignore_errors=True)
        i += 1


def test_the_issue_sequence_two_crashes_do_not_duplicate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writes a batch and dies before its state is saved; B re-sends
    an older batch (skipped) and dies; C re-sends both: each record is archived once."""
    recs = make_batch(10)
    cfg = ArchiveSinkConfig.model_validate({"type": "archive", "directory": tmp_path})
    a = ArchiveSink(cfg, "archive", tmp_path)
    a.start()
    a.send(recs[:5])

    def dies(*_args: object, **_kw: object) -> None:
        raise Crash

    monkeypatch.setattr(os, "replace", dies)  # A: lines written, state never replaced
    with pytest.raises(Crash):
        a.send(recs[5:])
    monkeypatch.undo()
    b = ArchiveSink(cfg, "archive", tmp_path)
    b.start()
    b.send(recs[:5])  # B dies after this
    c = ArchiveSink(cfg, "archive", tmp_path)
    c.start()
    c.send(recs[:5])
    c.send(recs[5:])
    assert [line.raw for line in read_lines(tmp_path)] == [r.raw for r in recs]


def test_a_clean_run_hits_every_kind_of_boundary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workload rotates, compresses, seals and crosses midnight, so the crash matrix
    below reaches every boundary: the state's write/fsync/rename, a part's
    create/write/fsync, the directory fsync, a compression's write/fsync/rename/unlink and
    a seal's write/fsync/rename."""
    faults = calls_of_clean_run(tmp_path, monkeypatch)
    wanted = {"open:state", "write:state", "fsync:state", "replace:state", "open:part",
              "write:part", "fsync:part", "fsync:dir", "open:gz", "write:gz", "fsync:gz",
              "replace:gz", "unlink:part", "open:seal", "write:seal", "fsync:seal",
              "replace:seal"}
    assert wanted <= set(faults.labels), wanted - set(faults.labels)
    check(tmp_path, "clean run")
    assert {p.day.isoformat() for p in list_parts(tmp_path)} == {"2026-09-21", "2026-09-22"}
    assert len(list_parts(tmp_path)) > 6


def _matrix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
            crash_lists: Callable[[int], Iterator[list[int]]]) -> Counter[str]:
    total = calls_of_clean_run(tmp_path / "probe", monkeypatch).calls
    hit: Counter[str] = Counter()
    dirs = scenario_dirs(tmp_path)
    for crashes in crash_lists(total):
        d = next(dirs)
        for label in run(d, crashes, monkeypatch):
            hit[label] += 1
        check(d, f"crashes at calls {crashes}")
    return hit


def test_one_crash_at_every_boundary(fast_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash at each disk-changing call of a whole run (state save, line write, torn
    line, fsync, part creation, rotation, compression, rename, unlink), then a restart:
    every record archived exactly once, in order, and `audit verify` passes."""
    hit = _matrix(fast_dir, monkeypatch, lambda total: ([n] for n in range(1, total + 1)))
    assert {"write:part", "replace:state", "replace:gz", "unlink:part", "write:seal",
            "replace:seal"} <= set(hit)


# The first K disk-changing calls of a life cover its recovery (truncation, state
# rewrite, finishing a compression) and its first batches.
K = 30


@pytest.mark.slow
def test_two_consecutive_crashes_at_every_boundary(
    fast_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash at every call of a run, then a second crash at each of the first K calls of
    the restarted process (inside its recovery or its first batches): exactly once, in
    order, verify passes."""

    def lists(total: int) -> Iterator[list[int]]:
        for first in range(1, total + 1):
            for second in range(1 + first % 2, K + 1, 2):  # every pair of parities
                yield [first, second]

    hit = _matrix(fast_dir, monkeypatch, lists)
    assert "ftruncate:part" in hit or "unlink:part" in hit  # recovery itself was crashed


@pytest.mark.slow
def test_three_consecutive_crashes(fast_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three crashes in a row, the second and third inside the recovery or the first
    batches of the restarted processes: exactly once, in order, verify passes."""

    def lists(total: int) -> Iterator[list[int]]:
        for first in range(1, total + 1, 7):
            for second in range(1 + first % 3, K + 1, 3):
                for third in range(1 + second % 3, K + 1, 3):
                    yield [first, second, third]

    _matrix(fast_dir, monkeypatch, lists)
