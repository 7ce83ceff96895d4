"""Writes the job-mapping files the exporter reads (docs/ATTRIBUTION.md, format version 1).

One `<job>.json` per running attempt in the job-mapping directory: job id, user,
project, the GPU UUIDs the attempt holds and the pid of its process group leader, with
`start_time`; `end_time` is set when the attempt ends (the exporter then stops
attributing to it) and the file is removed after `keep_seconds`. Files are replaced
atomically (a new hidden temporary, fsync'd, renamed over the file), so the exporter
never reads a half-written one. The directory is opened once, checked from `/` down
(launcher.safefs: nobody but root or the launcher can swap it), and every file is made,
renamed, read and removed relative to that descriptor, never by a path.

This module must never write outside its directory, and never name a job that is not
running as live (an attempt that ended gets its end_time before anything else).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import orjson

from gpu_audit.atomicfile import write_all
from launcher.safefs import RefusedFile, create_new, open_checked, open_dir, read_at

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def file_name(job_id: str) -> str:
    """The mapping file of `job_id` (a name the exporter reads: `*.json`, no leading dot)."""
    return "job-" + _SAFE.sub("_", job_id) + ".json"


class JobMapWriter:
    """The launcher's side of the job-mapping contract."""

    def __init__(
        self,
        directory: Path,
        *,
        keep_seconds: float = 300.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = Path(directory)
        self._keep = keep_seconds
        self._clock = clock
        self._ended: dict[str, float] = {}
        # the exporter may run as another user: the directory and files are world-readable
        self._fd = open_dir(self.directory, mode=0o755)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)

    def path(self, job_id: str) -> Path:
        return self.directory / file_name(job_id)

    def started(
        self,
        job_id: str,
        *,
        user: str,
        project: str | None,
        gpus: Sequence[str],
        pids: Sequence[int],
        start_time: float,
        attempt: int,
    ) -> None:
        doc: dict[str, object] = {
            "version": FORMAT_VERSION,
            "job_id": job_id,
            "user": user,
            "gpus": list(gpus),
            "pids": [int(p) for p in pids],
            "start_time": start_time,
            "end_time": None,
            "attempt": attempt,  # unknown keys are ignored by format-1 readers
        }
        if project:
            doc["project"] = project
        self._write(job_id, doc)
        self._ended.pop(job_id, None)

    def ended(self, job_id: str, end_time: float | None = None) -> None:
        """Mark the job's file ended (the exporter stops attributing to it)."""
        try:
            fd, _ = open_checked(self._fd, file_name(job_id), owner=os.geteuid())
        except (OSError, RefusedFile):
            return
        try:
            doc = orjson.loads(read_at(fd, 1 << 20, 0))
        except (OSError, orjson.JSONDecodeError):
            return
        finally:
            os.close(fd)
        if not isinstance(doc, dict):
            return
        doc["end_time"] = self._clock() if end_time is None else end_time
        self._write(job_id, doc)
        self._ended[job_id] = float(doc["end_time"])

    def sweep(self) -> list[str]:
        """Remove files of jobs that ended more than keep_seconds ago; returns their ids."""
        now = self._clock()
        gone = [j for j, t in self._ended.items() if now - t >= self._keep]
        for job_id in gone:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(file_name(job_id), dir_fd=self._fd)
            del self._ended[job_id]
        return gone

    def _write(self, job_id: str, doc: dict[str, object]) -> None:
        name = file_name(job_id)
        tmp = f".{name}.tmp"  # hidden: the exporter reads *.json without a leading dot
        fd = create_new(self._fd, tmp, mode=0o644, uid=os.geteuid(), gid=os.getegid(),
                        flags=os.O_WRONLY)
        try:
            write_all(fd, orjson.dumps(doc, option=orjson.OPT_SORT_KEYS))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=self._fd, dst_dir_fd=self._fd)
        os.fsync(self._fd)
