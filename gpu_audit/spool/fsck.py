"""`spool verify` (an fsck) and `spool stats`: read-only inspection of a spool directory.

`verify_spool` checks every segment header, frame and CRC, offset continuity across
segments and the cursor files, and names the file and byte position of each problem.
`spool_stats` is the cheap summary (only the newest segment is scanned). This module must
never modify the spool: repairs are the writer's job when it opens the spool.
"""

from __future__ import annotations

import errno
import fcntl
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_audit.spool.cursors import CURSOR_DIR, CursorStore, parse_cursor
from gpu_audit.spool.errors import CursorError
from gpu_audit.spool.format import HEADER_SIZE, header_problem, parse_segment_name, scan_frames
from gpu_audit.spool.recovery import QUARANTINE_DIR, list_segments
from gpu_audit.spool.writer import LOCK_FILE


@dataclass
class SpoolReport:
    """What `verify_spool` found. `ok` is False when any problem was found."""

    directory: Path
    segments: int = 0
    records: int = 0
    first_offset: int = 0
    next_offset: int = 0
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)
    cursors: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        """The report as data (`spool verify --json`)."""
        return {"directory": str(self.directory), "ok": self.ok, "segments": self.segments,
                "records": self.records, "first_offset": self.first_offset,
                "next_offset": self.next_offset, "cursors": dict(self.cursors),
                "quarantined": list(self.quarantined), "problems": list(self.problems),
                "warnings": list(self.warnings)}

    def render(self) -> str:
        lines = [
            f"spool {self.directory}: {'OK' if self.ok else 'PROBLEMS FOUND'}",
            f"  segments: {self.segments}, records: {self.records}, "
            f"offsets: {self.first_offset}..{self.next_offset}",
        ]
        for name, offset in sorted(self.cursors.items()):
            lines.append(f"  cursor {name}: {offset} (lag {self.next_offset - offset})")
        if self.quarantined:
            lines.append(f"  quarantined segments: {', '.join(self.quarantined)}")
        lines.extend(f"  problem: {problem}" for problem in self.problems)
        lines.extend(f"  warning: {warning}" for warning in self.warnings)
        return "\n".join(lines)


SPOOL_EXPECTED = (
    "expected a spool directory: the spool.directory an exporter writes, holding a LOCK "
    "file, NNNNNNNNNNNNNNNNNNNN.seg segments or a cursors/ folder"
)


def spool_dir_problem(directory: Path) -> str | None:
    """Why `directory` is not a spool the tools can inspect, or None when it is one.

    A spool is what a writer leaves: its LOCK file, segments, or the shippers' cursors.
    Anything else (a typo, /tmp, an archive folder) must not be reported as a healthy,
    empty spool.
    """
    try:
        if not directory.is_dir():
            what = "does not exist" if not directory.exists() else "is not a directory"
            return f"{directory} {what}; {SPOOL_EXPECTED}"
        with os.scandir(directory) as entries:
            names = [entry.name for entry in entries]
    except OSError as exc:
        return f"{directory}: cannot read it ({exc.strerror or exc})"
    if (LOCK_FILE in names or CURSOR_DIR in names
            or any(parse_segment_name(name) is not None for name in names)):
        return None
    return f"{directory} is not a spool directory; {SPOOL_EXPECTED}"


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def render_stats(stats: dict[str, Any]) -> str:
    """`spool stats` for a person: aligned lines, then one row per sink cursor."""
    writer = "writer running" if stats["writer_active"] else "no writer running"
    lines = [
        f"spool {stats['directory']} ({writer})",
        f"  {'segments':<12} {stats['segments']} ({_size(stats['bytes'])})",
        f"  {'records':<12} {stats['records']} "
        f"(offsets {stats['first_offset']}..{stats['next_offset'] - 1})"
        if stats["records"] else f"  {'records':<12} 0 (next offset {stats['next_offset']})",
        f"  {'quarantined':<12} {stats['quarantined_segments']} segment(s) "
        f"({_size(stats['quarantined_bytes'])})",
    ]
    cursors: dict[str, dict[str, Any]] = stats["cursors"]
    if not cursors:
        lines.append("  no sink cursors yet (no shipper has committed a position)")
        return "\n".join(lines)
    width = max(len("sink"), *(len(name) for name in cursors))
    lines += ["", f"  {'sink':<{width}}  {'cursor':>12}  {'lag (records)':>13}"]
    for name, cursor in sorted(cursors.items()):
        if "error" in cursor:
            lines.append(f"  {name:<{width}}  {'?':>12}  {'?':>13}  {cursor['error']}")
        else:
            lines.append(f"  {name:<{width}}  {cursor['offset']:>12}  "
                         f"{cursor['lag_records']:>13}")
    return "\n".join(lines)


def _quarantined(directory: Path) -> list[str]:
    qdir = directory / QUARANTINE_DIR
    return sorted(entry.name for entry in os.scandir(qdir)) if qdir.is_dir() else []


