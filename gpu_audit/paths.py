"""What is wrong with a directory the configuration names, said about the path itself.

Creating a spool under /proc fails with ENOENT and one that is a file with EEXIST; shown
raw ("No such file or directory", "File exists") they send the user looking for the
wrong thing. These checks look at the path without creating anything, so check-config
can run them, and `run`/`exporter`/`shipper` run them before starting anything.
"""

from __future__ import annotations

import os
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")

# Kernel-made file systems: nothing written there is stored (most refuse new files).
VIRTUAL_FILESYSTEMS = frozenset({
    "proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "configfs",
    "pstore", "bpf", "devpts", "efivarfs", "fusectl", "mqueue", "binfmt_misc",
})


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash in mount points as octal escapes
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def _mount_of(path: Path, mountinfo: Path) -> tuple[str, str] | None:
    """(mount point, file system type) of the mount holding `path`; None when unknown."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None  # not Linux, or no /proc: skip this check rather than guess
    best: tuple[str, str] | None = None
    target = str(path)
    for line in lines:
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        point = _unescape(fields[4])
        fstype = fields[fields.index("-", 6) + 1]
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, fstype)
    return best


def filesystem_type(path: Path, *, mountinfo: Path = MOUNTINFO) -> str | None:
    """The type of the file system that holds `path` (absolute), e.g. "ext4", "proc"."""
    mount = _mount_of(path, mountinfo)
    return mount[1] if mount else None


def path_problems(path: Path, *, writable: bool = True, parents: bool = True) -> list[str]:
    """Why `path` cannot be (or become) a directory gpu-audit writes; [] when it can.

    Always checked: the path itself is a file, or it lies in a kernel file system.
    writable=False leaves out permissions and parents=False a file where a parent
    directory should be: both can be fixed while the process runs, and the exporter's
    spool keeps retrying through them (tests/integration/test_spool_unwritable.py).
    """
    path = Path(os.path.abspath(path))
    if path.exists() and not path.is_dir():
        kind = "a file" if path.is_file() else "not a regular directory"
        return [f"{path} is {kind}, not a directory"]
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        if not parents:
            return []
        return [f"cannot create {path}: {probe} is a file, not a directory"]
    mount = _mount_of(probe.resolve(), MOUNTINFO)
    if mount is not None and mount[1] in VIRTUAL_FILESYSTEMS:
        point, fstype = mount
        return [f"{path} is inside {point}, a {fstype} filesystem (made by the "
                "kernel, not a disk): nothing can be stored there; choose a directory on a "
                "disk"]
    if writable and not os.access(probe, os.W_OK | os.X_OK):
        if probe == path:
            return [f"{path} is not writable by this user"]
        return [f"cannot create {path}: {probe} is not writable by this user"]
    return []


def directory_problems(
    where: str, path: Path, *, writable: bool = True, parents: bool = True
) -> list[str]:
    """path_problems, each message prefixed with the key path `where`."""
    return [f"{where}: {m}" for m in path_problems(path, writable=writable, parents=parents)]
