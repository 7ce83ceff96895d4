"""What the kernel says about the jobs' processes: /proc and the cgroup filesystem.

Process groups are found by scanning /proc (`group_members`), a process is told apart
from a later one with the same pid by its start time (`start_ticks`), and an OOM kill is
read from the job's cgroup v2 `memory.events`. These are kernel-made files no user can
replace; a process that is gone or unreadable reads as gone.

This module must never signal or wait for a process; it only reads.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def _stat_fields(pid: int | str) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (which may hold spaces and
    parentheses); None when the process is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split() if ")" in text else None


def start_ticks(pid: int) -> int:
    """The process's start time in clock ticks (field 22 of /proc/<pid>/stat); -1 if gone."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else -1
    except (IndexError, ValueError):
        return -1


def alive(pid: int) -> bool:
    """A live (not zombie) process with this pid."""
    fields = _stat_fields(pid)
    return fields is not None and bool(fields) and fields[0] not in ("Z", "X")


def group_members(pgids: set[int]) -> dict[int, set[int]]:
    """Live (not zombie) pids of the given process groups."""
    out: dict[int, set[int]] = {}
    if not pgids:
        return out
    try:
        names = os.listdir(PROC)
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        fields = _stat_fields(name)
        try:
            state, pgrp = fields[0], int(fields[2])  # type: ignore[index]
        except (TypeError, IndexError, ValueError):
            continue
        if pgrp in pgids and state not in ("Z", "X"):
            out.setdefault(pgrp, set()).add(int(name))
    return out


def cgroup_oom_kills(pid: int) -> int | None:
    """oom_kill count of the cgroup (v2) `pid` lives in, or None where not readable."""
    try:
        text = (PROC / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("0::"):
            events = CGROUP_ROOT / line[3:].lstrip("/") / "memory.events"
            try:
                for ev in events.read_text().splitlines():
                    name, _, value = ev.partition(" ")
                    if name == "oom_kill":
                        return int(value)
            except (OSError, ValueError):
                return None
    return None