def verify_spool(directory: Path | str) -> SpoolReport:
    """Check the whole spool; every problem names a file and a byte position."""
    root = Path(directory)
    report = SpoolReport(root)
    if not root.is_dir():
        report.problems.append(f"{root}: not a directory")
        return report
    listing = list_segments(root)
    report.segments = len(listing)
    report.quarantined = _quarantined(root)
    if report.quarantined:
        report.warnings.append(
            f"{len(report.quarantined)} file(s) in {root / QUARANTINE_DIR}: copies of damaged "
            "segments kept as evidence; their damaged records were counted as lost "
            "(records_corrupt), their valid records stay in the log"
        )
    previous_end: int | None = None
    previous_name = ""
    for index, (base, path) in enumerate(listing):
        is_last = index == len(listing) - 1
        data = path.read_bytes()
        if index == 0:
            report.first_offset = base
        if previous_end is not None and base != previous_end:
            if base > previous_end:
                report.problems.append(
                    f"{path.name}: byte 0: offset gap, offsets {previous_end}..{base - 1} are "
                    f"missing between {previous_name} and {path.name}"
                )
            else:
                report.problems.append(
                    f"{path.name}: byte 0: starts at offset {base}, but {previous_name} already "
                    f"holds offsets up to {previous_end - 1}"
                )
        problem = header_problem(data, base)
        if problem is not None:
            report.problems.append(f"{path.name}: byte 0: {problem}")
            previous_end, previous_name = base, path.name
            continue
        pos, offset = HEADER_SIZE, base
        while True:
            result = scan_frames(data, pos, offset)
            report.records += result.records
            offset = result.next_offset
            if result.problem is None:
                break
            where = f"{path.name}: byte {result.problem_pos}"
            if result.torn and is_last:
                report.warnings.append(
                    f"{where}: incomplete last write of {len(data) - result.end} bytes "
                    f"({result.problem}); a writer truncates it when it opens the spool"
                )
                break
            if result.resume_pos is None or result.resume_offset is None:
                report.problems.append(
                    f"{where}: {result.problem}; the remaining {len(data) - result.end} bytes "
                    "hold no readable frame"
                )
                break
            report.problems.append(
                f"{where}: {result.problem}; frames resume at byte {result.resume_pos} "
                f"(offset {result.resume_offset}), offsets {offset}.."
                f"{result.resume_offset - 1} unreadable"
            )
            pos, offset = result.resume_pos, result.resume_offset
        previous_end, previous_name = offset, path.name
    report.next_offset = previous_end if previous_end is not None else 0
    if not listing:
        report.first_offset = report.next_offset
    _check_cursors(root, report)
    return report


def _check_cursors(root: Path, report: SpoolReport) -> None:
    store = CursorStore(root)
    for name in store.names():
        path = store.path(name)
        try:
            offset = parse_cursor(path, name, path.read_bytes())
        except CursorError as exc:
            report.problems.append(str(exc))
            continue
        report.cursors[name] = offset
        if offset > report.next_offset:
            report.problems.append(
                f"{path}: cursor {offset} is past the end of the spool ({report.next_offset})"
            )
        elif offset < report.first_offset and report.segments:
            report.problems.append(
                f"{path}: cursor {offset} is behind the oldest record ({report.first_offset}): "
                f"offsets {offset}..{report.first_offset - 1} were deleted before this sink "
                "delivered them"
            )
    cursor_dir = root / CURSOR_DIR
    if cursor_dir.is_dir():
        for entry in os.scandir(cursor_dir):
            if entry.name.endswith(".tmp"):
                report.warnings.append(
                    f"{entry.path}: leftover temporary cursor file (a commit was interrupted; "
                    "the committed value is unaffected)"
                )


def _writer_active(root: Path) -> bool:
    lock = root / LOCK_FILE
    if not lock.exists():
        return False
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return True
        raise
    finally:
        os.close(fd)  # closing releases a lock we may have taken
    return False


def spool_stats(directory: Path | str) -> dict[str, Any]:
    """Summary numbers for `spool stats` (JSON-ready). Scans only the newest segment."""
    root = Path(directory)
    listing = list_segments(root)
    sizes = [path.stat().st_size for _base, path in listing]
    next_offset = 0
    if listing:
        base, path = listing[-1]
        data = path.read_bytes()
        if header_problem(data, base) is None:
            next_offset = scan_frames(data, HEADER_SIZE, base).next_offset
        else:
            next_offset = base
    first_offset = listing[0][0] if listing else next_offset
    cursors: dict[str, dict[str, Any]] = {}
    store = CursorStore(root)
    for name in store.names():
        try:
            offset = store.get(name)
        except CursorError as exc:
            cursors[name] = {"error": str(exc)}
            continue
        cursors[name] = {"offset": offset, "lag_records": max(next_offset - offset, 0)}
    quarantined = _quarantined(root)
    return {
        "directory": str(root),
        "writer_active": _writer_active(root),
        "segments": len(listing),
        "bytes": sum(sizes),
        "first_offset": first_offset,
        "next_offset": next_offset,
        "records": next_offset - first_offset,
        "cursors": cursors,
        "quarantined_segments": len(quarantined),
        "quarantined_bytes": sum(
            (root / QUARANTINE_DIR / name).stat().st_size for name in quarantined
        ),
    }
