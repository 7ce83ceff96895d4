"""The local archive sink: rotated, gzip-compressed JSON Lines on the local disk.

It is the embedded default, so `gpu-audit run` keeps a complete audit trail with nothing
else installed. Each line is the exact spooled record bytes plus "\\n" (so `audit verify`
re-checks the hash chain on the archive itself). Files are
`<dir>/<prefix>-YYYY-MM-DD[.N].jsonl`, the day being the record's own UTC day; a file is
rotated when it passes `max_file_bytes` or when a later day arrives, and a closed file is
compressed to `.jsonl.gz` atomically (temporary file, fsync, rename, then unlink).

Crash safety (why nothing is lost and nothing is written twice):
1. send() appends the batch's lines, fsyncs the files, then atomically replaces
   `.archive-state.json` (tmp + fsync + rename) with: the highest spool offset archived,
   each open file's committed size, and the hashes of the last batch's lines. Only then
   does it return DELIVERED, so the engine commits its cursor after the lines are durable.
2. Crash before the lines are durable: the records were not acknowledged; the engine
   resends them. A torn last line (no "\\n") is truncated on start.
3. Crash after the lines, before the state: the lines past the committed size of each
   open file are hashed on start; resent records with those exact bytes are skipped.
4. Crash after the state, before the engine's cursor commit: the engine resends the last
   batch; its offsets are <= the archived offset (and its hashes are in the state), so it
   is skipped.
5. Crash during compression: a `.gz.tmp` is deleted; a `.jsonl` beside a complete
   `.jsonl.gz` (renamed after fsync) is deleted; otherwise the `.jsonl` stays open.
The offsets are the spool's: recreating the spool from scratch needs a fresh archive
state too (delete `.archive-state.json`), as the shipper's cursors do.

This sink must never rewrite or reorder a committed line, and never drop a record
without a per-record outcome.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gzip
import hashlib
import os
import re
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from shipper.sinks.base import ItemResult, Outcome, SinkError, SinkRecord
from shipper.sinks.config import ArchiveSinkConfig

STATE_FILE = ".archive-state.json"


def _line_hash(raw: bytes) -> str:
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


def _day(time_ns: int) -> dt.date:
    return dt.datetime.fromtimestamp(time_ns // 1_000_000_000, tz=dt.UTC).date()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class _Open:
    path: Path
    day: dt.date
    part: int
    handle: IO[bytes]
    size: int


class ArchiveSink:
    kind = "archive"

    def __init__(self, cfg: ArchiveSinkConfig, name: str, directory: Path) -> None:
        self.name = name
        self._cfg = cfg
        self._dir = directory
        self._pattern = re.compile(
            re.escape(cfg.prefix) + r"-(\d{4}-\d{2}-\d{2})(?:\.(\d+))?\.jsonl(\.gz)?$"
        )
        self._open: dict[dt.date, _Open] = {}
        self._last_offset = -1
        self._recent: set[str] = set()  # hashes of the last committed batch
        self._pending: set[str] = set()  # hashes of lines found past the committed size
        self.skipped = 0  # records recognised as already archived (for tests/metrics)

    # -- start: recover ------------------------------------------------------------
    def start(self) -> None:
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
            self._recover()
        except OSError as exc:
            raise SinkError(Outcome.HOLD, f"archive directory {self._dir}: {exc}") from None

    def _recover(self) -> None:
        state: dict[str, Any] = {}
        state_path = self._dir / STATE_FILE
        if state_path.exists():
            state = orjson.loads(state_path.read_bytes())
        self._last_offset = int(state.get("last_offset", -1))
        self._recent = set(state.get("recent", []))
        committed: dict[str, int] = state.get("files", {})
        for tmp in self._dir.glob("*.gz.tmp"):
            tmp.unlink()
        for path in sorted(self._dir.iterdir()):
            m = self._pattern.match(path.name)
            if not m or m.group(3):
                continue
            if path.with_name(path.name + ".gz").exists():
                path.unlink()  # compressed copy is complete (renamed only after fsync)
                continue
            self._scan_tail(path, committed.get(path.name, 0))
            day = dt.date.fromisoformat(m.group(1))
            part = int(m.group(2) or 0)
            current = self._open.get(day)
            if current is not None and current.part > part:
                self._close(self._open_file(path, day, part))
                continue
            if current is not None:
                self._close(current)
            self._open[day] = self._open_file(path, day, part)

    def _scan_tail(self, path: Path, committed: int) -> None:
        """Truncate a torn last line; remember the hashes of lines past `committed`."""
        with path.open("r+b") as fh:
            data = fh.read()
            end = data.rfind(b"\n") + 1
            if end < len(data):
                fh.truncate(end)
                fh.flush()
                os.fsync(fh.fileno())
        start = committed if committed <= end else 0
        for line in data[start:end].split(b"\n"):
            if line:
                self._pending.add(_line_hash(line))

    def _open_file(self, path: Path, day: dt.date, part: int) -> _Open:
        handle = path.open("ab")
        return _Open(path, day, part, handle, handle.tell())

    # -- writing -------------------------------------------------------------------
    def _path(self, day: dt.date, part: int, suffix: str = ".jsonl") -> Path:
        stem = f"{self._cfg.prefix}-{day.isoformat()}"
        return self._dir / (f"{stem}{suffix}" if part == 0 else f"{stem}.{part}{suffix}")

    def _next_part(self, day: dt.date) -> int:
        parts = [-1]
        for path in self._dir.glob(f"{self._cfg.prefix}-{day.isoformat()}*"):
            m = self._pattern.match(path.name)
            if m and m.group(1) == day.isoformat():
                parts.append(int(m.group(2) or 0))
        return max(parts) + 1

    def _file_for(self, day: dt.date, created: list[Path]) -> _Open:
        current = self._open.get(day)
        if current is not None:
            return current
        part = self._next_part(day)
        path = self._path(day, part)
        opened = self._open_file(path, day, part)
        created.append(path)
        self._open[day] = opened
        return opened

    def send(self, batch: Sequence[SinkRecord]) -> Sequence[ItemResult]:
        results: list[ItemResult] = []
        touched: dict[Path, _Open] = {}
        created: list[Path] = []
        to_rotate: list[_Open] = []
        hashes: list[str] = []
        max_day: dt.date | None = None
        try:
            for rec in batch:
                h = _line_hash(rec.raw)
                hashes.append(h)
                time_ns = rec.doc.get("time_ns")
                if not isinstance(time_ns, int) or isinstance(time_ns, bool):
                    results.append(ItemResult(Outcome.DEAD_LETTER, "record has no time_ns"))
                    continue
                if b"\n" in rec.raw or b"\r" in rec.raw:
                    results.append(ItemResult(
                        Outcome.DEAD_LETTER, "raw record spans lines; JSON Lines needs one"))
                    continue
                if rec.offset <= self._last_offset or h in self._pending or h in self._recent:
                    self.skipped += 1
                    results.append(ItemResult(Outcome.DELIVERED))
                    continue
                day = _day(time_ns)
                max_day = day if max_day is None or day > max_day else max_day
                target = self._file_for(day, created)
                target.handle.write(rec.raw + b"\n")
                target.size += len(rec.raw) + 1
                touched[target.path] = target
                results.append(ItemResult(Outcome.DELIVERED))
                if target.size >= self._cfg.max_file_bytes:
                    to_rotate.append(target)
                    del self._open[day]
            for target in touched.values():
                target.handle.flush()
                if self._cfg.fsync:
                    os.fsync(target.handle.fileno())
            if created and self._cfg.fsync:
                _fsync_dir(self._dir)
            if batch:
                self._last_offset = max(self._last_offset, *(r.offset for r in batch))
            self._recent = set(hashes)
            self._write_state()
            # closing happens after the state so a closed file only holds committed lines
            if max_day is not None:
                to_rotate += [f for d, f in list(self._open.items()) if d < max_day]
                for f in to_rotate:
                    if self._open.get(f.day) is f:
                        del self._open[f.day]
            for f in to_rotate:
                self._close(f)
        except OSError as exc:
            # ENOSPC and friends: nothing of this batch is acknowledged; a resend is
            # recognised by the tail scan (hashes) or simply rewritten if not written
            self._reopen_after_error()
            raise SinkError(Outcome.RETRY, f"archive write failed: {exc}") from None
        return results

    def _reopen_after_error(self) -> None:
        for f in list(self._open.values()):
            with contextlib.suppress(OSError):
                f.handle.close()
        self._open.clear()
        self._pending.clear()
        with contextlib.suppress(OSError):
            self._recover()

    def _write_state(self) -> None:
        state = {
            "version": 1,
            "last_offset": self._last_offset,
            "files": {f.path.name: f.size for f in self._open.values()},
            "recent": sorted(self._recent),
        }
        tmp = self._dir / (STATE_FILE + ".tmp")
        with tmp.open("wb") as fh:
            fh.write(orjson.dumps(state))
            fh.flush()
            if self._cfg.fsync:
                os.fsync(fh.fileno())
        # a stale state after a crash is safe: lines past its sizes are hashed on start
        tmp.replace(self._dir / STATE_FILE)

    def _close(self, f: _Open) -> None:
        f.handle.close()
        if not self._cfg.compress:
            return
        gz = f.path.with_name(f.path.name + ".gz")
        tmp = gz.with_name(gz.name + ".tmp")
        with f.path.open("rb") as src, tmp.open("wb") as raw_dst:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw_dst, mtime=0) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            raw_dst.flush()
            if self._cfg.fsync:
                os.fsync(raw_dst.fileno())
        tmp.replace(gz)
        if self._cfg.fsync:
            _fsync_dir(self._dir)
        f.path.unlink()

    def close(self) -> None:
        """Close open files without compressing: the next start appends to them."""
        for f in self._open.values():
            f.handle.close()
        self._open.clear()

    # -- reading -------------------------------------------------------------------
    def files(self) -> list[Path]:
        """Archive files in (day, part) order."""
        found: list[tuple[str, int, Path]] = []
        for path in self._dir.iterdir():
            m = self._pattern.match(path.name)
            if m:
                found.append((m.group(1), int(m.group(2) or 0), path))
        return [p for _, _, p in sorted(found)]

    def read_back(self, start_ns: int, end_ns: int) -> Iterator[Mapping[str, Any]]:
        first, last = _day(start_ns), _day(max(start_ns, end_ns - 1))
        for f in self._open.values():
            f.handle.flush()
        for path in self.files():
            m = self._pattern.match(path.name)
            assert m is not None
            if not first <= dt.date.fromisoformat(m.group(1)) <= last:
                continue
            opener = gzip.open if path.name.endswith(".gz") else open
            with opener(path, "rb") as fh:
                for line in fh:
                    if not line.endswith(b"\n"):
                        break  # a line still being written
                    doc = orjson.loads(line)
                    t = doc.get("time_ns")
                    if isinstance(t, int) and start_ns <= t < end_ns:
                        yield doc
