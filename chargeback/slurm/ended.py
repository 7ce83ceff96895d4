"""The Slurm run that just ended on a node, as `gpu-audit slurm epilog` accounts for it:
when it ran as Slurm recorded it (slurmctld while its job record still describes the
run, else slurmdbd's record of a requeued job's run), which attempt it was, when the
exporter's trail covers its end, and what it did on its GPUs by that trail.

The epilog's wiring (Slurm's environment, the prolog's file, the configuration, the
report and record it writes) is the app layer's (gpu_audit_app/slurm/epilog.py); this
module takes plain values. It runs Slurm's commands (scontrol, sacct) through
gpu_audit.slurmcmd and reads the trail, and must never write anything nor print.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from chargeback.slurm.trail import Trails
from chargeback.slurm.usage import UsageMeter, slurm_job_of
from chargeback.software import SoftwareUsage
from gpu_audit import slurmcmd
from gpu_audit.spool import SpoolReader

# Slurm's start of a run and the prolog's `date +%s` are this close (PrologFlags=Alloc
# runs the prolog at allocation; without it, at the first step's launch)
RUN_MATCH_S = 120.0
# ...and closer for picking this run among a requeued job's earlier ones in sacct: a
# requeued job starts again at least cred_expire (5 s at the least) after a run ended
DBD_MATCH_S = 4.0
DBD_TRIES = 10
# JobState values of a record that no longer describes the run that just ended
_NEXT_RUN_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
                              "CONFIGURING", "RUNNING", "RESIZING", "SUSPENDED"})


@dataclass(frozen=True, slots=True)
class RunTimes:
    """What Slurm says of the run that just ended on this node."""

    times: tuple[float, float] | None  # (StartTime, EndTime); None: not known
    requeued: bool  # slurmctld's record already describes the job's next run
    restarts: int | None  # the record's Restarts


def slurm_times(job_id: str, prolog_start: float | None,
                warn: Callable[[str], None] = lambda _: None) -> RunTimes:
    """This run's StartTime and EndTime as Slurm recorded them: from slurmctld while its
    job record still describes this run, else (the job was requeued and the record
    describes the next run) from slurmdbd's record of the run; None when neither
    answers (the caller falls back to the node's clock). `warn` hears why slurmctld did
    not answer."""
    try:
        info = slurmcmd.key_values(slurmcmd.run("scontrol", ["-o", "show", "job", job_id],
                                                timeout=15))
    except slurmcmd.SlurmCommandError as exc:
        warn(f"job {job_id}: {exc}")
        info = {}
    state = info.get("JobState", "")
    start = slurmcmd.parse_time(info.get("StartTime", ""))
    end = slurmcmd.parse_time(info.get("EndTime", ""))
    restarts = int(info["Restarts"]) if info.get("Restarts", "").isdigit() else None
    if (state and state not in _NEXT_RUN_STATES and start is not None and end is not None
            and end >= start
            and (prolog_start is None or abs(start - prolog_start) <= RUN_MATCH_S)):
        return RunTimes((start, end), False, restarts)
    times = _accounted_run(job_id, prolog_start) if prolog_start is not None else None
    return RunTimes(times, state in _NEXT_RUN_STATES, restarts)


def _accounted_run(job_id: str, prolog_start: float) -> tuple[float, float] | None:
    """The ended run of a requeued job that started with the prolog, from sacct (slurmctld
    sends it to slurmdbd when it requeues the job; a moment may pass)."""
    for attempt in range(DBD_TRIES):
        try:
            rows = slurmcmd.parsable(slurmcmd.run("sacct", [
                "-j", job_id, "-X", "-D", "-n", "-P", "-o", "Start,End"], timeout=15),
                ("Start", "End"))
        except slurmcmd.SlurmCommandError:
            return None  # no accounting: the node's clock
        ended = []
        for r in rows:
            start, end = slurmcmd.parse_time(r["Start"]), slurmcmd.parse_time(r["End"])
            if (start is not None and end is not None and end >= start
                    and abs(start - prolog_start) <= DBD_MATCH_S):
                ended.append((abs(start - prolog_start), start, end))
        if ended:
            _, start, end = min(ended)  # the run this prolog started
            return start, end
        if attempt + 1 < DBD_TRIES:
            time.sleep(0.5)
    return None


def attempt_of(restart_count: Any, run: RunTimes, env_count: str) -> int:
    """The run's number, as the prolog saw it (`restart_count` of its file): by the
    epilog a requeued job's record (and the environment slurmd gives the epilog,
    `env_count` = SLURM_JOB_RESTART_COUNT) already counts the restart after this run."""
    if isinstance(restart_count, int) and not isinstance(restart_count, bool) \
            and restart_count >= 0:
        return restart_count
    restarts = run.restarts if run.restarts is not None else (
        int(env_count) if env_count.isdigit() else 0)
    return max(restarts - 1, 0) if run.requeued else restarts


def trail_covers(end: float, audit_interval: float) -> float:
    """When the record that accounts for `end` is due: the exporter writes usage at the
    first sample past each multiple of audit.interval_seconds (UTC-aligned; every
    sample in the per-cycle trail), so the run's last interval is written up to one
    audit interval after it ended."""
    return math.ceil(end / audit_interval) * audit_interval


def wait_for_trail(spool_dir: Path, end: float, audit_interval: float,
                   sample_interval: float, *, limit: float | None = None,
                   clock: Any = time.time, sleep: Any = time.sleep) -> bool:
    """Wait until the exporter's spool (`spool_dir`) holds a usage (or per-cycle `gpu`)
    record dated at or after the interval boundary past `end` (trail_covers), or an
    exporter_stop after `end` (it writes the interval so far); at most until three
    samples (`sample_interval`) past the boundary.
    `limit` bounds the wait in seconds from now. False
    when it did not come (exporter down, or the record already shipped and its segment
    gone): the run's last interval may then be missing from the report."""
    due = trail_covers(end, audit_interval)
    deadline = due + 3 * sample_interval + 2.0
    if limit is not None:
        deadline = min(deadline, clock() + max(limit, 0.0))
    due_ns, end_ns = int(due * 1e9), int(end * 1e9)
    offset = 0
    while True:
        try:
            with SpoolReader(spool_dir) as reader:
                while True:
                    got = reader.read(offset, 4096)
                    for _off, raw in got.entries:
                        if _closes(raw, due_ns, end_ns):
                            return True
                    if got.next_offset == offset:
                        break
                    offset = got.next_offset
        except OSError:
            pass  # no spool (yet): the deadline decides
        if clock() >= deadline:
            return False
        sleep(min(0.5, max(deadline - clock(), 0.0)))


