"""Crash recovery of a spool directory, run by the writer when it opens the spool.

Truncates a torn tail (an incomplete last write) and moves corrupt segments into
``quarantine/``, keeping their valid prefix live. It must never delete data that is not
provably an incomplete write, and never raise for corruption: every finding is counted and
described, and the spool opens.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpu_audit.spool.format import (
    FRAME_HEAD,
    FRAME_HEAD_SIZE,
    HEADER_SIZE,
    find_resync,
    header_problem,
    last_offset_after,
    parse_segment_name,
    scan_frames,
    segment_name,
)

QUARANTINE_DIR = "quarantine"


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


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_segments(directory: Path) -> list[tuple[int, Path]]:
    found: list[tuple[int, Path]] = []
    with os.scandir(directory) as entries:
        for entry in entries:
            base = parse_segment_name(entry.name)
            if base is not None and entry.is_file(follow_symlinks=False):
                found.append((base, Path(entry.path)))
    found.sort()
    return found


def quarantine(path: Path, keep_prefix: bytes | None) -> str:
    """Move `path` into quarantine/; when `keep_prefix` holds whole valid frames (with
    the header), write it back under the original name so those records stay readable."""
    qdir = path.parent / QUARANTINE_DIR
    qdir.mkdir(exist_ok=True)
    target = qdir / f"{path.name}.{time.time_ns()}"
    os.replace(path, target)
    if keep_prefix is not None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
        try:
            view = memoryview(keep_prefix)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
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


def recover(directory: Path, full_scan: bool) -> Recovery:
    """Scan the spool (the last segment always, every segment when `full_scan`)."""
    listing = list_segments(directory)
    live: list[LiveSegment] = []
    floor = 0  # no offset below this may be handed out again
    torn_tails = torn_bytes = 0
    quarantined: list[str] = []
    findings: list[str] = []
    last_next: int | None = None
    last_appendable = False
    for index, (base, path) in enumerate(listing):
        is_last = index == len(listing) - 1
        floor = max(floor, base)
        size = path.stat().st_size
        if is_last and size < HEADER_SIZE:
            # Crash while creating the segment: it holds no record.
            path.unlink()
            fsync_dir(directory)
            torn_tails += 1
            torn_bytes += size
            findings.append(f"{path.name}: incomplete segment header ({size} bytes) removed")
            continue
        with path.open("rb") as handle:
            data = handle.read() if (is_last or full_scan) else handle.read(HEADER_SIZE)
        problem = header_problem(data, base)
        if problem is not None:
            if is_last:
                floor = max(floor, _offset_after_damage(data, base))
            quarantined.append(quarantine(path, None))
            findings.append(f"{path.name}: byte 0: {problem}; segment quarantined")
            continue
        if not (is_last or full_scan):
            live.append(LiveSegment(base, size))
            continue
        result = scan_frames(data, HEADER_SIZE, base)
        if result.problem is None:
            live.append(LiveSegment(base, size))
            last_next = result.next_offset
            last_appendable = True
            continue
        if result.torn and is_last:
            _truncate(path, result.end)
            torn_tails += 1
            torn_bytes += size - result.end
            findings.append(
                f"{path.name}: byte {result.end}: torn tail of {size - result.end} bytes "
                f"truncated ({result.problem})"
            )
            live.append(LiveSegment(base, result.end))
            last_next = result.next_offset
            last_appendable = True
            continue
        # Corruption (or a torn tail inside an older segment, which was fsynced before the
        # next segment was created, so it cannot be an incomplete write).
        if result.resume_pos is not None and result.resume_offset is not None:
            floor = max(floor, last_offset_after(data, result.resume_pos, result.resume_offset))
        floor = max(floor, result.next_offset)
        prefix = data[: result.end] if result.records else None
        quarantined.append(quarantine(path, prefix))
        findings.append(
            f"{path.name}: byte {result.problem_pos}: {result.problem}; segment quarantined, "
            f"{result.records} record(s) before the damage kept"
        )
        if prefix is not None:
            live.append(LiveSegment(base, len(prefix)))
            last_next = result.next_offset
            last_appendable = False
    next_offset = floor
    if live and last_next is not None:
        next_offset = max(next_offset, last_next)
    if last_next is not None and last_next < next_offset:
        last_appendable = False
    if not live:
        last_appendable = False
    return Recovery(
        live, next_offset, last_appendable, torn_tails, torn_bytes, quarantined, findings
    )


def _offset_after_damage(data: bytes, base: int) -> int:
    """A safe next offset for a segment whose header is unreadable: past every frame that
    can still be recognised in it."""
    found = find_resync(data, 0, base)
    if found is None:
        return base
    return last_offset_after(data, found[0], found[1])


def read_last_payload(directory: Path, segments: list[LiveSegment]) -> bytes | None:
    """The newest record's payload, searching live segments from the newest back."""
    for segment in reversed(segments):
        path = directory / segment_name(segment.base)
        with path.open("rb") as handle:
            data = handle.read(segment.size)
        result = scan_frames(data, HEADER_SIZE, segment.base)
        if result.records == 0:
            continue
        pos = HEADER_SIZE
        last = pos
        while pos < result.end:
            last = pos
            length = FRAME_HEAD.unpack_from(data, pos)[0]
            pos += FRAME_HEAD_SIZE + length
        length = FRAME_HEAD.unpack_from(data, last)[0]
        return bytes(data[last + FRAME_HEAD_SIZE : last + FRAME_HEAD_SIZE + length])
    return None
