"""gpu_audit.atomicfile: a replaced file holds its old bytes or its new ones, never a mix,
and a failed replacement leaves no temporary file behind.

Failures are injected at each step through the `ops` hook (the same hook the archive
sink's crash matrix uses): the tmp open, the tmp write, the file fsync, the rename and
the directory fsync.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from gpu_audit import atomicfile


class Die(BaseException):
    """The process is killed here (no handler runs)."""


class FailingOs:
    """`os`, except that the first call named `step` (matching `flags` for open) fails."""

    def __init__(self, step: str, exc: BaseException | None = None, *,
                 directory: bool = False) -> None:
        self.step = step
        self.exc = exc if exc is not None else OSError(errno.EIO, "injected")
        self.directory = directory  # fsync of the directory rather than of the tmp file
        self.calls: list[str] = []
        self._dir_fds: set[int] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def _maybe_fail(self, name: str) -> None:
        self.calls.append(name)
        if name == self.step:
            raise self.exc

    def open(self, path: Any, flags: int, mode: int = 0o777) -> int:
        if flags & os.O_DIRECTORY:
            fd = os.open(path, flags, mode)
            self._dir_fds.add(fd)
            return fd
        self._maybe_fail("open")
        return os.open(path, flags, mode)

    def write(self, fd: int, data: Any) -> int:
        self._maybe_fail("write")
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        if (fd in self._dir_fds) == self.directory:
            self._maybe_fail("fsync")
        os.fsync(fd)

    def replace(self, src: Any, dst: Any) -> None:
        self._maybe_fail("replace")
        os.replace(src, dst)


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name != "state.json")


def test_replace_writes_new_content_and_no_tmp(tmp_path: Path) -> None:
    """A replacement gives the new bytes with the requested mode and leaves only the file."""
    target = tmp_path / "state.json"
    atomicfile.replace_file(target, b"old")
    atomicfile.replace_file(target, b"new" * 10_000, mode=0o640)
    assert target.read_bytes() == b"new" * 10_000
    assert target.stat().st_mode & 0o777 == 0o640 & ~_umask()
    assert _leftovers(tmp_path) == []


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("step", ["open", "write", "fsync", "replace"])
def test_failure_before_the_rename_keeps_old_content_and_removes_tmp(
    tmp_path: Path, step: str
) -> None:
    """An OSError at the tmp open, write, fsync or rename is raised, the old content is
    intact and no temporary file is left."""
    target = tmp_path / "state.json"
    atomicfile.replace_file(target, b"old")
    ops = FailingOs(step)
    with pytest.raises(OSError) as info:
        atomicfile.replace_file(target, b"new", ops=ops)
    assert info.value.errno == errno.EIO
    assert step in ops.calls
    assert target.read_bytes() == b"old"
    assert _leftovers(tmp_path) == []


def test_failure_of_the_directory_fsync_is_raised_after_the_rename(tmp_path: Path) -> None:
    """A failed directory fsync is reported (the rename may not be durable) while the file
    already holds the complete new content and no temporary is left."""
    target = tmp_path / "state.json"
    atomicfile.replace_file(target, b"old")
    ops = FailingOs("fsync", directory=True)
    with pytest.raises(OSError):
        atomicfile.replace_file(target, b"new", ops=ops)
    assert target.read_bytes() == b"new"
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("step", ["write", "fsync", "replace"])
def test_a_killed_writer_leaves_old_content_and_the_next_write_reuses_the_tmp(
    tmp_path: Path, step: str
) -> None:
    """A process killed mid-replacement leaves the old content; the tmp it left is
    overwritten (not appended to) by the next replacement, which leaves nothing behind."""
    target = tmp_path / "state.json"
    atomicfile.replace_file(target, b"old")
    with pytest.raises(Die):
        atomicfile.replace_file(target, b"x" * 5000, ops=FailingOs(step, Die()))
    assert target.read_bytes() == b"old"
    atomicfile.replace_file(target, b"new")
    assert target.read_bytes() == b"new"
    assert _leftovers(tmp_path) == []


def test_custom_tmp_name_is_used_and_removed(tmp_path: Path) -> None:
    """A caller-chosen staging name is the one written, renamed and cleaned on failure."""
    target = tmp_path / "state.json"
    seen: list[str] = []

    class Spy(FailingOs):
        def replace(self, src: Any, dst: Any) -> None:
            seen.append(Path(src).name)
            super().replace(src, dst)

    atomicfile.replace_file(target, b"a", tmp=tmp_path / ".state.json.tmp", ops=Spy("none"))
    assert seen == [".state.json.tmp"] and target.read_bytes() == b"a"
    with pytest.raises(OSError):
        atomicfile.replace_file(target, b"b", tmp=tmp_path / ".state.json.tmp",
                                ops=FailingOs("replace"))
    assert target.read_bytes() == b"a" and _leftovers(tmp_path) == []


def test_no_fsync_mode_still_replaces_atomically(tmp_path: Path) -> None:
    """fsync=False skips both fsyncs but still stages and renames."""
    target = tmp_path / "state.json"
    ops = FailingOs("none")
    atomicfile.replace_file(target, b"new", fsync=False, ops=ops)
    assert "fsync" not in ops.calls and "replace" in ops.calls
    assert target.read_bytes() == b"new"


def test_fsync_dir_closes_its_descriptor(tmp_path: Path) -> None:
    """fsync_dir fsyncs the directory and closes the descriptor even when fsync fails."""
    ops = FailingOs("fsync", directory=True)
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError):
        atomicfile.fsync_dir(tmp_path, ops=ops)
    assert len(os.listdir("/proc/self/fd")) == before
    atomicfile.fsync_dir(tmp_path)
