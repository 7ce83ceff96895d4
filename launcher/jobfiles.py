"""The files of each job attempt under `<state>/logs/<job>/`, made and read safely.

Layout (docs/LAUNCHER.md "Jobs on disk"): `<attempt>.out` and `.err` (the job's output),
`.events.jsonl` (the job-side helper's reports), `.exit` (the status the wrapper shell
writes), all owned by the job's user with mode 0640 and the daemon's group; `.pid`
(leader pid and start time) owned by the daemon. Each job's directory is the daemon's,
mode 0711: a job's user can reach her files by name (the helper opens its events file,
the wrapper its exit file) but cannot add, rename or replace an entry, so nothing in it
can become a link to someone else's file.

Every operation goes through descriptors (launcher.safefs): the `logs` directory is
opened once, a job's directory relative to it, a file relative to that; files are made
with O_EXCL after removing whatever had the name, and read back with O_NOFOLLOW and
an fstat check (a regular file, one link, the expected owner). A directory left by an
older daemon (mode 0770, the user's group) is closed the first time it is touched.

This module must never follow a link, never chown or chmod by path, and never read more
of a job's file than the caller bounded: every file here is written by a user.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from gpu_audit.atomicfile import write_all
from launcher.safefs import O_DIR, RefusedFile, create_new, open_checked, open_dir, read_at

DIR_MODE = 0o711
FILE_MODE = 0o640
KINDS = ("out", "err", "events.jsonl", "exit")
MAX_EVENT_LINE = 64 * 1024  # a longer line in an events file is skipped, not buffered
_CHECKPOINT_SCAN_BYTES = 64 * 1024 * 1024  # how far back a restart looks for a commit


@dataclass(slots=True)
class AttemptFiles:
    """The open output files of an attempt (handed to the job) and the paths the job
    opens itself."""

    stdout: int
    stderr: int
    events: Path
    exit: Path

    def close(self) -> None:
        for fd in (self.stdout, self.stderr):
            with contextlib.suppress(OSError):
                os.close(fd)


class JobFiles:
    """The per-job directories below `logs_dir` (created, 0711, if missing)."""

    def __init__(self, logs_dir: Path) -> None:
        self.root = Path(os.path.abspath(logs_dir))
        self._fd = open_dir(self.root, mode=DIR_MODE)
        self._euid, self._egid = os.geteuid(), os.getegid()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)

    def path(self, job_id: int, attempt: int, kind: str) -> Path:
        """Where a file is, for the job's environment and for messages (never opened by
        the daemon through this path)."""
        return self.root / str(job_id) / f"{attempt}.{kind}"

    # --- the job's directory -------------------------------------------------------------

    def _dir(self, job_id: int, *, create: bool) -> int | None:
        name = str(int(job_id))
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, DIR_MODE, dir_fd=self._fd)
        try:
            fd = os.open(name, O_DIR, dir_fd=self._fd)
        except FileNotFoundError:
            if create:
                raise
            return None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise RefusedFile(f"{self.root / name} is not a directory") from None
            raise
        try:
            st = os.fstat(fd)
            if st.st_uid != self._euid:
                raise RefusedFile(f"{self.root / name} belongs to uid {st.st_uid}")
            if st.st_gid != self._egid:
                os.fchown(fd, self._euid, self._egid)  # an older daemon's: user's group
            if stat.S_IMODE(st.st_mode) != DIR_MODE:
                os.fchmod(fd, DIR_MODE)
        except BaseException:
            os.close(fd)
            raise
        return fd

    @contextlib.contextmanager
    def _opened(self, job_id: int, *, create: bool = False) -> Iterator[int | None]:
        fd = self._dir(job_id, create=create)
        try:
            yield fd
        finally:
            if fd is not None:
                os.close(fd)

    # --- an attempt's files --------------------------------------------------------------

    def create_attempt(self, job_id: int, attempt: int, uid: int) -> AttemptFiles:
        """Fresh output, events and exit files for the attempt, owned by `uid` (whatever
        had their names is removed first, a planted link included)."""
        with self._opened(job_id, create=True) as dfd:
            assert dfd is not None
            fds: list[int] = []
            try:
                for kind in KINDS:
                    fds.append(create_new(dfd, f"{attempt}.{kind}", mode=FILE_MODE, uid=uid,
                                          gid=self._egid))
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"{attempt}.pid", dir_fd=dfd)
            except BaseException:
                for fd in fds:
                    os.close(fd)
                raise
        for fd in fds[2:]:
            os.close(fd)
        return AttemptFiles(fds[0], fds[1], self.path(job_id, attempt, "events.jsonl"),
                            self.path(job_id, attempt, "exit"))

    def write_pid(self, job_id: int, attempt: int, pid: int, ticks: int) -> None:
        """Record the attempt's leader (pid and start time) for a restarted daemon."""
        with self._opened(job_id) as dfd:
            if dfd is None:
                return
            fd = create_new(dfd, f"{attempt}.pid", mode=0o644, uid=self._euid,
                            gid=self._egid, flags=os.O_WRONLY)
            try:
                write_all(fd, f"{pid} {ticks}\n".encode())
            finally:
                os.close(fd)

    def read(self, job_id: int, attempt: int, kind: str, *, owner: int, offset: int,
             size: int) -> tuple[bytes, os.stat_result] | None:
        """Up to `size` bytes of the attempt's file at `offset` and its fstat; None when
        there is no such file; RefusedFile when it is not the file the daemon made for
        `owner`."""
        with self._opened(job_id) as dfd:
            if dfd is None:
                return None
            try:
                fd, st = open_checked(dfd, f"{attempt}.{kind}", owner=owner)
            except FileNotFoundError:
                return None
        try:
            return read_at(fd, size, offset), st
        finally:
            os.close(fd)

    def tail(self, job_id: int, attempt: int, kind: str, *, owner: int,
             size: int) -> bytes:
        """The last `size` bytes of the file (b"" where there is none or it is refused)."""
        with self._opened(job_id) as dfd:
            if dfd is None:
                return b""
            try:
                fd, st = open_checked(dfd, f"{attempt}.{kind}", owner=owner)
            except (OSError, RefusedFile):
                return b""
        try:
            return read_at(fd, size, max(0, st.st_size - size))
        finally:
            os.close(fd)

    def read_pid(self, job_id: int, attempt: int) -> tuple[int, int] | None:
        """(pid, start ticks) the daemon recorded for the attempt, if any."""
        try:
            got = self.read(job_id, attempt, "pid", owner=self._euid, offset=0, size=64)
        except (OSError, RefusedFile):
            return None
        if got is None:
            return None
        try:
            pid_s, ticks_s = got[0].decode("ascii").split()
            return int(pid_s), int(ticks_s)
        except (UnicodeDecodeError, ValueError):
            return None

    def read_exit(self, job_id: int, attempt: int, *, owner: int) -> tuple[int, float] | None:
        """(exit status, when it was written) from the wrapper's exit file; None when the
        attempt left none (or something that is not a status 0-255)."""
        try:
            got = self.read(job_id, attempt, "exit", owner=owner, offset=0, size=16)
        except (OSError, RefusedFile):
            return None
        if got is None:
            return None
        data, st = got
        text = data.decode("ascii", "replace").strip()
        if not text.isdigit() or int(text) > 255:
            return None
        return int(text), st.st_mtime

    def newest_checkpoint(self, job_id: int, attempt: int, *,
                          owner: int) -> tuple[float | None, int | None]:
        """The newest checkpoint_committed (time, step) in the attempt's events file,
        scanning back from its end (at most 64 MiB); (None, None) if none."""
        with self._opened(job_id) as dfd:
            if dfd is None:
                return None, None
            try:
                fd, st = open_checked(dfd, f"{attempt}.events.jsonl", owner=owner)
            except (OSError, RefusedFile):
                return None, None
        try:
            return _scan_back(fd, st.st_size)
        finally:
            os.close(fd)


