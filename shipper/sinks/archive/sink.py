"""The local archive sink: rotated, gzip-compressed JSON Lines on the local disk.

It is the embedded default, so `gpu-audit run` keeps a complete audit trail with nothing
else installed. Each line is the exact spooled record bytes plus "\\n" (so `audit verify`
re-checks the hash chain on the archive itself). The layout (names, part order, reading
back) is gpu_audit.archive's: one series of parts per host and stream (one hash chain),
`<prefix>_<host>_<stream>_YYYY-MM-DD[.N].jsonl`, the day being the records' own UTC day
and N the part's number in its series. A part is closed when it has reached
`max_file_bytes` and the next record of its series belongs to another cycle (another
`time_ns`: a cycle's records never span two parts, so a part's rollup is whole), or
when a record of a later day is written. A closed part is compressed to `.jsonl.gz`
and then sealed (sealer.py, gpu_audit.archive.seal): its seal names its first and last
seq and hash, its SHA-256, the previous part's seal and the sums a bill needs.

Rotation never lists the directory: the sink lists it once when it starts, and then
keeps each series' next part number and its last seal's digest.

Exactly once, in order, after any sequence of crashes
-----------------------------------------------------
The engine sends records in spool-offset order, resends after a crash from its last
committed cursor, and commits a cursor only past records this sink answered DELIVERED.
The sink keeps one number, L: every record with a spool offset <= L that the archive
takes (not a dead letter) is in the archive exactly once, and no record above L is. A
record with offset <= L is answered DELIVERED without being written again; one above L
is appended. L never falls below an acknowledged offset (a batch is acknowledged only
once it is complete on disk), so the engine's cursor is never past L + 1 and every
record above L is sent again. That is exactly-once as long as L is exact after a crash
at any point, which is what the state file is for.

The state file `.archive-state.json` is a write-ahead journal, replaced atomically (tmp,
fsync, rename, fsync of the directory). Before a batch's first byte is written it holds
L and the plan of the batch: for each file the batch appends to, its size before the
batch and the offsets of the lines planned for it. Only then are the lines written and
fsynced, and only then is DELIVERED returned. So at every instant the journal, together
with the files themselves, says exactly what is on disk:
- the lines of the batch that are complete (ending in "\\n": records never contain one)
  are counted from each file's size before the batch; every planned offset below the
  first incomplete one, in whichever file, is archived; everything after it is cut off
  (truncated: it was never acknowledged), so the archive is always a prefix of the
  offsets the engine sent, and L is the last offset of that prefix;
- recovery first makes the files match that prefix, then replaces the journal with
  L and an empty plan, and only then tidies up. Every recovery step is idempotent, so a
  crash during recovery is recovered by the next start exactly like the first crash.
A part is compressed and sealed only while the journal holds no plan (an empty-plan
journal is written before closing parts after a batch, and recovery writes one first),
so a plan never names a compressed file. A compression writes `.gz.tmp`, fsyncs it,
renames it to `.jsonl.gz`, fsyncs the directory, then deletes the `.jsonl`: a leftover
`.gz.tmp` is deleted on start, and a `.jsonl` beside its `.jsonl.gz` is the same
complete part (the `.gz` appeared whole) and is deleted. A seal is written atomically
after its part is compressed; a closed part without one is sealed on start (a leftover
`.seal.json.tmp` is deleted). A closed part is never appended to again: on start only
each series' last part of the newest day is reopened, and only when it is plain and
unsealed; records for other days open a new part. All file I/O is unbuffered `os`
calls, so what a kill -9 leaves is exactly what the calls before it wrote.

With `fsync: false` the same holds for a killed process, but not across a power loss.
The offsets are the spool's: a spool recreated from scratch needs a fresh archive state
too (delete `.archive-state.json`; the archive then appends whatever is sent).

This sink must never rewrite or reorder an acknowledged line, and never drop a record
without a per-record outcome.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gpu_audit import atomicfile
from gpu_audit.archive import Part, list_parts, parse_name, part_name, read_records
from gpu_audit.archive.seal import ZERO_DIGEST
from gpu_audit.errors import GpuAuditError
from shipper.sinks.archive import sealer
from shipper.sinks.archive.config import ArchiveSinkConfig
from shipper.sinks.archive.encode import NotArchivable, archive_line
from shipper.sinks.base import ItemResult, Outcome, SinkError, SinkRecord

log = logging.getLogger(__name__)

STATE_FILE = ".archive-state.json"
_VERSION = 2


class ArchiveInconsistent(GpuAuditError):
    """The files do not match the journal in a way no crash of this sink can cause."""


Series = tuple[str, str]  # (host, stream)


@dataclass
class _Part:
    """The part currently appended to for one series and day."""

    name: str
    series: Series
    day: dt.date
    number: int
    size: int
    fd: int | None = None
    last_time_ns: int | None = None  # of its last line: a cycle never spans two parts


@dataclass
class _Series:
    """What rotation needs of a series without listing the directory."""

    next_number: int = 0
    last_seal: str = ZERO_DIGEST  # digest of its newest seal


@dataclass
class _Planned:
    """One file a batch appends to: its size before the batch, and what goes into it."""

    part: _Part
    start: int
    offsets: list[int] = field(default_factory=list)
    data: list[bytes] = field(default_factory=list)
    created: bool = False


def _runs(offsets: Sequence[int]) -> list[list[int]]:
    """[[first, count], ...]: a batch's offsets are mostly consecutive, so this is short."""
    out: list[list[int]] = []
    for off in offsets:
        if out and out[-1][0] + out[-1][1] == off:
            out[-1][1] += 1
        else:
            out.append([off, 1])
    return out