def _closes(raw: bytes, due_ns: int, end_ns: int) -> bool:
    try:
        rec = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(rec, dict) or not isinstance(rec.get("time_ns"), int):
        return False
    kind = rec.get("kind")
    if kind in ("usage", "gpu"):
        return bool(rec["time_ns"] >= due_ns)
    return kind == "exporter_stop" and rec["time_ns"] >= end_ns


def measure_run(dirs: Sequence[Path], key: bytes | None, job_id: str, *, start: float,
                end: float, audit_interval: float, sample_interval: float
                ) -> tuple[UsageMeter, list[str], SoftwareUsage]:
    """The job's usage on this node from the exporter's trail (`dirs`: its archive, then
    its spool; `key` the audit HMAC key), the trail's problems, and what the GPU
    processes ran (their process_start records)."""
    dirs = [d for d in dirs if d.is_dir()]
    # a record covers the interval before it: the run's last one is dated at the first
    # sample past the audit interval's boundary after the end (a little slack for jitter)
    due = trail_covers(end, audit_interval)
    start_ns = int(start * 1e9)
    end_ns = int((due + 2 * sample_interval + 2) * 1e9)
    meter = UsageMeter(start_ns=start_ns, end_ns=end_ns,
                       key=lambda r: job_id if slurm_job_of(r) == job_id else None)
    software = SoftwareUsage(include_simulated=True)
    trails = Trails(dirs, key=key, start_ns=start_ns, end_ns=end_ns)
    for rec in trails:
        meter.add(rec)
        if rec.get("event") == "process_start" and slurm_job_of(rec) == job_id:
            software.add(rec)
    return meter, trails.problems, software

