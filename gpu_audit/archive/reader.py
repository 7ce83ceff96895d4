"""Read an archive back, line by line, in the order the lines were written.

Within a part the lines are in write order, and the parts of an archive come in archive
order (see layout), which is the order they were written in: a day's parts one after
the other, days in calendar order. A record that arrives for a day whose part is already
closed goes to a new part of its own day, so it is read where its time puts it.

A part's last line without its "\\n" is a line still being written (or torn by a crash
that the sink's next start cuts off); `read_lines` marks it incomplete instead of
hiding it, and `read_records` leaves it out.

This module only reads; it never repairs, reorders or deletes anything.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from gpu_audit.archive.layout import Part, day_of, list_parts


@dataclass(frozen=True, slots=True)
class ArchiveLine:
    """One line of an archive: where it is, and its bytes without the newline."""

    part: Part
    number: int  # 1-based line number within its file
    raw: bytes
    complete: bool  # False only for a file's last line that has no "\n" (yet)

    @property
    def where(self) -> str:
        return f"{self.part.path.name} line {self.number}"


def _open(part: Part) -> gzip.GzipFile | BinaryIO:
    if part.compressed:
        return gzip.GzipFile(part.path, "rb")
    return part.path.open("rb")


def read_lines(
    directory: Path, prefix: str | None = None, parts: list[Part] | None = None
) -> Iterator[ArchiveLine]:
    """Every line of the archive (or of the given parts), in write order.

    Empty lines are skipped (they hold no record; the sink never writes one).
    """
    for part in list_parts(directory, prefix) if parts is None else parts:
        with _open(part) as fh:
            for number, line in enumerate(fh, 1):
                complete = line.endswith(b"\n")
                raw = line[:-1] if complete else line
                if raw.strip():
                    yield ArchiveLine(part, number, raw, complete)


def read_records(
    directory: Path, start_ns: int, end_ns: int, prefix: str | None = None
) -> Iterator[dict[str, Any]]:
    """The records with `time_ns` in [start_ns, end_ns), in write order.

    Only the parts of the days that range touches are opened.
    """
    first, last = day_of(start_ns), day_of(max(start_ns, end_ns - 1))
    parts = [p for p in list_parts(directory, prefix) if first <= p.day <= last]
    for line in read_lines(directory, prefix, parts):
        if not line.complete:
            continue
        doc = orjson.loads(line.raw)
        t = doc.get("time_ns") if isinstance(doc, dict) else None
        if isinstance(t, int) and start_ns <= t < end_ns:
            yield doc
