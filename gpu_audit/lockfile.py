"""Exclusive locks that live exactly as long as the process holding them.

One process at a time may write a spool, ship from its cursors, or write an archive or
dead-letter directory: two would interleave or duplicate the audit trail. A lock here is
an `fcntl.flock` on an open descriptor of a small file that holds "pid N" of its owner.
The kernel drops the lock when the descriptor is closed or the process dies in any way
(kill -9 included), so a crash never leaves a stale lock behind: the file stays, unlocked.
Never delete a lock file to "unlock" it: a second process could then lock a new file
while the first still runs. flock locks conflict between open files even inside one
process, so a process must not lock the same file twice.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from types import TracebackType

from gpu_audit.errors import LockHeld

_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)


def _holder(fd: int) -> str:
    text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    # empty: the owner has locked the file but not yet written its pid
    return text or "pid unknown"


class ProcessLock:
    """An exclusive lock on `path`, held until `release()` or the end of the process."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, path: Path, what: str) -> ProcessLock:
        """Lock `path` (created with its parent directories) or raise LockHeld.

        `what` names the thing the lock protects in the refusal ("archive directory
        /var/lib/gpu-audit/archive"); the message also names the holder's pid.
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _holder(fd)
            os.close(fd)
            if exc.errno in _BUSY:
                raise LockHeld(path, holder, (
                    f"{what} is in use by another gpu-audit process ({holder}; lock file "
                    f"{path}): only one may use it at a time; stop that process or "
                    "configure another directory"
                )) from None
            raise
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
        except OSError:
            os.close(fd)
            raise
        return cls(path, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Unlock and close. Safe to call twice."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor drops the flock

    def __enter__(self) -> ProcessLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def lock_holder(path: Path) -> str | None:
    """Who holds the lock on `path` ("pid N"), or None when nobody does (or no file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in _BUSY:
                return _holder(fd)
            raise
        return None
    finally:
        os.close(fd)  # closing drops the shared lock we may have taken
