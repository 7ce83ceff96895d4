"""Atomic, verifiable checkpoint directories: commit one, find the newest valid one, retain K.

Layout of a checkpoint directory (one writer at a time: rank 0 of one job):

    step-<N>/MANIFEST.json   a committed checkpoint after N completed steps, with its files
    anomaly-<N>/...          a checkpoint taken on a training anomaly (never resumed from
                             unless asked; kept apart so it cannot shadow a good step-<N>)
    .tmp-*                   a commit in progress, or what a killed writer left behind

Commit protocol: every file is written into a fresh temporary directory inside the
checkpoint directory and fsynced, the temporary directory is fsynced, renamed to
`<prefix>-<N>`, and the parent fsynced; only then is MANIFEST.json written (temporary
file, fsync, rename, fsync). The manifest is the commit point: it names every file with
its size and SHA-256 and carries a SHA-256 of its own body. A directory whose manifest is
missing, unreadable or does not match the files is not a checkpoint.

This module must never delete or overwrite a checkpoint that verifies (except retention,
which only removes checkpoints older than the newest K), and never import anything outside
the standard library.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import re
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

MANIFEST = "MANIFEST.json"
FORMAT = "gpu-audit-ckpt"
FORMAT_VERSION = 1
PREFIXES = ("step", "anomaly")
_TMP = ".tmp-"
_NAME = re.compile(r"^(step|anomaly)-(\d+)$")
_FILE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")

# Fault injection for tests (tests/ckpt/test_ckpt_kill.py): called with the name of each
# boundary of a commit; a test sets it in a child process to SIGKILL itself there.
_fault_hook: Callable[[str], None] | None = None


def _at(point: str) -> None:
    if _fault_hook is not None:
        _fault_hook(point)


Writer = Callable[[BinaryIO], object]
"""Writes one file's bytes to the stream it is given (torch.save, pickle.dump, ...)."""