def _expand(runs: Sequence[Sequence[int]]) -> list[int]:
    return [first + i for first, count in runs for i in range(count)]


def _write_all(fd: int, data: bytes) -> None:
    # `os` of this module at call time: the crash tests replace it
    sealer.write_all(fd, data, os)


def _last_time_ns(path: Path, size: int) -> int | None:
    """`time_ns` of a part's last (complete) line, or None."""
    if size <= 0:
        return None
    with path.open("rb") as fh:
        fh.seek(max(0, size - (1 << 16)))
        block = fh.read(size - max(0, size - (1 << 16)))
    line = block.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    try:
        t = orjson.loads(line).get("time_ns")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return t if type(t) is int else None


class ArchiveSink:
    kind = "archive"

    def __init__(self, cfg: ArchiveSinkConfig, name: str, directory: Path, *,
                 seal_key: bytes | None = None) -> None:
        self.name = name
        # the trail's HMAC key (audit.hmac_key_file): seals carry a MAC under it, so a
        # seal's sums are as hard to forge as the records' chain
        self._seal_key = seal_key
        self._cfg = cfg
        self._dir = directory
        self._open: dict[Series, _Part] = {}  # one open part per series, at most
        self._series: dict[Series, _Series] = {}
        self._last_offset = -1
        self._ready = False
        self.skipped = 0  # records recognised as already archived (for tests/metrics)

    # -- start: recover ------------------------------------------------------------
    def start(self) -> None:
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
            self._recover()
        except OSError as exc:
            raise SinkError(Outcome.HOLD, f"archive directory {self._dir}: {exc}") from None
        except ArchiveInconsistent as exc:
            raise SinkError(Outcome.HOLD, str(exc)) from None

    def _recover(self) -> None:
        """Make the files and the journal say exactly what is archived (see the docstring)."""
        self._ready = False
        self._close_fds()
        self._open.clear()
        for path in self._dir.iterdir():
            if (path.name.endswith((".gz.tmp", ".seal.json.tmp"))
                    or path.name == STATE_FILE + ".tmp"):
                os.unlink(path)
        last = self._apply_journal()
        self._write_journal(last, [])
        self._last_offset = last
        self._tidy()
        self._ready = True

    def _apply_journal(self) -> int:
        state_path = self._dir / STATE_FILE
        try:
            state: dict[str, Any] = orjson.loads(state_path.read_bytes())
        except FileNotFoundError:
            return -1
        except orjson.JSONDecodeError as exc:
            raise ArchiveInconsistent(
                f"archive state {state_path} is not JSON ({exc}); it is only ever replaced "
                "whole, so something else wrote it: restore it, or delete it to make the "
                "archive append everything the shipper sends from its cursor"
            ) from None
        try:
            if state.get("version") == 1:
                return self._apply_v1(state)
            last = int(state["last_offset"])
            planned = [(str(n), int(s), _expand(r)) for n, s, r in state.get("files", [])]
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ArchiveInconsistent(
                f"archive state {state_path} is not a state this sink writes "
                f"({type(exc).__name__}: {exc}); restore it, or delete it to make the "
                "archive append everything the shipper sends from its cursor"
            ) from None
        found: list[tuple[Path, int, list[int], list[int], int | None]] = []
        cut = None  # the first planned offset that is not complete on disk
        for name, start, offsets in planned:
            ends, size = self._complete_lines(name, start, len(offsets))
            if len(ends) < len(offsets):
                first_missing = offsets[len(ends)]
                cut = first_missing if cut is None else min(cut, first_missing)
            found.append((self._dir / name, start, offsets, ends, size))
        for path, start, offsets, ends, size in found:
            keep = sum(1 for i in range(len(ends)) if cut is None or offsets[i] < cut)
            if keep:
                last = max(last, offsets[keep - 1])
            if size is None:
                continue
            end = start + ends[keep - 1] if keep else start
            if end == 0:
                os.unlink(path)  # created for this batch, nothing of it kept
            elif size > end:
                self._truncate(path, end)
        return last

    def _complete_lines(self, name: str, start: int, planned: int) -> tuple[list[int], int | None]:
        """Ends (relative to start) of the complete planned lines in `name`, and its size."""
        path = self._dir / name
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            if (self._dir / (name + ".gz")).exists():
                raise ArchiveInconsistent(
                    f"archive part {name} is compressed but its last batch is not settled; "
                    "parts are compressed only after that, so another process changed "
                    "this directory"
                ) from None
            if start > 0:
                raise ArchiveInconsistent(
                    f"archive part {path} held {start} bytes before its last batch and is "
                    "gone: it was deleted or moved by something else"
                ) from None
            return [], None
        if size < start:
            raise ArchiveInconsistent(
                f"archive part {path} is {size} bytes, shorter than the {start} bytes it "
                "held before its last batch: it was truncated or replaced by something else"
            )
        with path.open("rb") as fh:
            fh.seek(start)
            data = fh.read(size - start)
        ends: list[int] = []
        pos = data.find(b"\n")
        while pos >= 0:
            ends.append(pos + 1)
            pos = data.find(b"\n", pos + 1)
        if len(ends) > planned:
            raise ArchiveInconsistent(
                f"archive part {path} holds {len(ends) - planned} complete line(s) after "
                "the lines of its last batch: another writer appended to it"
            )
        return ends, size

    def _apply_v1(self, state: Mapping[str, Any]) -> int:
        # The previous format saved the state after the lines: bytes past the sizes it
        # recorded were never acknowledged, so they are cut and the engine sends them again.
        for name, size in dict(state.get("files", {})).items():
            path = self._dir / str(name)
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_size > int(size):
                    self._truncate(path, int(size))
        log.warning("archive %s: state file upgraded from version 1", self._dir)
        return int(state.get("last_offset", -1))

    def _tidy(self) -> None:
        """Finish interrupted compressions, close and seal what is closed, reopen each
        series' live part; learn each series' next part number and last seal (the one
        listing of the directory)."""
        for path in list(self._dir.iterdir()):
            parsed = parse_name(path.name)
            if (parsed and not parsed.compressed
                    and (self._dir / (path.name + ".gz")).exists()):
                os.unlink(path)  # its .gz is complete: renamed into place only when whole
        parts = list_parts(self._dir, self._cfg.prefix)
        self._series = {}
        if not parts:
            return
        newest = max(p.day for p in parts)
        by_series: dict[Series, list[Part]] = {}
        for p in parts:
            if p.legacy:
                if not p.compressed:  # never appended to again: closed
                    self._compress(p.path.name)
                continue
            by_series.setdefault((p.host, p.stream), []).append(p)
        for key, series_parts in by_series.items():
            state = self._series[key] = _Series(next_number=series_parts[-1].number + 1)
            last = series_parts[-1]
            live = (last if last.day == newest and not last.compressed
                    and not last.seal_path.exists() else None)
            for p in series_parts:
                if p is live:
                    continue
                if p.seal_path.exists():
                    state.last_seal = sealer.seal_digest(p.seal_path)
                    continue
                self._close_part(p, state)
            if live is not None:
                self._reopen(live)

    def _reopen(self, live: Part) -> None:
        size = self._cut_torn_tail(live.path)
        fd = os.open(live.path, os.O_WRONLY | os.O_APPEND)
        self._open[live.host, live.stream] = _Part(
            live.path.name, (live.host, live.stream), live.day, live.number, size, fd,
            _last_time_ns(live.path, size))

    def _close_part(self, p: Part, state: _Series) -> None:
        """Compress (when configured) and seal a closed part of a series."""
        name = p.path.name
        if not p.compressed and self._cfg.compress:
            self._compress(name)
            name += ".gz"
        try:
            state.last_seal = sealer.seal_part(
                self._dir, name, host=p.host, stream=p.stream, day=p.day.isoformat(),
                number=p.number, prev_seal=state.last_seal, fsync=self._cfg.fsync, ops=os,
                key=self._seal_key)
        except sealer.CannotSeal as exc:
            log.error("archive %s: part left unsealed: %s", self._dir, exc)

    def _cut_torn_tail(self, path: Path) -> int:
        """Cut bytes after the last "\\n" (a line torn outside any plan); the new size."""
        size = path.stat().st_size
        with path.open("rb") as fh:
            pos = size
            while pos > 0:
                step = min(pos, 64 * 1024)
                fh.seek(pos - step)
                block = fh.read(step)
                nl = block.rfind(b"\n")
                if nl >= 0:
                    end = pos - step + nl + 1
                    break
                pos -= step
            else:
                end = 0
        if end < size:
            self._truncate(path, end)
        return end

    def _truncate(self, path: Path, size: int) -> None:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, size)
            if self._cfg.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    # -- writing -------------------------------------------------------------------
    def send(self, batch: Sequence[SinkRecord]) -> Sequence[ItemResult]:
        try:
            if not self._ready:
                self._recover()
            return self._send(batch)
        except OSError as exc:
            # ENOSPC and friends: nothing of this batch is acknowledged. Recovery cuts
            # what was written of it (freeing the space) and makes L exact again.
            with contextlib.suppress(OSError, ArchiveInconsistent):
                self._recover()
            raise SinkError(Outcome.RETRY, f"archive write failed: {exc}") from None
        except ArchiveInconsistent as exc:
            raise SinkError(Outcome.HOLD, str(exc)) from None

    def _send(self, batch: Sequence[SinkRecord]) -> Sequence[ItemResult]:
        results: list[ItemResult] = []
        plan: dict[str, _Planned] = {}
        current = dict(self._open)
        to_close: list[_Part] = []
        max_day: dt.date | None = None
        top = self._last_offset
        numbers: dict[Series, int] = {}  # next part numbers, kept if the batch lands
        for rec in batch:
            try:
                host, stream, day, line = archive_line(rec)
            except NotArchivable as exc:
                results.append(ItemResult(Outcome.DEAD_LETTER, str(exc)))
                continue
            results.append(ItemResult(Outcome.DELIVERED))
            if rec.offset <= top:
                self.skipped += 1
                continue
            top = rec.offset
            max_day = day if max_day is None or day > max_day else max_day
            key = (host, stream)
            time_ns = rec.doc["time_ns"]
            part = current.get(key)
            if part is not None and (part.day != day or (
                    part.size >= self._cfg.max_file_bytes and part.last_time_ns != time_ns)):
                # another day, or full and this record starts another cycle (the part is
                # whole): a series has one open part, so its parts close in number order
                # and its seals chain in that order
                to_close.append(current.pop(key))
                part = None
            if part is None:
                part = current[key] = self._new_part(host, stream, day, numbers)
            item = plan.get(part.name)
            if item is None:
                item = plan[part.name] = _Planned(part, part.size, created=part.fd is None)
            item.offsets.append(rec.offset)
            item.data.append(line)
            part.size += len(line)
            part.last_time_ns = time_ns
        if not plan:
            return results
        if max_day is not None:
            to_close += [p for p in current.values() if p.day < max_day]
            current = {k: p for k, p in current.items() if p.day >= max_day}
        self._write_journal(self._last_offset, list(plan.values()))
        for item in plan.values():
            if item.part.fd is None:
                item.part.fd = os.open(
                    self._dir / item.part.name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
                )
            _write_all(item.part.fd, b"".join(item.data))
        if self._cfg.fsync:
            for item in plan.values():
                assert item.part.fd is not None
                os.fsync(item.part.fd)
            if any(item.created for item in plan.values()):
                self._fsync_dir()
        # durable: from here on the batch is acknowledged whatever happens next
        self._last_offset = top
        self._open = current
        for series, number in numbers.items():
            self._series.setdefault(series, _Series()).next_number = number
        if to_close:
            self._close_parts(to_close)
        return results

    def _new_part(self, host: str, stream: str, day: dt.date,
                  numbers: dict[Series, int]) -> _Part:
        """The series' next part (no directory listing: the number is remembered)."""
        series = (host, stream)
        state = self._series.get(series)
        number = numbers.get(series, state.next_number if state is not None else 0)
        numbers[series] = number + 1
        name = part_name(self._cfg.prefix, day, number, host=host, stream=stream)
        return _Part(name, series, day, number, 0)

    def _close_parts(self, parts: Sequence[_Part]) -> None:
        for p in parts:
            if p.fd is not None:
                os.close(p.fd)
                p.fd = None
        # a plan never names a compressed or sealed part
        self._write_journal(self._last_offset, [])
        for p in sorted(parts, key=lambda q: (q.series, q.number)):
            state = self._series.setdefault(p.series, _Series(next_number=p.number + 1))
            host, stream = p.series
            closed = Part(self._cfg.prefix, host, stream, p.day, p.number, self._dir / p.name,
                          False)
            try:
                self._close_part(closed, state)
            except OSError as exc:
                # the lines are safe in the plain part; recovery (before the next batch)
                # closes and seals it, in order, so the seal chain keeps its order
                log.warning("archive %s: closing %s failed: %s", self._dir, p.name, exc)
                self._ready = False
                return

    def _compress(self, name: str) -> None:
        if self._cfg.compress:
            sealer.compress(self._dir, name, fsync=self._cfg.fsync, ops=os)

    def _write_journal(self, last: int, plan: Sequence[_Planned]) -> None:
        state = {
            "version": _VERSION,
            "last_offset": last,
            "files": [[i.part.name, i.start, _runs(i.offsets)] for i in plan],
        }
        # `ops=os` is this module's `os`, looked up at call time: the crash-matrix tests
        # replace it, so every step of the journal's replacement stays a crash point.
        atomicfile.replace_file(self._dir / STATE_FILE, orjson.dumps(state),
                                fsync=self._cfg.fsync, mode=0o644, ops=os)
        # replace_file fsyncs the directory: the plan is on disk before any of its lines

    def _fsync_dir(self) -> None:
        atomicfile.fsync_dir(self._dir, ops=os)

    def _close_fds(self) -> None:
        for p in self._open.values():
            if p.fd is not None:
                with contextlib.suppress(OSError):
                    os.close(p.fd)
                p.fd = None

    def close(self) -> None:
        """Close open files without compressing: the next start appends to the live part."""
        self._close_fds()
        self._open.clear()
        self._ready = False

    # -- reading -------------------------------------------------------------------
    def files(self) -> list[Path]:
        """Archive files in archive order (day, then part number)."""
        return [p.path for p in list_parts(self._dir, self._cfg.prefix)]

    def read_back(self, start_ns: int, end_ns: int) -> Iterator[Mapping[str, Any]]:
        return read_records(self._dir, start_ns, end_ns, self._cfg.prefix)
