"""Crash recovery of a spool directory, run by the writer when it opens the spool.

Truncates a torn tail (an incomplete last write: see `format.is_torn_tail`) and keeps a
copy of every damaged segment in ``quarantine/`` as evidence. A damaged segment stays live
where its header is valid, so every valid frame in it (before and after the damage) is
still read; readers skip exactly the damaged records. It must never delete data that is
not provably an incomplete write, never hand out an offset twice, and never raise for
corruption: every finding is counted and described, and the spool opens.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpu_audit import atomicfile
from gpu_audit.atomicfile import fsync_dir
from gpu_audit.spool.format import (
    FRAME_HEAD,
    FRAME_HEAD_SIZE,
    HEADER_SIZE,
    SegmentScan,
    find_resync,
    frame_crc,
    header_problem,
    last_offset_after,
    parse_segment_name,
    scan_segment,
    segment_name,
)

QUARANTINE_DIR = "quarantine"
# The newest record, kept as one frame beside the segments when gc released the segment
# that held it (the writer's `_release_active`): producers resume their chain from it.
LAST_RECORD_FILE = "last-record"


@dataclass
class LiveSegment:
    base: int
    size: int


@dataclass
class Recovery:
    """The state recovery leaves behind for the writer."""

    segments: list[LiveSegment]
    next_offset: int
    # The live last segment may only be appended to when its records end at next_offset.
    last_appendable: bool
    torn_tails: int = 0
    torn_bytes: int = 0
    quarantined: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    corrupt_records: int = 0  # records lost to damage first found by this recovery
    # live segments checked in full and found clean (gc need not read them again)
    verified: set[int] = field(default_factory=set)


def list_segments(directory: Path) -> list[tuple[int, Path]]:
    found: list[tuple[int, Path]] = []
    with os.scandir(directory) as entries:
        for entry in entries:
            base = parse_segment_name(entry.name)
            if base is not None and entry.is_file(follow_symlinks=False):
                found.append((base, Path(entry.path)))
    found.sort()
    return found


def evidence_kept(path: Path, data: bytes) -> bool:
    """Whether quarantine/ already holds these bytes of `path` (or more: the original
    before a torn tail was cut off), so they are neither copied nor counted again."""
    qdir = path.parent / QUARANTINE_DIR
    if not qdir.is_dir():
        return False
    prefix = path.name + "."
    for entry in os.scandir(qdir):
        if entry.name.startswith(prefix) and entry.stat().st_size >= len(data):
            with open(entry.path, "rb") as handle:
                if handle.read(len(data)) == data:
                    return True
    return False


def keep_evidence(path: Path, data: bytes) -> str:
    """Keep the bytes of `path` (`data`) in quarantine/; returns the evidence's name.

    A hard link: it takes no space (the spool may be damaged *and* on a full disk) and
    the spool never writes to a segment it has stopped appending to, so the bytes stay as
    found (only a torn tail after the damage may still be cut off the newest segment).
    Where links are not supported, a copy, written under a temporary name and renamed so
    a crash never leaves a partial copy that could pass for the evidence."""
    qdir = path.parent / QUARANTINE_DIR
    qdir.mkdir(exist_ok=True)
    name = f"{path.name}.{time.time_ns()}"
    try:
        os.link(path, qdir / name)
    except OSError:
        # a dot name: a leftover "<segment>.<ns>.tmp" would pass for evidence of the segment
        atomicfile.replace_file(qdir / name, data, mode=0o640, tmp=qdir / f".{name}.tmp")
    else:
        fsync_dir(qdir)
    return name


def quarantine(path: Path) -> str:
    """Move the whole of `path` into quarantine/ (a segment with no usable header, or a
    damaged one gc is done with)."""
    qdir = path.parent / QUARANTINE_DIR
    qdir.mkdir(exist_ok=True)
    target = qdir / f"{path.name}.{time.time_ns()}"
    os.replace(path, target)
    fsync_dir(qdir)
    fsync_dir(path.parent)
    return target.name


def _truncate(path: Path, size: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def describe_damage(name: str, scan: SegmentScan) -> str:
    parts = [
        f"byte {d.pos}: {d.problem}, offsets {d.first}..{d.resume - 1} unreadable"
        for d in scan.damage
    ]
    return f"{name}: " + "; ".join(parts)


def delivered_floor(directory: Path) -> tuple[int, list[str]] | None:
    """(the lowest committed cursor, the sinks' names): offsets below it were delivered
    to every sink; None when no sink has a cursor (or one cannot be read)."""
    from gpu_audit.spool.cursors import CursorStore  # noqa: PLC0415 - cursors imports format
    from gpu_audit.spool.errors import CursorError  # noqa: PLC0415

    store = CursorStore(directory)
    try:
        names = store.names()
        return (min(store.get(n) for n in names), names) if names else None
    except (CursorError, OSError):
        return None


def recover(directory: Path, full_scan: bool) -> Recovery:
    """Scan the spool (the last segment always, every segment when `full_scan`)."""
    listing = list_segments(directory)
    live: list[LiveSegment] = []
    found = Recovery([], 0, False)
    floor = 0  # no offset below this may be handed out again
    last_next: int | None = None
    last_appendable = False
    for index, (base, path) in enumerate(listing):
        is_last = index == len(listing) - 1
        next_base = None if is_last else listing[index + 1][0]
        floor = max(floor, base)
        size = path.stat().st_size
        if is_last and size < HEADER_SIZE:
            # Crash while creating the segment: it holds no record.
            path.unlink()
            fsync_dir(directory)
            found.torn_tails += 1
            found.torn_bytes += size
            found.findings.append(f"{path.name}: incomplete segment header ({size} bytes) removed")
            continue
        with path.open("rb") as handle:
            data = handle.read() if (is_last or full_scan) else handle.read(HEADER_SIZE)
        problem = header_problem(data, base)
        if problem is not None:
            if len(data) < size:
                with path.open("rb") as handle:
                    data = handle.read()
            after = max(_offset_after_damage(data, base), base)
            if is_last:
                floor = max(floor, after)
            lost = (next_base if next_base is not None else after) - base
            found.corrupt_records += lost
            found.quarantined.append(quarantine(path))
            found.findings.append(
                f"{path.name}: byte 0: {problem}; segment moved to quarantine, offsets "
                f"{base}..{base + lost - 1} lost"
            )
            continue
        if not (is_last or full_scan):
            live.append(LiveSegment(base, size))
            continue
        scan = scan_segment(data, base)
        damaged = bool(scan.damage) or (scan.torn_pos is not None and not is_last)
        if damaged:
            _note_damage(path, data, scan, next_base, found)
        if scan.torn_pos is not None and is_last:
            _truncate(path, scan.torn_pos)
            found.torn_tails += 1
            found.torn_bytes += size - scan.torn_pos
            found.findings.append(
                f"{path.name}: byte {scan.torn_pos}: torn tail of {size - scan.torn_pos} "
                f"bytes truncated ({scan.torn_problem})"
            )
            size = scan.torn_pos
        live.append(LiveSegment(base, size))
        if not damaged:
            found.verified.add(base)
        if is_last:
            last_next = scan.next_offset
            # Appending after damage would put new frames behind a hole a reader must
            # resync over; a fresh segment keeps the newest records easy to find.
            last_appendable = not scan.damage
        floor = max(floor, scan.next_offset)
    next_offset = floor
    if live and last_next is not None:
        next_offset = max(next_offset, last_next)
    if last_next is not None and last_next < next_offset:
        last_appendable = False
    if not live:
        last_appendable = False
    found.segments = live
    found.next_offset = next_offset
    found.last_appendable = last_appendable
    return found


def _note_damage(
    path: Path, data: bytes, scan: SegmentScan, next_base: int | None, found: Recovery
) -> None:
    """Keep the damaged segment's bytes in quarantine/ and count its lost records, once."""
    lost = scan.lost
    detail = describe_damage(path.name, scan) if scan.damage else path.name
    if scan.torn_pos is not None and next_base is not None:
        # An older segment was fsynced before the next one was created: an incomplete
        # frame in it is damage, and every offset up to the next segment is lost.
        lost += max(next_base - scan.next_offset, 0)
        detail += (f"; byte {scan.torn_pos}: {scan.torn_problem}, offsets "
                   f"{scan.next_offset}..{next_base - 1} unreadable")
    if evidence_kept(path, data):
        found.findings.append(f"{detail} (already in quarantine)")
        return
    found.quarantined.append(keep_evidence(path, data))
    found.corrupt_records += lost
    highest = max([d.resume - 1 for d in scan.damage]
                  + ([next_base - 1] if scan.torn_pos is not None and next_base else []),
                  default=-1)
    floor = delivered_floor(path.parent)
    if floor is not None and highest < floor[0]:
        # The records were shipped before the damage: only this copy is unreadable (a
        # producer must still not reuse their seqs: it cannot read them back here).
        fate = (f"{lost} record(s) unreadable here, all already delivered to every sink "
                f"({', '.join(floor[1])})")
    else:
        fate = f"{lost} record(s) lost (not yet delivered to every sink)"
    found.findings.append(
        f"{detail}; copy kept in quarantine, {fate}; the valid frames stay live"
    )


def _offset_after_damage(data: bytes, base: int) -> int:
    """A safe next offset for a segment whose header is unreadable: past every frame that
    can still be recognised in it."""
    resync = find_resync(data, 0, base)
    if resync is None:
        return base
    return last_offset_after(data, resync[0], resync[1])


def read_last_record(directory: Path, segments: list[LiveSegment]) -> tuple[int, bytes] | None:
    """(offset, payload) of the newest readable record: in the live segments, searched
    from the newest back, or, when gc released them all, in the last-record file."""
    for segment in reversed(segments):
        path = directory / segment_name(segment.base)
        with path.open("rb") as handle:
            data = handle.read(segment.size)
        if header_problem(data, segment.base) is not None:
            continue
        last = scan_segment(data, segment.base).last_frame
        if last is None:
            continue
        length, _crc, offset = FRAME_HEAD.unpack_from(data, last)
        return offset, bytes(data[last + FRAME_HEAD_SIZE : last + FRAME_HEAD_SIZE + length])
    return read_last_record_file(directory)


def read_last_record_file(directory: Path) -> tuple[int, bytes] | None:
    """The record the last-record file keeps, when it is whole (its frame's CRC)."""
    try:
        data = (directory / LAST_RECORD_FILE).read_bytes()
    except OSError:
        return None
    if len(data) < FRAME_HEAD_SIZE:
        return None
    length, crc, offset = FRAME_HEAD.unpack_from(data, 0)
    payload = data[FRAME_HEAD_SIZE:]
    if len(payload) != length or frame_crc(offset, payload) != crc:
        return None
    return offset, payload

