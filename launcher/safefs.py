"""File operations for a daemon that runs as root beside hostile users: through directory
file descriptors, never following a link, checked with fstat after open.

- `open_dir(path)` opens a directory the daemon will write in, one component at a time
  from `/` with O_NOFOLLOW, and refuses the path unless every component is owned by
  root or the daemon's own uid, and none of them lets another user rename or replace
  what lies inside (group- or world-writable without the sticky bit, like /tmp has).
  Missing components are created (the last with the caller's mode). What it returns
  is a descriptor: every later operation is relative to it, so a path swapped after the
  check changes nothing.
- `create_new(dirfd, name, ...)` removes whatever entry has the name (unlinkat never
  follows a link: a planted link is removed, not its target), creates the file with
  O_CREAT|O_EXCL|O_NOFOLLOW, and gives it its mode and owner through the descriptor
  (fchmod, then fchown: no path is looked up twice).
- `open_checked(dirfd, name, owner=...)` opens for reading with O_NOFOLLOW|O_NONBLOCK (a
  FIFO cannot block the daemon) and refuses anything that is not a regular file with one
  link, on the directory's filesystem, owned by the expected uid.

This module must never call chown, chmod, truncate, open or unlink on a path string that
another user could have changed: every call here takes a directory descriptor and a
single name (no slash), or a descriptor.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from pathlib import Path

from gpu_audit.errors import GpuAuditError

O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
O_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


class UnsafePath(GpuAuditError):
    """A directory the daemon must write in could be changed by another user: the
    message names the component and what to do."""


class RefusedFile(GpuAuditError):
    """A file the daemon was about to read is not what it created (a link, a FIFO,
    another owner, a hard link, another filesystem)."""


def _trusted() -> frozenset[int]:
    return frozenset({0, os.geteuid()})


def _single(name: str) -> str:
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"not a single file name: {name!r}")
    return name


def open_dir(path: Path, *, mode: int | None, create: bool = True,
             shared_final: bool = False) -> int:
    """A descriptor of directory `path` (see the module docstring). `mode` is given to
    the last component when the daemon owns it (and to it when created; None: created
    0700, an existing one keeps its mode); components created on the way get 0755.
    `shared_final`: the last component may be a sticky directory others write in (a
    socket's directory such as /tmp), as long as it is owned by root or us."""
    path = Path(os.path.abspath(path))
    trusted = _trusted()
    fd = os.open("/", O_DIR)
    try:
        _check(fd, Path("/"), trusted, last=len(path.parts) == 1, shared=shared_final)
        for i, name in enumerate(path.parts[1:], start=2):
            last = i == len(path.parts)
            here = Path(*path.parts[:i])
            try:
                sub = os.open(name, O_DIR, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                want = (0o700 if mode is None else mode) if last else 0o755
                created = False
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, want, dir_fd=fd)
                    created = True
                sub = _open_sub(fd, name, here)
                if created:
                    # mkdir's mode passes through the umask (the daemon's is 077): the
                    # mode is set explicitly, or a socket's directory made here would
                    # shut every other user out
                    os.fchmod(sub, want)
            except OSError as exc:
                raise _unsafe_open(here, exc) from None
            os.close(fd)
            fd = sub
            st = _check(fd, here, trusted, last=last, shared=shared_final)
            if last and mode is not None and st.st_uid == os.geteuid() \
                    and stat.S_IMODE(st.st_mode) != mode and not shared_final:
                os.fchmod(fd, mode)
            elif last and mode is None and st.st_mode & _OTHERS_WRITE:
                raise UnsafePath(f"{here} is writable by other users: remove group/other "
                                 "write (chmod go-w)")
        return fd
    except BaseException:
        os.close(fd)
        raise


def _open_sub(fd: int, name: str, here: Path) -> int:
    try:
        return os.open(name, O_DIR, dir_fd=fd)
    except OSError as exc:
        raise _unsafe_open(here, exc) from None


def _unsafe_open(here: Path, exc: OSError) -> Exception:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return UnsafePath(f"{here} is a symbolic link or not a directory: the launcher "
                          "follows no link on its way to a directory it writes; point the "
                          "configuration at the real directory")
    return exc


def _check(fd: int, here: Path, trusted: frozenset[int], *, last: bool,
           shared: bool) -> os.stat_result:
    st = os.fstat(fd)
    if st.st_uid not in trusted:
        raise UnsafePath(f"{here} belongs to uid {st.st_uid}, not root or the launcher's "
                         f"uid {os.geteuid()}: that user could swap what the launcher writes "
                         "there; use a directory owned by root")
    if st.st_mode & _OTHERS_WRITE:
        sticky = bool(st.st_mode & stat.S_ISVTX)
        ours = last and not shared and st.st_uid == os.geteuid()  # open_dir fixes its mode
        if not ours and (not sticky or (last and not shared)):
            raise UnsafePath(
                f"{here} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}) "
                "without the sticky bit: they could rename or replace what the launcher "
                "keeps below it; remove group/other write (chmod go-w) or choose another "
                "directory")
    return st


def remove_entry(dirfd: int, name: str) -> None:
    """Remove the entry `name` in `dirfd`, whatever it is (a link is removed, never its
    target; a directory with everything below it, through descriptors)."""
    name = _single(name)
    try:
        os.unlink(name, dir_fd=dirfd)
    except FileNotFoundError:
        return
    except IsADirectoryError:
        shutil.rmtree(name, dir_fd=dirfd)
    except PermissionError:
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            raise
        shutil.rmtree(name, dir_fd=dirfd)


def create_new(dirfd: int, name: str, *, mode: int, uid: int, gid: int,
               flags: int = os.O_WRONLY | os.O_APPEND) -> int:
    """A new, empty regular file `name` in `dirfd` owned by uid:gid with `mode`, open
    with `flags`; whatever had the name before is removed first."""
    name = _single(name)
    remove_entry(dirfd, name)
    fd = os.open(name, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                 dir_fd=dirfd)
    try:
        os.fchmod(fd, mode)  # before fchown: a file we no longer own we may not chmod
        st = os.fstat(fd)
        if (st.st_uid, st.st_gid) != (uid, gid):
            os.fchown(fd, uid, gid)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_checked(dirfd: int, name: str, *, owner: int | None) -> tuple[int, os.stat_result]:
    """Open `name` in `dirfd` for reading (see the module docstring); FileNotFoundError
    when there is none, RefusedFile when it is not the file the daemon made."""
    name = _single(name)
    try:
        fd = os.open(name, O_READ, dir_fd=dirfd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RefusedFile(f"{name} is a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        problem = None
        if not stat.S_ISREG(st.st_mode):
            problem = "is not a regular file"
        elif owner is not None and st.st_uid != owner:
            problem = f"belongs to uid {st.st_uid}, not {owner}"
        elif st.st_nlink != 1:
            problem = f"has {st.st_nlink} hard links"
        elif st.st_dev != os.fstat(dirfd).st_dev:
            problem = "is on another filesystem"
        if problem is not None:
            raise RefusedFile(f"{name} {problem}")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_at(fd: int, size: int, offset: int) -> bytes:
    """Up to `size` bytes at `offset` (pread: the descriptor's position is untouched)."""
    if size <= 0:
        return b""
    return os.pread(fd, size, offset)