def _scan_back(fd: int, size: int) -> tuple[float | None, int | None]:
    end = size
    carry = b""  # the start of a line that began in an earlier block
    floor = max(0, size - _CHECKPOINT_SCAN_BYTES)
    while end > floor:
        start = max(floor, end - MAX_EVENT_LINE)
        lines = (read_at(fd, end - start, start) + carry).split(b"\n")
        end = start
        carry = lines.pop(0) if start > floor else b""
        if len(carry) > MAX_EVENT_LINE:
            carry = b""  # inside a line too long to be an event: skipped
        for line in reversed(lines):
            found = checkpoint_of(line)
            if found is not None:
                return found
    return None, None


def checkpoint_of(line: bytes) -> tuple[float | None, int | None] | None:
    """(time, step) when `line` is a checkpoint_committed event, else None. A time or
    step no checkpoint can have (negative, absurdly large) reads as unknown."""
    if b"checkpoint_committed" not in line or len(line) > MAX_EVENT_LINE:
        return None
    try:
        doc = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or doc.get("event") != "checkpoint_committed":
        return None
    return event_time(doc.get("time")), event_step(doc.get("step"))


def event_time(value: object) -> float | None:
    """A unix time a job reported, if it is one (finite, after 1970, before 5138)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 <= value < 1e11 else None


def event_step(value: object) -> int | None:
    """A step a job reported, if it is one (a non-negative 62-bit integer)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value < 1 << 62 else None


@dataclass(slots=True)
class LineSplitter:
    """Cuts an events file read in pieces into lines. A line longer than MAX_EVENT_LINE
    is dropped whole (its bytes are never kept), so a job cannot make the daemon buffer
    an endless line."""

    partial: bytes = b""
    skipping: bool = False

    def feed(self, data: bytes) -> list[bytes]:
        pieces = data.split(b"\n")
        rest = pieces.pop()
        out: list[bytes] = []
        for i, piece in enumerate(pieces):
            line = piece
            if i == 0:
                if self.skipping:
                    self.skipping = False
                    continue
                line = self.partial + piece
            if line.strip() and len(line) <= MAX_EVENT_LINE:
                out.append(line)
        if pieces:
            self.partial = rest
        elif not self.skipping:
            self.partial += rest
        if len(self.partial) > MAX_EVENT_LINE:
            self.partial, self.skipping = b"", True
        return out
