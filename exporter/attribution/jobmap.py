"""The job-mapping directory: one small JSON file per job, written by the launcher and
Slurm prologs, saying which pids and GPUs belong to which job and person. The `jobmap`
attribution source that asks it is exporter/attribution/sources/jobmap.py.

The format is a public contract, documented in docs/ATTRIBUTION.md (version 1). The
directory is stat'ed once per cycle and a file is parsed only when its mtime, size or
inode changed. A malformed file is reported once (per version of the file), counted,
and skipped; the others are still read. This module must never raise out of refresh()
or lookups, and never read more than `max_file_bytes` of a file.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from exporter.attribution.sanitize import clean_text
from gpu_audit.errors import GpuAuditError

log = logging.getLogger(__name__)

SUPPORTED_VERSIONS = frozenset({1})
DEFAULT_MAX_FILE_BYTES = 64 * 1024

# JSON key -> identity field. `account` also stands in for the project when none is given.
_STRING_FIELDS: tuple[tuple[str, str], ...] = (
    ("job_id", "job"),
    ("user", "user"),
    ("project", "project"),
    ("slurm_job_id", "slurm_job_id"),
    ("slurm_user", "slurm_user"),
    ("account", "slurm_account"),
    ("partition", "slurm_partition"),
)


class JobFileError(GpuAuditError, ValueError):
    """A job-mapping file that does not follow the format; the message names the problem."""


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One job from one file."""

    name: str  # the file name, for logs and tie-breaks
    fields: Mapping[str, str]  # identity field -> cleaned value
    gpus: frozenset[str]
    pids: frozenset[int]
    start_time: float | None
    end_time: float | None

    def active(self, now: float) -> bool:
        """A job that has ended no longer claims its GPUs or pids."""
        return self.end_time is None or self.end_time > now


def _number(doc: Mapping[str, Any], key: str) -> float | None:
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise JobFileError(f"{key!r} must be a number (unix seconds) or null")
    return float(value)


