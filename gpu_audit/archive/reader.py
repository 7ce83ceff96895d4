"""Read an archive back, line by line, in the order the lines were written.

Within a part the lines are in write order; parts come in archive order (see layout):
legacy parts first, then each host's stream in part-number order, which is the order it
was written in.

A part is read in large blocks (`PartLines.chunks`: lists of lines, no object per line)
so that verifying a trail costs little more than decompressing it. Damage never raises
out of here: a compressed part that ends early (truncated), or bytes that are not gzip,
end the part's lines at the last complete one and `PartLines.damage` says what happened
and after which line, so a caller reports it and goes on with the next part.

A part's last line without its "\\n" is a line still being written (or torn by a crash
that the sink's next start cuts off): it is not among the lines; `PartLines.torn` holds
it, and `read_lines` yields it marked incomplete.

This module only reads; it never repairs, reorders or deletes anything.
"""

from __future__ import annotations

import datetime as dt
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from gpu_audit.archive.layout import Part, day_of, list_parts

_BLOCK = 1 << 20


class PartLines:
    """The complete lines of one part file (plain or gzip, by its name), in blocks.

    After iterating: `lines` (how many "\\n"-terminated lines, empty ones included),
    `torn` (the bytes after the last "\\n", or None), `damage` (why reading stopped
    early, or None) and `bytes_read` (of the file).
    """

    def __init__(self, path: Path, compressed: bool | None = None) -> None:
        self.path = path
        self.compressed = path.name.endswith(".gz") if compressed is None else compressed
        self.lines = 0
        self.torn: bytes | None = None
        self.damage: str | None = None
        self.bytes_read = 0

    def chunks(self) -> Iterator[tuple[int, list[bytes]]]:
        """(number of the first line, lines without their "\\n") blocks; empty lines
        are included (as b"") so numbers stay exact."""
        tail = b""
        for block in self._blocks():
            data = tail + block if tail else block
            lines = data.split(b"\n")
            tail = lines.pop()
            if lines:
                first = self.lines + 1
                self.lines += len(lines)
                yield first, lines
        if tail:
            self.torn = tail

    def _blocks(self) -> Iterator[bytes]:
        with self.path.open("rb") as fh:
            if not self.compressed:
                while block := fh.read(_BLOCK):
                    self.bytes_read += len(block)
                    yield block
                return
            d: Any = zlib.decompressobj(31)
            member_done = False
            while True:
                raw = fh.read(_BLOCK)
                if not raw:
                    break
                self.bytes_read += len(raw)
                while raw:
                    try:
                        out = d.decompress(raw)
                    except zlib.error as exc:
                        self.damage = (f"not a readable gzip stream at compressed byte "
                                       f"{self.bytes_read - len(raw)} ({exc})")
                        return
                    if out:
                        yield out
                    if d.eof:
                        # a further gzip member may follow (concatenated members)
                        raw = d.unused_data
                        d = zlib.decompressobj(31)
                        member_done = not raw
                    else:
                        raw = b""
                        member_done = False
            if not member_done:
                self.damage = ("the compressed part ends early (truncated: no gzip "
                               "end-of-stream marker)")

    def where_damaged(self) -> str:
        """The damage with the last good line named."""
        last = f"after line {self.lines}" if self.lines else "before its first line"
        return f"{self.path.name}: {self.damage}; its lines end {last}"


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


def read_lines(
    directory: Path, prefix: str | None = None, parts: list[Part] | None = None,
    damage: list[str] | None = None,
) -> Iterator[ArchiveLine]:
    """Every line of the archive (or of the given parts), in write order.

    Empty lines are skipped (they hold no record; the sink never writes one). A damaged
    part's lines end at its last complete one; what happened is appended to `damage`
    when a list is given.
    """
    for part in list_parts(directory, prefix) if parts is None else parts:
        reader = PartLines(part.path, part.compressed)
        for first, lines in reader.chunks():
            for i, raw in enumerate(lines):
                if raw.strip():
                    yield ArchiveLine(part, first + i, raw, True)
        if reader.torn is not None and reader.torn.strip():
            yield ArchiveLine(part, reader.lines + 1, reader.torn, False)
        if reader.damage is not None and damage is not None:
            damage.append(reader.where_damaged())


def read_records(
    directory: Path, start_ns: int, end_ns: int, prefix: str | None = None
) -> Iterator[dict[str, Any]]:
    """The records with `time_ns` in [start_ns, end_ns), in write order.

    Only the parts of the days that range touches are opened.
    """
    # a day more at the end: archives written before parts were named by the interval's
    # day hold a record at midnight sharp in the next day's part
    first = day_of(start_ns)
    last = day_of(max(start_ns, end_ns - 1)) + dt.timedelta(days=1)
    parts = [p for p in list_parts(directory, prefix) if first <= p.day <= last]
    for line in read_lines(directory, prefix, parts):
        if not line.complete:
            continue
        doc = orjson.loads(line.raw)
        t = doc.get("time_ns") if isinstance(doc, dict) else None
        if isinstance(t, int) and start_ns <= t < end_ns:
            yield doc
