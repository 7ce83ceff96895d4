"""The GPU inventory's file: one small JSON document in a directory the exporter owns.

The exporter runs as root and the file outlives it, so the file is treated as something
an attacker might have shaped:
- the directory is created 0700 and must be owned by the exporter's user and writable by
  nobody else, or nothing is read from it or written to it (a warning says why);
- every access goes through a descriptor of that directory (`dir_fd`), with O_NOFOLLOW:
  a symlink planted in it, or a parent directory renamed after the check, cannot make
  the exporter read or overwrite another file;
- one exporter at a time: a lock file in the directory (gpu_audit.lockfile);
- the document is at most MAX_BYTES and is validated field by field (`InventoryDoc`);
  anything unreadable, oversized or malformed is a logged warning and an empty
  inventory, never a crash;
- writes replace the file atomically (gpu_audit.atomicfile): a crash at any point
  leaves the old document or the new one.

This module must never raise to its caller for anything the disk or the file's content
does: the exporter keeps serving without persistence rather than stop.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpu_audit.atomicfile import replace_file
from gpu_audit.errors import LockHeld
from gpu_audit.lockfile import ProcessLock

log = logging.getLogger("gpu_audit.inventory")

FILE_NAME = "gpus.json"
LOCK_NAME = "lock"
VERSION = 1
MAX_BYTES = 1024 * 1024  # a few hundred GPUs' records; anything bigger is not ours
MAX_GPUS = 256
MAX_XID_CODES = 64
MAX_OWNERS = 32

_Text = Annotated[str, Field(max_length=512)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)


class OwnerDoc(_Strict):
    user: _Text = ""
    project: _Text = ""
    job: _Text = ""
    slurm_job: _Text = ""


class GpuDoc(_Strict):
    """One GPU as recorded: identity, last state, XID history, last owners."""

    uuid: Annotated[str, Field(min_length=5, max_length=128, pattern=r"^GPU-[\w.-]+$")]
    index: Annotated[int, Field(ge=0, le=4096)]
    name: _Text = ""
    serial: _Text = ""
    pci_bus_id: _Text = ""
    up: bool
    error: _Text = ""
    last_seen: Annotated[float, Field(ge=0)] | None = None
    """Unix time the GPU was last read (None: never, since it was first recorded)."""
    xid_totals: dict[Annotated[str, Field(pattern=r"^\d{1,6}$")], Annotated[int, Field(ge=0)]] = \
        Field(default_factory=dict, max_length=MAX_XID_CODES)
    xid_last_timestamp: Annotated[float, Field(ge=0)] | None = None
    owners: list[OwnerDoc] = Field(default_factory=list, max_length=MAX_OWNERS)


class InventoryDoc(_Strict):
    version: int
    source: _Text
    """What the GPUs were read from ("hardware", or "sim:<scenario>"): a simulator's
    GPUs are never reported lost by a real backend, nor one scenario's by another."""
    gpus: list[GpuDoc] = Field(default_factory=list, max_length=MAX_GPUS)


class _DirOps:
    """The `os` calls gpu_audit.atomicfile makes, bound to one directory descriptor and
    never following a symlink, so the replace happens in the directory that was checked."""

    def __init__(self, dir_fd: int, directory: Path) -> None:
        self._fd = dir_fd
        self._dir = directory

    def _name(self, path: str | Path) -> str:
        path = Path(path)
        return "." if path == self._dir else path.name

    def open(self, path: str | Path, flags: int, mode: int = 0o600) -> int:
        name = self._name(path)
        if name != ".":
            flags |= os.O_NOFOLLOW
        return os.open(name, flags | os.O_CLOEXEC, mode, dir_fd=self._fd)

    def replace(self, src: str | Path, dst: str | Path) -> None:
        os.replace(self._name(src), self._name(dst), src_dir_fd=self._fd, dst_dir_fd=self._fd)

    def unlink(self, path: str | Path) -> None:
        os.unlink(self._name(path), dir_fd=self._fd)

    write = staticmethod(os.write)
    fsync = staticmethod(os.fsync)
    close = staticmethod(os.close)


