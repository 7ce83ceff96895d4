"""Reading the spool: records by offset, across segments, while the writer appends.

Only complete frames with a valid CRC and the expected offset are returned. Offsets that
no longer exist (deleted by gc, lost to a quarantined or damaged segment) are skipped and
reported through `ReadResult.skipped_to` so the caller can count the gap. Each segment
keeps a sparse offset -> position index, so sequential reads never rescan.

A reader holds no file open between calls: a segment is opened when a read needs it and
closed before `read` returns. A long-lived reader (a sink's, the producer's start-up scan)
would otherwise keep segments that gc or eviction deleted alive on disk, and a full
filesystem would never get its space back. This module must never modify, truncate or
delete anything in the spool.
"""

from __future__ import annotations

import bisect
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from gpu_audit.spool.format import (
    FRAME_HEAD,
    FRAME_HEAD_SIZE,
    HEADER_SIZE,
    find_resync,
    header_problem,
)
from gpu_audit.spool.recovery import list_segments

INDEX_EVERY = 64  # frames between sparse index entries
CHUNK = 1 << 20

_END = "end"  # no more valid frames in this segment (for now, when it is the last)
_LIMIT = "limit"  # a caller limit stopped the scan
_DAMAGE = "damage"  # a bad frame; the segment records a hole


@dataclass(frozen=True)
class ReadResult:
    """Records read, the offset to ask for next, and where a gap was skipped to."""

    entries: list[tuple[int, bytes]]
    next_offset: int
    skipped_to: int | None = None


@dataclass
class _Segment:
    base: int
    path: Path
    inode: int
    fd: int | None = None  # open only during a read() call
    index_offsets: list[int] = field(default_factory=list)
    index_positions: list[int] = field(default_factory=list)
    known_pos: int = HEADER_SIZE  # frames before this position are validated
    known_offset: int = 0
    # offset of a damaged frame -> first valid (offset, position) after it, or None when
    # nothing in the rest of the segment could be recognised.
    holes: dict[int, tuple[int, int] | None] = field(default_factory=dict)
    header_bad: bool = True  # until a valid header has been seen

    def reset(self, inode: int) -> None:
        """Another file now has this name (recovery rewrote it): forget what was learnt."""
        self.inode = inode
        self.index_offsets.clear()
        self.index_positions.clear()
        self.known_pos = HEADER_SIZE
        self.known_offset = self.base
        self.holes.clear()
        self.header_bad = True

    def add_index(self, offset: int, pos: int) -> None:
        if not self.index_offsets or offset > self.index_offsets[-1]:
            self.index_offsets.append(offset)
            self.index_positions.append(pos)

    def position_hint(self, offset: int) -> tuple[int, int]:
        """The nearest indexed (offset, position) at or before `offset`."""
        at = bisect.bisect_right(self.index_offsets, offset) - 1
        if at < 0:
            return self.base, HEADER_SIZE
        return self.index_offsets[at], self.index_positions[at]