class InvalidCheckpoint(Exception):
    """A directory that is not a valid checkpoint; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class FileEntry:
    sha256: str
    size: int


@dataclass(frozen=True, slots=True)
class Manifest:
    """A committed checkpoint as its manifest describes it."""

    path: Path
    step: int
    cursor: Any
    created: float
    reason: str
    files: Mapping[str, FileEntry]
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files.values())


class _HashingWriter:
    """A write-only stream that hashes what passes through it, so nothing is read back.

    Large writes are hashed on a helper thread (hashlib releases the GIL on big buffers), so
    hashing overlaps the write and the serializer's own work. Queued data is immutable
    `bytes` (anything else is copied first), so a caller reusing its buffer cannot change
    what is hashed. It has no fileno() on purpose: numpy and torch would write around it.
    """

    _THREAD_MIN = 1 << 20

    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh
        self._hash = hashlib.sha256()
        self._queue: queue.Queue[bytes | memoryview | None] | None = None
        self._thread: threading.Thread | None = None
        self.size = 0

    def _drain(self) -> None:
        assert self._queue is not None
        while (chunk := self._queue.get()) is not None:
            self._hash.update(chunk)

    def _write(self, view: memoryview, stable: bool) -> int:
        n = len(view)
        if self._thread is None and n >= self._THREAD_MIN:
            self._queue = queue.Queue(maxsize=4)
            self._thread = threading.Thread(target=self._drain, name="ckpt-sha256", daemon=True)
            self._thread.start()
        if self._queue is not None:
            self._queue.put(view if stable else bytes(view))
        else:
            self._hash.update(view)
        self._fh.write(view)
        self.size += n
        return n

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        return self._write(view, stable=isinstance(view.obj, bytes))

    def write_stable(self, data: Any) -> int:
        """Like write, for memory the caller promises not to change until commit returns."""
        return self._write(memoryview(data).cast("B"), stable=True)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self._fh.flush()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    @property
    def closed(self) -> bool:
        return False

    def finish(self) -> str:
        """Stop the hashing thread (also after a failed write) and return the hex digest."""
        if self._thread is not None and self._queue is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        return self._hash.hexdigest()


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _canonical(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def dir_name(prefix: str, step: int) -> str:
    if prefix not in PREFIXES:
        raise ValueError(f"checkpoint prefix must be one of {PREFIXES}, not {prefix!r}")
    if step < 0:
        raise ValueError(f"step must be >= 0, not {step}")
    return f"{prefix}-{step}"


def commit(
    directory: Path,
    step: int,
    files: Mapping[str, Writer],
    *,
    cursor: Any = None,
    reason: str = "explicit",
    meta: Mapping[str, Any] | None = None,
    prefix: str = "step",
) -> Manifest:
    """Write `files` as checkpoint `<prefix>-<step>` atomically and return its manifest.

    An existing checkpoint of that name that verifies is kept and returned unchanged (a
    step's state is the step's state); one that does not verify is moved aside first.
    """
    problems = [
        f"file name {n!r} is not a plain file name"
        for n in files
        if not _FILE_NAME.match(n)
    ]
    if MANIFEST in files:
        problems.append(f"{MANIFEST} is the helper's own file")
    if not files:
        problems.append("a checkpoint needs at least one file")
    try:
        _canonical({"cursor": cursor, "meta": dict(meta or {})})
    except (TypeError, ValueError) as exc:
        problems.append(f"cursor and meta must be JSON (finite numbers, str keys): {exc}")
    if problems:
        raise ValueError("cannot commit checkpoint: " + "; ".join(problems))
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / dir_name(prefix, step)
    if final.exists():
        try:
            return verify(final)
        except InvalidCheckpoint:
            _remove(final)
    tmp = directory / f"{_TMP}{final.name}-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    entries: dict[str, FileEntry] = {}
    for name, writer in files.items():
        with open(tmp / name, "xb") as fh:
            hw = _HashingWriter(fh)
            try:
                writer(hw)  # type: ignore[arg-type]  # a write-only stream is what writers need
            finally:
                digest = hw.finish()
            fh.flush()
            _at("after_file_write")
            os.fsync(fh.fileno())
            _at("after_file_fsync")
        entries[name] = FileEntry(digest, hw.size)
    fsync_dir(tmp)
    _at("before_rename")
    os.rename(tmp, final)
    fsync_dir(directory)
    _at("after_rename")
    created = time.time()
    body: dict[str, Any] = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "step": step,
        "cursor": cursor,
        "created": created,
        "reason": reason,
        "files": {n: {"sha256": e.sha256, "size": e.size} for n, e in sorted(entries.items())},
        "meta": dict(meta or {}),
    }
    doc = dict(body, manifest_sha256=hashlib.sha256(_canonical(body)).hexdigest())
    data = json.dumps(doc, sort_keys=True, indent=1).encode() + b"\n"
    tmp_manifest = final / (MANIFEST + ".tmp")
    with open(tmp_manifest, "wb") as fh:
        fh.write(data[: len(data) // 2])
        fh.flush()
        _at("mid_manifest")
        fh.write(data[len(data) // 2 :])
        fh.flush()
        os.fsync(fh.fileno())
    _at("after_manifest_write")
    os.rename(tmp_manifest, final / MANIFEST)
    _at("after_manifest_rename")
    fsync_dir(final)
    return Manifest(final, step, cursor, created, reason, entries, dict(meta or {}))


def read_manifest(path: Path) -> Manifest:
    """The manifest of checkpoint directory `path`, checked on its own (files not hashed)."""
    try:
        raw = (path / MANIFEST).read_bytes()
    except FileNotFoundError:
        raise InvalidCheckpoint(f"{path}: no {MANIFEST} (never committed)") from None
    except OSError as exc:
        raise InvalidCheckpoint(f"{path}: {MANIFEST} unreadable: {exc}") from None
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidCheckpoint(f"{path}: {MANIFEST} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidCheckpoint(f"{path}: {MANIFEST} is not a JSON object")
    claimed = doc.pop("manifest_sha256", None)
    try:
        actual = hashlib.sha256(_canonical(doc)).hexdigest()
    except (TypeError, ValueError) as exc:
        raise InvalidCheckpoint(f"{path}: {MANIFEST} body not canonical JSON: {exc}") from None
    if claimed != actual:
        raise InvalidCheckpoint(f"{path}: {MANIFEST} does not match its own sha256 (damaged)")
    if doc.get("format") != FORMAT or doc.get("version") != FORMAT_VERSION:
        raise InvalidCheckpoint(
            f"{path}: format {doc.get('format')!r} version {doc.get('version')!r}, "
            f"expected {FORMAT!r} version {FORMAT_VERSION}"
        )
    m = _NAME.match(path.name)
    step = doc.get("step")
    if m is None or step != int(m.group(2)):
        raise InvalidCheckpoint(f"{path}: manifest step {step!r} does not match the directory name")
    files = doc.get("files")
    if not isinstance(files, dict) or not files:
        raise InvalidCheckpoint(f"{path}: manifest lists no files")
    entries: dict[str, FileEntry] = {}
    for name, e in files.items():
        if not (
            isinstance(e, dict)
            and isinstance(e.get("sha256"), str)
            and isinstance(e.get("size"), int)
            and _FILE_NAME.match(name)
        ):
            raise InvalidCheckpoint(f"{path}: manifest entry for {name!r} is malformed")
        entries[name] = FileEntry(e["sha256"], e["size"])
    return Manifest(
        path, step, doc.get("cursor"), float(doc.get("created", 0.0)), str(doc.get("reason")),
        entries, doc.get("meta") or {},
    )


def verify(path: Path) -> Manifest:
    """The manifest of `path` after checking every file's size and SHA-256 against it."""
    manifest = read_manifest(path)
    for name, entry in manifest.files.items():
        f = path / name
        try:
            size = f.stat().st_size
            if size != entry.size:
                raise InvalidCheckpoint(f"{f}: {size} bytes, manifest says {entry.size}")
            with open(f, "rb") as fh:
                digest = hashlib.file_digest(fh, "sha256").hexdigest()  # readinto, no copies
        except OSError as exc:
            raise InvalidCheckpoint(f"{f}: unreadable: {exc}") from None
        if digest != entry.sha256:
            raise InvalidCheckpoint(f"{f}: sha256 does not match the manifest (damaged)")
    return manifest