class InventoryStore:
    """The inventory directory, checked and locked by `open()`; `load()` and `save()`
    afterwards. Without a usable directory both do nothing (persistence is off)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fd: int | None = None
        self._lock: ProcessLock | None = None
        self._write_failing = False

    @property
    def persistent(self) -> bool:
        return self._fd is not None

    def open(self) -> None:
        """Create (0700), check and lock the directory. Raises LockHeld when another
        exporter holds it; any other problem is a warning and no persistence."""
        directory = self.directory
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            log.warning("GPU inventory not kept: cannot use %s (%s); a GPU lost before a "
                        "restart will be forgotten", directory, exc.strerror or exc)
            return
        problem = _ownership_problem(os.fstat(fd))
        if problem:
            os.close(fd)
            log.warning("GPU inventory not kept: %s %s; it must belong to the exporter's "
                        "user and be writable by nobody else", directory, problem)
            return
        try:
            self._lock = ProcessLock.acquire(directory / LOCK_NAME,
                                             f"GPU inventory directory {directory}")
        except LockHeld:
            os.close(fd)
            raise
        except OSError as exc:
            os.close(fd)
            log.warning("GPU inventory not kept: cannot lock %s (%s)", directory,
                        exc.strerror or exc)
            return
        self._fd = fd

    def load(self) -> InventoryDoc | None:
        """The recorded document, or None (nothing recorded, or unusable: logged)."""
        if self._fd is None:
            return None
        where = self.directory / FILE_NAME
        try:
            fd = os.open(FILE_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            why = "a symlink" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
            log.warning("GPU inventory %s ignored: %s; starting an empty one", where, why)
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                log.warning("GPU inventory %s ignored: not a regular file", where)
                return None
            data = os.read(fd, MAX_BYTES + 1)
        except OSError as exc:
            log.warning("GPU inventory %s ignored: %s", where, exc.strerror or exc)
            return None
        finally:
            os.close(fd)
        if len(data) > MAX_BYTES:
            log.warning("GPU inventory %s ignored: larger than %d bytes", where, MAX_BYTES)
            return None
        return parse(data, str(where))

    def save(self, doc: InventoryDoc) -> bool:
        """Replace the document atomically; False (logged once until it works again)
        when the write fails."""
        if self._fd is None:
            return False
        data = (json.dumps(doc.model_dump(), sort_keys=True, separators=(",", ":")) + "\n"
                ).encode()
        try:
            replace_file(self.directory / FILE_NAME, data, mode=0o600,
                         ops=_DirOps(self._fd, self.directory))
        except OSError as exc:
            if not self._write_failing:
                log.warning("GPU inventory %s not written: %s (retried while it changes)",
                            self.directory / FILE_NAME, exc.strerror or exc)
            self._write_failing = True
            return False
        if self._write_failing:
            log.info("GPU inventory %s written again", self.directory / FILE_NAME)
        self._write_failing = False
        return True

    def close(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _ownership_problem(st: os.stat_result) -> str:
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not {os.geteuid()}"
    if st.st_mode & 0o022:
        return f"is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return ""


def parse(data: bytes, where: str) -> InventoryDoc | None:
    """A document from its bytes; None with one warning naming every problem."""
    try:
        raw: Any = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        # RecursionError: arrays nested a hundred thousand deep, which json gives up on
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        log.warning("GPU inventory %s ignored: not JSON (%s); starting an empty one", where, why)
        return None
    try:
        doc = InventoryDoc.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'document'}: {err['msg']}"
            for err in exc.errors())
        log.warning("GPU inventory %s ignored: %s; starting an empty one", where, problems)
        return None
    if doc.version != VERSION:
        log.warning("GPU inventory %s ignored: version %d, this exporter writes %d",
                    where, doc.version, VERSION)
        return None
    if len({g.uuid for g in doc.gpus}) != len(doc.gpus):
        log.warning("GPU inventory %s ignored: a GPU is listed twice", where)
        return None
    return doc