def parse_job_file(name: str, data: bytes, max_length: int) -> JobRecord:
    """Validate and convert one file's bytes; JobFileError names every problem found."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise JobFileError(f"not valid JSON ({exc.msg} at byte {exc.pos})") from None
    if not isinstance(doc, dict):
        raise JobFileError("the top level must be a JSON object")
    problems: list[str] = []
    version = doc.get("version")
    if version not in SUPPORTED_VERSIONS:
        problems.append(f"'version' must be one of {sorted(SUPPORTED_VERSIONS)}, got {version!r}")
    fields: dict[str, str] = {}
    for key, field_name in _STRING_FIELDS:
        value = doc.get(key)
        if value is None:
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)  # Slurm job ids are often written as numbers
        if not isinstance(value, str):
            problems.append(f"{key!r} must be a string")
            continue
        text = clean_text(value, max_length)
        if text:
            fields[field_name] = text
    if "job" not in fields:
        problems.append("'job_id' is required and must be a non-empty string")
    if "project" not in fields and "slurm_account" in fields:
        fields["project"] = fields["slurm_account"]
    gpus_raw = doc.get("gpus", [])
    if not isinstance(gpus_raw, list) or not all(isinstance(g, str) for g in gpus_raw):
        problems.append("'gpus' must be a list of GPU UUID strings")
        gpus_raw = []
    pids_raw = doc.get("pids", [])
    if not isinstance(pids_raw, list) or not all(
        isinstance(p, int) and not isinstance(p, bool) and p > 0 for p in pids_raw
    ):
        problems.append("'pids' must be a list of positive integers")
        pids_raw = []
    start = end = None
    try:
        start = _number(doc, "start_time")
    except JobFileError as exc:
        problems.append(str(exc))
    try:
        end = _number(doc, "end_time")
    except JobFileError as exc:
        problems.append(str(exc))
    if not gpus_raw and not pids_raw and not problems:
        problems.append("a job must list at least one of 'gpus' or 'pids'")
    if problems:
        raise JobFileError("; ".join(problems))
    return JobRecord(
        name=name,
        fields=fields,
        gpus=frozenset(g.strip() for g in gpus_raw),
        pids=frozenset(pids_raw),
        start_time=start,
        end_time=end,
    )


_Signature = tuple[int, int, int]  # (st_ino, st_size, st_mtime_ns)


class JobMap:
    """The parsed contents of the job-mapping directory, kept fresh by refresh()."""

    def __init__(
        self,
        directory: Path,
        *,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        max_value_length: int = 128,
        wall_clock: Callable[[], float],
    ) -> None:
        self._dir = str(directory)
        self._max_file_bytes = max_file_bytes
        self._max_value_length = max_value_length
        self._wall_clock = wall_clock
        self._dir_sig: _Signature | None = None
        self._names: list[str] = []
        self._files: dict[str, tuple[_Signature, JobRecord | None]] = {}
        self._by_pid: dict[int, list[JobRecord]] = {}
        self._by_gpu: dict[str, list[JobRecord]] = {}
        self._next_expiry: float | None = None
        self._logged_dir_error: int | None = None
        # Bumped whenever the set of records changes; resolvers key memoised answers on it.
        self.generation = 0
        self.errors = 0
        self.reloads = 0

    def refresh(self) -> None:
        """Stat the directory and its files; parse only what changed. Never raises."""
        try:
            st = os.stat(self._dir)
        except OSError as exc:
            if exc.errno != self._logged_dir_error:
                self._logged_dir_error = exc.errno
                # A missing directory is the normal state on a node without a launcher.
                level = logging.DEBUG if exc.errno == errno.ENOENT else logging.WARNING
                log.log(level, "job-mapping directory %s unreadable (errno %s)", self._dir,
                        errno.errorcode.get(exc.errno or 0, exc.errno))
            if self._files:
                self._files.clear()
                self._names = []
                self._rebuild()
            self._dir_sig = None
            return
        self._logged_dir_error = None
        dir_sig = (st.st_ino, st.st_size, st.st_mtime_ns)
        if dir_sig != self._dir_sig:
            self._dir_sig = dir_sig
            self._names = self._list()
        changed = False
        seen: set[str] = set()
        for name in self._names:
            seen.add(name)
            changed |= self._check_file(name)
        for gone in set(self._files) - seen:
            del self._files[gone]
            changed = True
        if changed or (
            self._next_expiry is not None and self._wall_clock() >= self._next_expiry
        ):
            # A job whose end_time passed stops claiming its GPUs: a new generation makes
            # memoised answers that named it go stale.
            self._rebuild()

    def _list(self) -> list[str]:
        try:
            names = os.listdir(self._dir)
        except OSError as exc:
            log.warning("cannot list job-mapping directory %s (errno %s)", self._dir,
                        errno.errorcode.get(exc.errno or 0, exc.errno))
            return []
        # Writers create "<job>.json.tmp" or ".<job>.json" and rename into place, so only
        # complete "*.json" files are read.
        return sorted(n for n in names if n.endswith(".json") and not n.startswith("."))

    def _check_file(self, name: str) -> bool:
        path = os.path.join(self._dir, name)
        try:
            st = os.stat(path)
        except OSError:
            # Removed between listing and stat: the next listing drops it.
            return self._files.pop(name, None) is not None
        sig = (st.st_ino, st.st_size, st.st_mtime_ns)
        old = self._files.get(name)
        if old is not None and old[0] == sig:
            return False
        record = self._load(name, path, st)
        self._files[name] = (sig, record)
        self.reloads += 1
        return True

    def _load(self, name: str, path: str, st: os.stat_result) -> JobRecord | None:
        try:
            if not stat.S_ISREG(st.st_mode):
                raise JobFileError("not a regular file")
            if st.st_size > self._max_file_bytes:
                raise JobFileError(f"larger than the {self._max_file_bytes}-byte limit")
            with open(path, "rb") as fh:
                data = fh.read(self._max_file_bytes + 1)
            if len(data) > self._max_file_bytes:
                raise JobFileError(f"larger than the {self._max_file_bytes}-byte limit")
            return parse_job_file(name, data, self._max_value_length)
        except JobFileError as exc:
            self.errors += 1
            log.warning("job-mapping file %s skipped: %s", path, exc)
        except OSError as exc:
            self.errors += 1
            log.warning("job-mapping file %s unreadable (errno %s)", path,
                        errno.errorcode.get(exc.errno or 0, exc.errno))
        return None

    def _rebuild(self) -> None:
        by_pid: dict[int, list[JobRecord]] = {}
        by_gpu: dict[str, list[JobRecord]] = {}
        for _, record in self._files.values():
            if record is None:
                continue
            for pid in record.pids:
                by_pid.setdefault(pid, []).append(record)
            for gpu in record.gpus:
                by_gpu.setdefault(gpu, []).append(record)
        now = self._wall_clock()
        future_ends = [
            r.end_time
            for _, r in self._files.values()
            if r is not None and r.end_time is not None and r.end_time > now
        ]
        self._next_expiry = min(future_ends) if future_ends else None
        self._by_pid = by_pid
        self._by_gpu = by_gpu
        self.generation += 1

    def _single_live(self, records: list[JobRecord] | None) -> tuple[JobRecord | None, bool]:
        if not records:
            return None, False
        now = self._wall_clock()
        live = [r for r in records if r.active(now)]
        if len(live) == 1:
            return live[0], False
        return None, len(live) > 1

    def lookup(self, pid: int, gpu_uuids: tuple[str, ...]) -> tuple[JobRecord | None, bool]:
        """The job of `pid`, else the job holding the first of `gpu_uuids` that one holds.

        Returns (record, ambiguous): when several live jobs claim the same pid or GPU, no
        answer is better than a wrong one, and ambiguous is True.
        """
        record, ambiguous = self._single_live(self._by_pid.get(pid))
        if record is not None or ambiguous:
            return record, ambiguous
        for uuid in gpu_uuids:
            record, ambiguous = self._single_live(self._by_gpu.get(uuid))
            if record is not None or ambiguous:
                return record, ambiguous
        return None, False
