"""The per-sink dead-letter file: records a backend rejected for good, with the reason.

`<spool>/deadletter/<sink>.jsonl`, one JSON object per line:
`{"sink", "offset", "record_id", "reason", "time_ns", "record"}` where `record` is the
decoded audit record, or `"raw_b64"` holds the stored bytes when they were not valid JSON.
Each `write()` is flushed and fsynced before it returns, because the engine moves the
sink's cursor over a dead-lettered record only after this file holds it: a crash can then
never lose a rejected record. A replay after a crash may dead-letter the same record
again; lines are keyed by spool offset and a second line for an offset already in the
file is not written, so the file holds each rejected record exactly once.

This module never drops a record and never rewrites or truncates existing lines (a torn
last line from a crash is completed with a newline before appending).
"""

from __future__ import annotations

import base64
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class DeadLetter:
    offset: int
    record_id: str
    reason: str
    raw: bytes
    doc: Any | None  # the decoded record, None when the bytes were not valid JSON


class DeadLetterFile:
    """Append-only, fsynced, de-duplicated by spool offset."""

    def __init__(self, directory: Path, sink: str) -> None:
        self.path = directory / f"{sink}.jsonl"
        self.sink = sink
        self._lock = threading.Lock()
        self._offsets: set[int] = set()
        directory.mkdir(parents=True, exist_ok=True)
        self._load()

    def _load(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        for line in data.splitlines():
            try:
                entry = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue  # a torn last line from a crash: its record is re-dead-lettered
            if isinstance(entry, dict) and isinstance(entry.get("offset"), int):
                self._offsets.add(entry["offset"])
        if data and not data.endswith(b"\n"):
            # terminate the torn line so the next append starts on a line of its own
            with self.path.open("ab") as fh:
                fh.write(b"\n")
                fh.flush()
                os.fsync(fh.fileno())

    @property
    def count(self) -> int:
        """How many distinct records the file holds."""
        with self._lock:
            return len(self._offsets)

    def write(self, letters: Sequence[DeadLetter], time_ns: int) -> int:
        """Append the letters not already in the file, fsync, return how many were new."""
        with self._lock:
            lines = []
            fresh: list[int] = []
            for letter in letters:
                if letter.offset in self._offsets or letter.offset in fresh:
                    continue
                entry: dict[str, Any] = {
                    "sink": self.sink,
                    "offset": letter.offset,
                    "record_id": letter.record_id,
                    "reason": letter.reason,
                    "time_ns": time_ns,
                }
                if letter.doc is not None:
                    entry["record"] = letter.doc
                else:
                    entry["raw_b64"] = base64.b64encode(letter.raw).decode("ascii")
                lines.append(orjson.dumps(entry) + b"\n")
                fresh.append(letter.offset)
            if not lines:
                return 0
            created = not self.path.exists()
            with self.path.open("ab") as fh:
                fh.write(b"".join(lines))
                fh.flush()
                os.fsync(fh.fileno())
            if created:
                # a new file's directory entry must be durable too, or a crash loses it
                dir_fd = os.open(self.path.parent, os.O_RDONLY)
                try:
                    os.fsync(dir_fd)
                finally:
                    os.close(dir_fd)
            self._offsets.update(fresh)
            return len(fresh)