def scan(directory: Path, prefix: str = "step") -> list[tuple[int, Path]]:
    """Every `<prefix>-<N>` directory, newest step first (committed or not)."""
    found: list[tuple[int, Path]] = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(directory):
            m = _NAME.match(entry.name)
            if m and m.group(1) == prefix and entry.is_dir(follow_symlinks=False):
                found.append((int(m.group(2)), Path(entry.path)))
    found.sort(reverse=True)
    return found


def latest(directory: Path, prefix: str = "step") -> tuple[Manifest | None, list[str]]:
    """The newest checkpoint that verifies, and why each newer one was skipped."""
    skipped: list[str] = []
    for _, path in scan(directory, prefix):
        try:
            return verify(path), skipped
        except InvalidCheckpoint as exc:
            skipped.append(str(exc))
    return None, skipped


def clean_stale(directory: Path) -> list[str]:
    """Remove temporary directories a killed writer left (call with no writer running)."""
    removed: list[str] = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(directory):
            if entry.name.startswith(_TMP):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                removed.append(entry.name)
    return removed


def retain(directory: Path, keep_last: int, prefix: str = "step") -> list[Path]:
    """Keep the newest `keep_last` committed checkpoints; remove older ones and dead writes.

    "Committed" here means a manifest that reads back (files are not hashed: retention
    must stay cheap for large states). Directories without a valid manifest that are older
    than the newest committed one are debris of killed writes and go too.
    """
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, not {keep_last}")
    committed: list[Path] = []
    broken: list[tuple[int, Path]] = []
    for step, path in scan(directory, prefix):
        try:
            read_manifest(path)
        except InvalidCheckpoint:
            broken.append((step, path))
        else:
            committed.append(path)
    doomed = committed[keep_last:]
    if committed:
        newest = int(_NAME.match(committed[0].name).group(2))  # type: ignore[union-attr]
        doomed += [p for s, p in broken if s < newest]
    for path in doomed:
        _remove(path)
    return doomed


def _remove(path: Path) -> None:
    """Rename out of the checkpoint namespace first, so a kill mid-delete leaves only debris."""
    aside = path.parent / f"{_TMP}delete-{path.name}-{secrets.token_hex(4)}"
    os.rename(path, aside)
    shutil.rmtree(aside, ignore_errors=True)
