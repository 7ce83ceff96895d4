"""Replace a small file atomically, and fsync a directory: the one copy of both.

`replace_file(path, data)` writes `data` to `<path>.tmp` in the same directory (so the
rename never crosses a filesystem), fsyncs it, renames it over `path` and fsyncs the
directory, so after a crash at any point `path` holds either its old bytes or the new
ones, never a mix. When a step fails with OSError the temporary file is removed (best
effort) and the error is raised; a temporary left by a killed process is truncated and
reused by the next write of the same file.

Every call goes through `ops` (the `os` module by default), so a caller whose tests
replace its own module's `os` to inject crashes (the archive sink's crash matrix) passes
that module's `os` and every step here stays under the test's control. Only OSError is
handled: a BaseException raised by such a test ("the process dies here") leaves the disk
exactly as a kill -9 would.

This module must never write anywhere but the target's directory, and never swallow an
error of the write, fsync or rename.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from types import ModuleType
from typing import Any

TMP_SUFFIX = ".tmp"

# `os` itself, or anything with the same open/write/fsync/close/replace/unlink calls.
OsLike = ModuleType | Any


def tmp_path(path: Path) -> Path:
    """Where `replace_file` stages the new content of `path`."""
    return path.with_name(path.name + TMP_SUFFIX)


def write_all(fd: int, data: bytes, *, ops: OsLike = os) -> None:
    """Write every byte of `data` to `fd` (os.write may write fewer)."""
    view = memoryview(data)
    while view:
        view = view[ops.write(fd, view):]


def fsync_dir(directory: Path | str, *, ops: OsLike = os) -> None:
    """Make the directory's entries (a create, rename or unlink in it) durable."""
    fd = ops.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        ops.fsync(fd)
    finally:
        ops.close(fd)


def replace_file(path: Path, data: bytes, *, fsync: bool = True, mode: int = 0o644,
                 tmp: Path | None = None, ops: OsLike = os) -> None:
    """Atomically give `path` the content `data` (see the module docstring).

    `fsync=False` keeps the atomic rename but skips both fsyncs: the file is then safe
    against a killed process, not against a power loss (the archive sink's `fsync: false`).
    `tmp` names the staging file where `<path>.tmp` could be mistaken for something else
    (it must be in the same directory).
    """
    if tmp is None:
        tmp = tmp_path(path)
    try:
        fd = ops.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        try:
            write_all(fd, data, ops=ops)
            if fsync:
                ops.fsync(fd)
        finally:
            ops.close(fd)
        ops.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            ops.unlink(tmp)
        raise
    if fsync:
        fsync_dir(path.parent, ops=ops)
