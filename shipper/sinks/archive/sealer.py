"""Closing an archive part: compress it, then seal it (gpu_audit.archive.seal).

Both steps are idempotent and leave the directory consistent after a crash at any call:
- compress writes `<part>.gz.tmp`, fsyncs it, renames it to `<part>.gz`, fsyncs the
  directory, then deletes the plain part (a leftover `.gz.tmp` is deleted on start; a
  plain part beside its complete `.gz` is the same part and is deleted);
- seal reads the part as stored (its records for the summary and rollup, its bytes for
  the SHA-256), then writes `<stem>.seal.json` atomically (tmp, fsync, rename, fsync of
  the directory). A closed part without a seal is sealed on the next start.

Every disk-changing call goes through `ops` (the archive sink module's `os`, looked up
when the sink calls), so the sink's crash-matrix tests reach every step here too.
Reading is plain file I/O (a crash cannot change what was read).

This module never writes into a part, and never seals a part it could not read whole.
"""

from __future__ import annotations

import hashlib
import os
import zlib
from pathlib import Path
from typing import Any

from gpu_audit import atomicfile
from gpu_audit.archive import PartLines, seal_name
from gpu_audit.archive.seal import Summary, digest, file_sha256, make, summarize
from gpu_audit.errors import GpuAuditError

_CHUNK = 1 << 20


class CannotSeal(GpuAuditError):
    """The part could not be read whole (the message says why): it stays unsealed."""


def write_all(fd: int, data: bytes, ops: Any) -> None:
    # Two calls on purpose where there is more than one byte: a crash between them is a
    # torn write, the case recovery must handle, and the fault-injection tests reach it.
    view = memoryview(data)
    half = len(view) // 2
    for part in (view[:half], view[half:]):
        rest = part
        while rest:
            rest = rest[ops.write(fd, rest):]


def compress(directory: Path, name: str, *, fsync: bool, ops: Any) -> None:
    """`name` (a plain part) -> `name.gz`, then the plain part is deleted."""
    src = directory / name
    gz = directory / (name + ".gz")
    tmp = directory / (name + ".gz.tmp")
    fd_in = os.open(src, os.O_RDONLY)
    try:
        fd_out = ops.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            # wbits 31: a gzip stream, header with mtime 0 (same bytes on every run)
            comp = zlib.compressobj(6, zlib.DEFLATED, 31)
            while chunk := os.read(fd_in, _CHUNK):
                write_all(fd_out, comp.compress(chunk), ops)
            write_all(fd_out, comp.flush(), ops)
            if fsync:
                ops.fsync(fd_out)
        finally:
            ops.close(fd_out)
    finally:
        os.close(fd_in)
    ops.replace(tmp, gz)
    if fsync:
        atomicfile.fsync_dir(directory, ops=ops)
    ops.unlink(src)


def summary_of(path: Path) -> Summary:
    """The summary of a part file as stored; CannotSeal when it is not readable whole."""
    reader = PartLines(path)
    try:
        s = summarize(line for _first, lines in reader.chunks() for line in lines)
    except OSError as exc:
        raise CannotSeal(f"{path.name}: {exc.strerror or exc}") from None
    if reader.damage is not None:
        raise CannotSeal(reader.where_damaged())
    if reader.torn:
        raise CannotSeal(f"{path.name}: its last line has no newline")
    return s


def seal_part(directory: Path, name: str, *, host: str, stream: str, day: str, number: int,
              prev_seal: str, fsync: bool, ops: Any, key: bytes | None = None) -> str:
    """Write the seal of the closed part `name` (as stored); its digest. With `key` (the
    trail's HMAC key) the seal carries its MAC."""
    path = directory / name
    summary = summary_of(path)
    sha, size = file_sha256(path)
    data = make(host=host, stream=stream, part=name, day=day, number=number,
                summary=summary, part_sha256=sha, part_bytes=size, prev_seal=prev_seal,
                key=key)
    target = directory / seal_name(name)
    atomicfile.replace_file(target, data, fsync=fsync, mode=0o644,
                            tmp=target.with_name(target.name + ".tmp"), ops=ops)
    return digest(data)


def seal_digest(path: Path) -> str:
    """The digest of an existing seal file."""
    return hashlib.sha256(path.read_bytes()).hexdigest()
