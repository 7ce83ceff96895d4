"""Writes the job-mapping files the exporter reads (docs/ATTRIBUTION.md, format version 1).

One `<job>.json` per running attempt in the job-mapping directory: job id, user,
project, the GPU UUIDs the attempt holds and the pid of its process group leader, with
`start_time`; `end_time` is set when the attempt ends (the exporter then stops
attributing to it) and the file is removed after `keep_seconds`. Files are replaced
atomically (gpu_audit.atomicfile), so the exporter never reads a half-written one.

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

from gpu_audit import atomicfile

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
        self.directory.mkdir(parents=True, exist_ok=True)
        # the exporter may run as another user: the directory and files are world-readable
        with contextlib.suppress(OSError):
            os.chmod(self.directory, 0o755)  # noqa: S103 - the exporter reads it

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
        path = self.path(job_id)
        try:
            doc = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return
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
                self.path(job_id).unlink()
            del self._ended[job_id]
        return gone

    def _write(self, job_id: str, doc: dict[str, object]) -> None:
        path = self.path(job_id)
        atomicfile.replace_file(path, orjson.dumps(doc, option=orjson.OPT_SORT_KEYS))
        with contextlib.suppress(OSError):
            os.chmod(path, 0o644)
