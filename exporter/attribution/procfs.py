"""Reading one process's files under a procfs root, with errors sorted by errno.

NVML reports host pids, so the root is the host's /proc (hostPID, or a read-only mount
such as /host/proc). Reads are small, bounded and use raw os calls because the sampler
does one per GPU process per cycle. This module must never raise for a process that
vanished, a file it may not read, or garbage in a file: every failure becomes a
ProcError with a kind the caller counts. It must never log file contents.
"""

from __future__ import annotations

import errno
import os
import stat as statmod
from dataclasses import dataclass

from gpu_audit.errors import GpuAuditError

# Kinds of failure, as counted in Resolver.stats().
VANISHED = "proc_vanished"
DENIED = "proc_denied"
LOOP = "proc_loop"
OTHER = "proc_error"
PARSE = "proc_parse_errors"

_VANISHED_ERRNOS = frozenset({errno.ENOENT, errno.ESRCH, errno.ENOTDIR})
_DENIED_ERRNOS = frozenset({errno.EACCES, errno.EPERM})

SMALL_FILE_LIMIT = 64 * 1024

# A pid directory is opened as a directory, never through a symlink, and its files are
# opened relative to that descriptor, never through a symlink, without blocking (a FIFO
# planted in a fake tree must not hang the cycle).
_O_PID_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_O_PID_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class ProcError(GpuAuditError):
    """A /proc read failed; `kind` is one of the kinds above, `err` the errno (or 0)."""

    def __init__(self, kind: str, err: int = 0) -> None:
        super().__init__(kind, err)
        self.kind = kind
        self.err = err


def classify(exc: OSError) -> ProcError:
    """Map an OSError to a ProcError by errno (never by message text)."""
    if exc.errno in _VANISHED_ERRNOS:
        return ProcError(VANISHED, exc.errno or 0)
    if exc.errno in _DENIED_ERRNOS:
        return ProcError(DENIED, exc.errno or 0)
    if exc.errno == errno.ELOOP:
        return ProcError(LOOP, errno.ELOOP)
    return ProcError(OTHER, exc.errno or 0)


def read_bounded(path: str, limit: int) -> tuple[bytes, bool]:
    """Up to `limit` bytes of `path`, and whether the whole file was read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise classify(exc) from None
    return _read_fd(fd, limit)


def _read_fd(fd: int, limit: int) -> tuple[bytes, bool]:
    """Up to `limit` bytes from `fd` (which it closes), and whether EOF was reached."""
    try:
        chunks: list[bytes] = []
        size = 0
        # procfs files report size 0, so read until EOF or the limit.
        while size <= limit:
            chunk = os.read(fd, min(65536, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise classify(exc) from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        return data[:limit], False
    return data, True


@dataclass(frozen=True, slots=True)
class ProcPaths:
    """The paths of one pid's files, built once per pid."""

    stat: str
    status: str
    environ: str
    cgroup: str

    @classmethod
    def for_pid(cls, root: str, pid: int) -> ProcPaths:
        base = f"{root}/{pid}/"
        return cls(base + "stat", base + "status", base + "environ", base + "cgroup")


def parse_start_time(stat: bytes) -> int:
    """Field 22 (starttime, clock ticks since boot) of /proc/<pid>/stat.

    The command name (field 2) is in parentheses and may itself contain spaces and
    parentheses, so fields are counted from the last ')'.
    """
    close = stat.rfind(b")")
    if close < 0:
        raise ProcError(PARSE)
    rest = stat[close + 1 :].split()
    # rest[0] is field 3 (state), so field 22 is rest[19].
    if len(rest) < 20 or not rest[19].isdigit():
        raise ProcError(PARSE)
    return int(rest[19])


def read_start_time(stat_path: str) -> int:
    """The process start time; the cache key that tells a pid's reuse apart.

    This is the one read per process per cycle, so it is a single read(2): the kernel
    returns a stat line (well under 1 KiB) whole, and a cut line fails to parse.
    """
    try:
        fd = os.open(stat_path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise classify(exc) from None
    try:
        data = os.read(fd, 4096)
    except OSError as exc:
        raise classify(exc) from None
    finally:
        os.close(fd)
    return parse_start_time(data)


def read_maps(root: str, pid: int, start: int, limit: int) -> tuple[bytes, bool]:
    """Up to `limit` bytes of /proc/<pid>/maps of the process that started at `start`
    (clock ticks, stat field 22), and whether the whole file was read.

    Through a descriptor of the pid directory: the start time is read from its `stat`
    and checked first, and on procfs a directory descriptor stays bound to its task
    (reads fail with ESRCH once it exits), so the maps read is that very process's even
    if the pid was reused since the cache entry was made. A different start time is
    VANISHED (the process the caller means is gone). Neither the directory nor `maps`
    is followed through a symlink, and `maps` must be a regular file (procfs files are).
    """
    try:
        dfd = os.open(f"{root}/{pid}", _O_PID_DIR)
    except OSError as exc:
        raise classify(exc) from None
    try:
        data, _ = _read_fd(_open_at(dfd, "stat"), 4096)
        if parse_start_time(data) != start:
            raise ProcError(VANISHED)
        return _read_fd(_open_at(dfd, "maps"), limit)
    finally:
        os.close(dfd)


def _open_at(dfd: int, name: str) -> int:
    try:
        fd = os.open(name, _O_PID_FILE, dir_fd=dfd)
    except OSError as exc:
        raise classify(exc) from None
    try:
        mode = os.fstat(fd).st_mode
    except OSError as exc:
        os.close(fd)
        raise classify(exc) from None
    if not statmod.S_ISREG(mode):
        os.close(fd)
        raise ProcError(OTHER)
    return fd


def parse_real_uid(status: bytes) -> int:
    """The real uid (first field of the `Uid:` line) from /proc/<pid>/status."""
    for line in status.splitlines():
        if line.startswith(b"Uid:"):
            fields = line[4:].split()
            if fields and fields[0].isdigit():
                return int(fields[0])
            break
    raise ProcError(PARSE)


def read_real_uid(paths: ProcPaths) -> int:
    data, _ = read_bounded(paths.status, SMALL_FILE_LIMIT)
    return parse_real_uid(data)


def read_cgroup(paths: ProcPaths) -> str:
    data, _ = read_bounded(paths.cgroup, SMALL_FILE_LIMIT)
    return data.decode("utf-8", errors="replace")