class SpoolReader:
    """Reads one spool directory; safe to use from another process than the writer."""

    def __init__(self, directory: Path | str) -> None:
        self._dir = Path(directory)
        self._segments: list[_Segment] = []
        self._bases: list[int] = []
        self._hint: tuple[int, int, int] | None = None  # (offset, segment base, position)

    # -- segment bookkeeping ---------------------------------------------------------

    def _refresh(self) -> None:
        self._release()
        current = {segment.base: segment for segment in self._segments}
        fresh: list[_Segment] = []
        for base, path in list_segments(self._dir):
            try:
                inode = path.stat().st_ino
            except FileNotFoundError:
                continue
            old = current.pop(base, None)
            if old is not None and old.inode == inode:
                fresh.append(old)
                continue
            fresh.append(_Segment(base, path, inode, known_offset=base))
        self._segments = fresh
        self._bases = [segment.base for segment in fresh]

    @staticmethod
    def _fd(seg: _Segment) -> int:
        """The segment's file, opened for this read() call. FileNotFoundError when gc or
        eviction deleted it since the last listing (the caller lists again)."""
        if seg.fd is None:
            fd = os.open(seg.path, os.O_RDONLY)
            inode = os.fstat(fd).st_ino
            if inode != seg.inode:
                seg.reset(inode)
            seg.fd = fd
        return seg.fd

    def _release(self) -> None:
        """Close every segment file: nothing stays open between calls."""
        for segment in self._segments:
            if segment.fd is not None:
                os.close(segment.fd)
                segment.fd = None

    def close(self) -> None:
        self._release()
        self._segments = []
        self._bases = []

    def __enter__(self) -> SpoolReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- scanning ----------------------------------------------------------------------

    def _scan(
        self,
        seg: _Segment,
        pos: int,
        offset: int,
        *,
        stop_offset: int | None,
        max_records: int = 0,
        max_bytes: int = 0,
        out: list[tuple[int, bytes]] | None = None,
    ) -> tuple[int, int, str]:
        """Walk valid frames from (pos, offset); collect into `out` when given.

        Stops before `stop_offset`, once `out` holds `max_records` records, or once the
        payloads collected reach `max_bytes` (so at least one record is always taken).
        Returns (position, offset, status) of where it stopped.
        """
        taken = len(out) if out is not None else 0
        size = sum(len(p) for _o, p in out) if out else 0
        unpack = FRAME_HEAD.unpack_from
        crc32 = zlib.crc32
        want = CHUNK
        while True:
            buf = os.pread(self._fd(seg), want, pos)
            eof = len(buf) < want
            i = 0
            while True:
                if stop_offset is not None and offset >= stop_offset:
                    return pos + i, offset, _LIMIT
                if out is not None and (taken >= max_records or (taken and size >= max_bytes)):
                    return pos + i, offset, _LIMIT
                if i + FRAME_HEAD_SIZE > len(buf):
                    break
                length, crc, frame_offset = unpack(buf, i)
                end = i + FRAME_HEAD_SIZE + length
                if end > len(buf):
                    break
                payload = buf[i + FRAME_HEAD_SIZE : end]
                if frame_offset != offset or crc32(payload, crc32(buf[i + 8 : i + 16])) != crc:
                    return pos + i, offset, _DAMAGE
                if pos + i >= seg.known_pos:
                    if offset % INDEX_EVERY == 0:
                        seg.add_index(offset, pos + i)
                    seg.known_pos = pos + end
                    seg.known_offset = offset + 1
                if out is not None:
                    out.append((offset, payload))
                    taken += 1
                    size += length
                offset += 1
                i = end
            pos += i
            if eof:
                # The end of the file, or a frame that is still being written.
                return pos, offset, _END
            if i == 0 and len(buf) >= FRAME_HEAD_SIZE:
                # One frame larger than the chunk: read exactly enough for it.
                want = max(want, FRAME_HEAD_SIZE + unpack(buf, 0)[0])
            else:
                want = CHUNK

    def _note_damage(self, seg: _Segment, pos: int, offset: int) -> tuple[int, int] | None:
        """Record a hole at `offset` and find where valid frames resume in this segment."""
        if offset in seg.holes:
            return seg.holes[offset]
        fd = self._fd(seg)
        rest = os.pread(fd, max(os.fstat(fd).st_size - pos, 0), pos)
        found = find_resync(rest, 1, offset + 1)
        resume = None if found is None else (found[1], pos + found[0])
        seg.holes[offset] = resume
        if resume is not None:
            seg.add_index(*resume)
        return resume

    def _locate(self, offset: int) -> tuple[int, _Segment, int] | None:
        """Where the first readable record at or after `offset` is: (offset, segment,
        position), or None when nothing at or after `offset` exists yet."""
        if self._hint is not None and self._hint[0] == offset:
            for seg in self._segments:
                if seg.base == self._hint[1]:
                    return offset, seg, self._hint[2]
        # Not a sequential read: list again, so collected segments are not read from.
        self._refresh()
        found = self._search(offset)
        return found

    def _search(self, offset: int) -> tuple[int, _Segment, int] | None:
        if not self._segments:
            return None
        offset = max(offset, self._bases[0])
        at = max(bisect.bisect_right(self._bases, offset) - 1, 0)
        while at < len(self._segments):
            seg = self._segments[at]
            is_last = at == len(self._segments) - 1
            found = self._find_in(seg, offset, is_last)
            if found is not None:
                return found[0], seg, found[1]
            if is_last:
                return None
            offset = max(offset, self._segments[at + 1].base)
            at += 1
        return None

    def _header_ok(self, seg: _Segment) -> bool:
        """Whether the segment's header is valid, looking again while it is not: a reader
        can see a segment between the writer's create and its header write, and must not
        stall at that boundary for good."""
        if seg.header_bad:
            header = os.pread(self._fd(seg), HEADER_SIZE, 0)
            seg.header_bad = header_problem(header, seg.base) is not None
        return not seg.header_bad

    def _find_in(self, seg: _Segment, offset: int, is_last: bool) -> tuple[int, int] | None:
        """(offset', position) of the first valid record >= offset in `seg`, or None."""
        if not self._header_ok(seg):
            return None
        idx_offset, pos = seg.position_hint(offset)
        while True:
            pos, reached, status = self._scan(seg, pos, idx_offset, stop_offset=offset)
            if status == _LIMIT:
                # Positioned at `reached`: make sure that frame itself is whole and valid.
                _pos, _off, status = self._scan(seg, pos, reached, stop_offset=reached + 1)
                if status == _LIMIT:
                    return reached, pos
            if status == _END:
                return None
            resume = self._note_damage(seg, pos, reached)
            if resume is None:
                if is_last:
                    # In the newest segment an unrecognisable tail is a write in progress.
                    seg.holes.pop(reached, None)
                return None
            idx_offset, pos = resume
            offset = max(offset, idx_offset)

    # -- public --------------------------------------------------------------------------

    def read(
        self,
        offset: int,
        max_records: int = 512,
        max_bytes: int = 4 * 1024 * 1024,
        limit_offset: int | None = None,
    ) -> ReadResult:
        """Up to `max_records` records (about `max_bytes`) from `offset` on, stopping
        before `limit_offset`. Records that no longer exist are skipped (`skipped_to`)."""
        if offset < 0:
            raise ValueError(f"offset must be >= 0, not {offset}")
        if limit_offset is not None and offset >= limit_offset:
            return ReadResult([], offset)
        try:
            for _attempt in range(8):
                try:
                    return self._read(offset, max_records, max_bytes, limit_offset)
                except FileNotFoundError:
                    # gc deleted a segment this reader had listed: list again and retry.
                    self._hint = None
                    self._refresh()
            return self._read(offset, max_records, max_bytes, limit_offset)
        finally:
            self._release()

    def _read(
        self, offset: int, max_records: int, max_bytes: int, limit_offset: int | None
    ) -> ReadResult:
        located = self._locate(offset)
        if located is None:
            return ReadResult([], offset)
        start, seg, pos = located
        skipped = start if start != offset else None
        if limit_offset is not None and start >= limit_offset:
            return ReadResult([], start, skipped)
        entries: list[tuple[int, bytes]] = []
        current = start
        while True:
            pos, current, status = self._scan(
                seg,
                pos,
                current,
                stop_offset=limit_offset,
                max_records=max_records,
                max_bytes=max_bytes,
                out=entries,
            )
            if status == _DAMAGE:
                # Resolved (skipped over) by the next read, which starts at `current`.
                self._hint = None
                if not entries:
                    return self._read(offset, max_records, max_bytes, limit_offset)
                return ReadResult([(o, bytes(p)) for o, p in entries], current, skipped)
            if status != _END or len(entries) >= max_records:
                break
            at = self._segments.index(seg)
            if at + 1 == len(self._segments):
                self._refresh()
                if seg not in self._segments:
                    break
                at = self._segments.index(seg)
                if at + 1 == len(self._segments):
                    break
            following = self._segments[at + 1]
            if following.base == current and self._header_ok(following):
                seg, pos = following, HEADER_SIZE
                continue
            if entries:
                break  # a gap: the next read reports where it resumes
            found = self._search(current)
            if found is None:
                break
            current, seg, pos = found
            skipped = current
        self._hint = (current, seg.base, pos)
        return ReadResult([(o, bytes(p)) for o, p in entries], current, skipped)
