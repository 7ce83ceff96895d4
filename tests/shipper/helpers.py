"""Helpers shared by the tests that run the shipper as its own process."""

from __future__ import annotations

import gzip
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[2]


def subprocess_env() -> dict[str, str]:
    """The environment with the repository root importable (for `-m shipper`, `-m tests...`)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def archive_docs(directory: Path) -> Iterator[dict[str, Any]]:
    """Every record of an archive directory (plain and gzipped parts), in file order."""
    for path in sorted(directory.glob("*.jsonl*")):
        opener: Any = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as fh:
            for line in fh:
                if line.strip():
                    yield orjson.loads(line)


def wait_for_signal_handler(pid: int, timeout: float = 60) -> None:
    """Wait until the process catches SIGTERM (its handler is installed), per /proc."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = Path(f"/proc/{pid}/status").read_text()
        caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
        if int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)):
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} never installed its SIGTERM handler")
