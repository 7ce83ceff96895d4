"""The spool's on-disk format: segment names, segment header, frames, and frame scanning.

This is the byte-level contract documented in docs/SPOOL.md. Pure functions over bytes:
this module must never open, write or delete files.

Segment = header (24 bytes) followed by frames::

    header: magic b"GPUASPL\\0" | u32 version (1) | u32 flags (0) | u64 base offset
    frame:  u32 payload length | u32 CRC-32 | u64 offset | payload

All integers are little-endian. The CRC is zlib's CRC-32 (IEEE 802.3 polynomial) over the
8 offset bytes followed by the payload, so a frame copied to the wrong position is caught.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

MAGIC = b"GPUASPL\x00"
VERSION = 1
HEADER = struct.Struct("<8sIIQ")
HEADER_SIZE = HEADER.size  # 24
FRAME_HEAD = struct.Struct("<IIQ")
FRAME_HEAD_SIZE = FRAME_HEAD.size  # 16
OFFSET = struct.Struct("<Q")
MAX_PAYLOAD = (1 << 31) - 1
SEGMENT_SUFFIX = ".seg"
_SEGMENT_RE = re.compile(r"^(\d{20})\.seg$")
# How many following offsets a resync looks for after a corrupt frame: several frames in a
# row would have to be damaged before we give up on the rest of a segment.
RESYNC_TRIES = 16
# Filesystems zero-fill whole blocks that were allocated but never written; every block
# size is a multiple of this, so a zero run that starts on such a boundary can be one.
ZERO_BLOCK = 512


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    match = _SEGMENT_RE.match(name)
    return int(match.group(1)) if match else None


def encode_header(base_offset: int) -> bytes:
    return HEADER.pack(MAGIC, VERSION, 0, base_offset)


def header_problem(data: bytes | memoryview, base_offset: int) -> str | None:
    """Why a segment header is not valid for `base_offset`, or None when it is."""
    if len(data) < HEADER_SIZE:
        return f"header is {len(data)} bytes, expected {HEADER_SIZE}"
    magic, version, _flags, base = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        return f"bad magic {bytes(magic)!r}"
    if version != VERSION:
        return f"unsupported format version {version}"
    if base != base_offset:
        return f"header base offset {base} does not match the file name ({base_offset})"
    return None


def frame_crc(offset: int, payload: bytes | memoryview) -> int:
    return zlib.crc32(payload, zlib.crc32(OFFSET.pack(offset)))


def encode_frames(first_offset: int, payloads: Sequence[bytes]) -> bytes:
    """All frames of one append, as one buffer for one write()."""
    parts: list[bytes] = []
    append, pack, pack_offset, crc32 = parts.append, FRAME_HEAD.pack, OFFSET.pack, zlib.crc32
    offset = first_offset
    for payload in payloads:  # frame_crc(), written out: this runs for every record
        append(pack(len(payload), crc32(payload, crc32(pack_offset(offset))), offset))
        append(payload)
        offset += 1
    return b"".join(parts)


@dataclass(frozen=True)
class ScanResult:
    """What a scan of frames found.

    ``end`` is the byte position after the last good frame and ``next_offset`` the offset
    after it. ``problem`` is None when the data ended cleanly; ``torn`` says the problem is
    an incomplete last write (safe to truncate), otherwise it is corruption at
    ``problem_pos``. ``resume_pos``/``resume_offset`` locate the first good frame after
    the corruption when one was found.
    """

    end: int
    next_offset: int
    records: int
    problem: str | None = None
    problem_pos: int | None = None
    torn: bool = False
    resume_pos: int | None = None
    resume_offset: int | None = None


def check_frame(data: bytes | memoryview, pos: int, expected: int) -> tuple[int, str | None]:
    """Validate the frame at `pos`: returns (frame end, problem or None).

    A problem starting with "incomplete" means the bytes end inside the frame.
    """
    size = len(data)
    if pos + FRAME_HEAD_SIZE > size:
        return pos, f"incomplete frame header ({size - pos} of {FRAME_HEAD_SIZE} bytes)"
    length, crc, offset = FRAME_HEAD.unpack_from(data, pos)
    end = pos + FRAME_HEAD_SIZE + length
    if end > size:
        return pos, f"incomplete frame (needs {end - pos} bytes, {size - pos} present)"
    if zlib.crc32(data[pos + FRAME_HEAD_SIZE : end], zlib.crc32(data[pos + 8 : pos + 16])) != crc:
        return end, f"CRC mismatch in frame of offset field {offset}"
    if offset != expected:
        return end, f"offset {offset} where {expected} was expected"
    return end, None


def find_resync(data: bytes | memoryview, start: int, expected: int) -> tuple[int, int] | None:
    """The first valid frame at or after `start` whose offset is in [expected, +RESYNC_TRIES).

    Searches for the frame's offset field with a C-speed find and validates every
    candidate, so garbage that happens to contain the pattern is not accepted.
    """
    raw = bytes(data)
    best: tuple[int, int] | None = None
    for candidate in range(expected, expected + RESYNC_TRIES):
        needle = OFFSET.pack(candidate)
        at = raw.find(needle, start + 8)
        while at != -1:
            pos = at - 8
            _end, problem = check_frame(raw, pos, candidate)
            if problem is None:
                if best is None or pos < best[0]:
                    best = (pos, candidate)
                break
            at = raw.find(needle, at + 1)
        if best is not None and best[1] == candidate:
            return best
    return best


def scan_frames(data: bytes | memoryview, start: int, first_offset: int) -> ScanResult:
    """Walk frames from byte `start` expecting offsets from `first_offset` on."""
    pos = start
    offset = first_offset
    size = len(data)
    records = 0
    while pos < size:
        end, problem = check_frame(data, pos, offset)
        if problem is None:
            pos = end
            offset += 1
            records += 1
            continue
        resync = find_resync(data, pos + 1, offset + 1)
        if resync is None:
            torn = is_torn_tail(data, pos, offset)
            return ScanResult(pos, offset, records, problem, pos, torn=torn)
        return ScanResult(
            pos,
            offset,
            records,
            problem,
            pos,
            torn=False,
            resume_pos=resync[0],
            resume_offset=resync[1],
        )
    return ScanResult(pos, offset, records)


def is_torn_tail(data: bytes | memoryview, pos: int, expected: int) -> bool:
    """Whether the bad bytes from `pos` to the end (nothing valid follows) are an
    incomplete write rather than a damaged complete frame.

    Torn: fewer than a frame header's bytes remain; or the frame's declared length runs
    past the end of the data and its CRC does not match the bytes that are there (a write
    that stopped part-way); or the frame runs into a zero-filled tail that starts at the
    frame or on a ZERO_BLOCK boundary inside it (blocks that were never written). Anything
    else is a complete frame that is corrupt: it must never be truncated away.
    """
    size = len(data)
    if size - pos < FRAME_HEAD_SIZE:
        return True
    length, crc, offset = FRAME_HEAD.unpack_from(data, pos)
    end = pos + FRAME_HEAD_SIZE + length
    if end > size:
        # A whole record whose length field was damaged still matches its own CRC.
        return not (offset == expected and frame_crc(offset, data[pos + FRAME_HEAD_SIZE :]) == crc)
    zeros_from = len(bytes(data[pos:]).rstrip(b"\0")) + pos
    return zeros_from < end and (zeros_from <= pos or zeros_from % ZERO_BLOCK == 0)


def offset_after_garbage(data: bytes | memoryview, pos: int, expected: int) -> int:
    """A safe next offset after unreadable bytes that start with the frame of `expected`:
    past every later offset number still visible in them (a damaged run of frames), so no
    offset that may have been handed out is handed out again."""
    raw = bytes(data[pos:])
    after = expected + 1
    candidate = expected + 1
    misses = 0
    while misses < RESYNC_TRIES:
        if raw.find(OFFSET.pack(candidate)) != -1:
            after = candidate + 1
            misses = 0
        else:
            misses += 1
        candidate += 1
    return after


@dataclass(frozen=True)
class Damage:
    """Unreadable bytes at `pos` in a segment: offsets [first, resume) are lost."""

    pos: int
    first: int
    resume: int
    problem: str


@dataclass(frozen=True)
class SegmentScan:
    """Every frame of one segment (after its header): what is valid and what is damaged.

    ``valid_end`` is the byte after the last valid frame, ``last_frame`` that frame's
    position (None when there is none). ``next_offset`` is the offset after everything the
    segment held, lost records included. ``torn_pos`` is where an incomplete last write
    starts, when the data ends with one.
    """

    records: int
    next_offset: int
    valid_end: int
    last_frame: int | None
    damage: tuple[Damage, ...]
    torn_pos: int | None
    torn_problem: str | None = None

    @property
    def lost(self) -> int:
        return sum(d.resume - d.first for d in self.damage)


def scan_segment(data: bytes | memoryview, base: int) -> SegmentScan:
    """Walk every frame of a segment whose header is valid, resyncing over damage."""
    pos, offset = HEADER_SIZE, base
    records = 0
    last_frame: int | None = None
    valid_end = HEADER_SIZE
    damage: list[Damage] = []
    while True:
        result = scan_frames(data, pos, offset)
        if result.records:
            records += result.records
            valid_end = result.end
            last_frame = _last_frame_start(data, pos, result.end)
        if result.problem is None:
            return SegmentScan(records, result.next_offset, valid_end, last_frame,
                               tuple(damage), None)
        bad = result.end
        if result.resume_pos is not None and result.resume_offset is not None:
            damage.append(Damage(bad, result.next_offset, result.resume_offset, result.problem))
            pos, offset = result.resume_pos, result.resume_offset
            continue
        if result.torn:
            return SegmentScan(records, result.next_offset, valid_end, last_frame,
                               tuple(damage), bad, result.problem)
        after = offset_after_garbage(data, bad, result.next_offset)
        damage.append(Damage(bad, result.next_offset, after, result.problem))
        return SegmentScan(records, after, valid_end, last_frame, tuple(damage), None)


def _last_frame_start(data: bytes | memoryview, pos: int, end: int) -> int:
    """The start of the last of the valid frames that run from `pos` to `end`."""
    last = pos
    while pos < end:
        last = pos
        pos += FRAME_HEAD_SIZE + FRAME_HEAD.unpack_from(data, pos)[0]
    return last


def last_offset_after(data: bytes | memoryview, pos: int, offset: int) -> int:
    """Follow frames (resyncing over damage) from a known good frame; the offset after the
    last one found. Used to continue numbering after a quarantined last segment."""
    while True:
        result = scan_frames(data, pos, offset)
        if result.resume_pos is None or result.resume_offset is None:
            return result.next_offset
        pos, offset = result.resume_pos, result.resume_offset
