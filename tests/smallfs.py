"""A small real filesystem for disk-full tests: a tmpfs, or a loop-mounted ext4 image
where tmpfs cannot be mounted; the fixture skips with the reason where neither can."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def mount_small(target: Path, image: Path, size: int) -> str | None:
    """Mount a `size`-byte filesystem on `target`; None when it worked, else why not."""
    if os.geteuid() != 0:
        return "mounting a small filesystem needs root"
    tmpfs = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(target)],
        capture_output=True, text=True, check=False,
    )
    if tmpfs.returncode == 0:
        return None
    if shutil.which("mkfs.ext4") is None:
        return f"tmpfs mount refused ({tmpfs.stderr.strip()}) and no mkfs.ext4 for a loop image"
    with image.open("wb") as handle:
        handle.truncate(size)
    steps = [
        ["mkfs.ext4", "-q", "-F", str(image)],
        ["mount", "-o", "loop", str(image), str(target)],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return (f"tmpfs mount refused ({tmpfs.stderr.strip()}); loop image failed at "
                    f"{step[0]}: {done.stderr.strip()}")
    return None


@contextmanager
def small_filesystem(tmp_path: Path, size: int, name: str = "mnt") -> Iterator[Path]:
    """A mounted filesystem of `size` bytes under tmp_path, unmounted afterwards."""
    target = tmp_path / name
    target.mkdir()
    why = mount_small(target, tmp_path / f"{name}.img", size)
    if why is not None:
        pytest.skip(why)
    try:
        yield target
    finally:
        if subprocess.run(["umount", str(target)], check=False).returncode != 0:
            # something (a thread of a failed test) still holds a file: detach it anyway so
            # no mount outlives the test
            subprocess.run(["umount", "-l", str(target)], check=True)
