"""Exceptions raised by the spool.

Every error names the spool directory or file it concerns, so a log line or a CLI
message is enough to act on. This module must never import anything that does I/O.
"""

from __future__ import annotations

import errno
from pathlib import Path

from gpu_audit.errors import GpuAuditError, LockHeld


class SpoolError(GpuAuditError):
    """Base class of every spool error."""


class SpoolFull(SpoolError):
    """A bound was reached; nothing of the refused append was written.

    ``reason`` is ``"max_bytes"`` (the spool's own size cap) or ``"min_free"`` (the
    filesystem's free-space watermark). The caller counts the refusal and keeps running.
    """

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        super().__init__(f"spool full ({reason}): {detail}")


class SpoolWriteError(SpoolError):
    """A write, fsync or segment creation failed with a disk error.

    ``reason`` is the errno name (``ENOSPC``, ``EDQUOT``, ``EACCES``, ``EROFS``, ``EIO``,
    ...). No torn frame is left behind: the segment is truncated to its last good frame.
    """

    def __init__(self, reason: str, path: Path, detail: str) -> None:
        self.reason = reason
        self.path = path
        super().__init__(f"spool write failed ({reason}) on {path}: {detail}")

    @classmethod
    def from_oserror(cls, exc: OSError, path: Path, action: str) -> SpoolWriteError:
        code = exc.errno
        name = errno.errorcode.get(code, f"errno{code}") if code is not None else "EUNKNOWN"
        return cls(name, path, f"{action}: {exc.strerror or exc}")


class SpoolLocked(SpoolError, LockHeld):
    """Another writer holds the spool's lock file; a spool has a single writer."""

    def __init__(self, directory: Path, holder: str) -> None:
        self.directory = directory
        LockHeld.__init__(
            self, directory / "LOCK", holder,
            f"spool {directory} is locked by another writer ({holder}); "
            "only one process may write a spool: stop the other gpu-audit or use another "
            "spool.directory",
        )


class CursorError(SpoolError):
    """A cursor file is unreadable or fails its checksum. Never read as offset 0."""

    def __init__(self, path: Path, detail: str) -> None:
        self.path = path
        super().__init__(f"cursor file {path} is unusable: {detail}")
