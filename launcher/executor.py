"""Runs job attempts as real processes: one process group per attempt, as the submitting user.

`ProcessExecutor` is the engine's `Executor`. Each attempt gets its own session (so
`kill_group` reaches every process the job forked), its stdout/stderr in
`<state>/logs/<job>/<attempt>.out|.err`, and an events file
(`GPU_AUDIT_EVENTS_FILE`) that the job-side helper (gpu_audit_ckpt) appends JSON lines
to: checkpoint commits, metrics, anomalies, preemption acknowledgements. `poll()` reaps
exited attempts without blocking and reports, per exit, the code, an out-of-memory hint
and the newest committed checkpoint the events file names. The files are made and read
by launcher.jobfiles (directory descriptors, O_NOFOLLOW, fstat checks): every one of
them is written by the job's user, so every one is read as hostile.

Identity: a daemon that may switch users (root, or a dedicated account holding
CAP_SETUID and CAP_SETGID) starts the job with the submitter's uid, primary gid and
supplementary groups; the wrapper shell then enters the job's directory as that user
(the kernel checks it), and execve leaves the job no capability. A job is never run as
uid 0 unless `allow_root_jobs` is set. A daemon that may not switch users can only run
jobs as itself and refuses the others' (it must not pretend to).

This module must never wait for a process (no blocking waitpid, fingerprint probes run
in the background), never send a signal to a process group it did not create, and never
read a job's log or events file past the bytes that were there when it looked.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gpu_audit.errors import GpuAuditError
from launcher import procfs
from launcher.audit import fingerprint_from
from launcher.engine import Exit, Report
from launcher.gpustate import GpuInfo
from launcher.jobfiles import (
    MAX_EVENT_LINE,
    JobFiles,
    LineSplitter,
    checkpoint_of,
    event_step,
    event_time,
)
from launcher.privileges import can_switch_users, lowered
from launcher.probe import Probes
from launcher.safefs import RefusedFile
from launcher.spec import JobSpec

log = logging.getLogger(__name__)

# The job runs under a small sh that enters the job's directory as the job's user and
# records its exit status in a file (so a daemon restarted while the job ran still
# learns how it ended). Its traps are no-op handlers, which exec resets to the default
# for the job itself: the preemption signal reaches the job unchanged, and the shell
# outlives it long enough to write the status.
_TRAPPED = ("USR1", "USR2", "TERM", "INT", "HUP")
EXIT_NO_CWD = 126  # the job's directory could not be entered (as the job's user)


def _wrapper(preempt_signal: str | None) -> str:
    """The shell script around the job; it also traps the job's own preemption signal (a
    shell killed by it would be reported as the job's end while the job still commits)."""
    names = list(_TRAPPED)
    extra = (preempt_signal or "").upper().removeprefix("SIG")
    if extra and extra.isalnum() and extra not in names:
        names.append(extra)
    return (f'trap : {" ".join(names)}; '
            f'cd -- "$1" || {{ printf {EXIT_NO_CWD} > "$GPU_AUDIT_EXIT_FILE"; '
            f'exit {EXIT_NO_CWD}; }}; shift; '
            '"$@"; rc=$?; printf %s "$rc" > "$GPU_AUDIT_EXIT_FILE"; exit "$rc"')


_OOM_TEXT = (b"CUDA out of memory", b"OutOfMemoryError", b"CUBLAS_STATUS_ALLOC_FAILED")
_STDERR_TAIL_BYTES = 16 * 1024
_EVENTS_READ_LIMIT = 1024 * 1024


@dataclass(frozen=True, slots=True)
class EventsBudget:
    """What the daemon reads of one job's events file per window (DaemonLimits)."""

    window_seconds: float = 10.0
    max_bytes: int = 256 * 1024
    max_lines: int = 2000


class ExecutorError(GpuAuditError):
    """An attempt could not be started; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One line of a job's events file (decoded), with the attempt it came from."""

    job_id: int
    attempt: int
    doc: Mapping[str, Any]


@dataclass(slots=True)
class _Attempt:
    job_id: int
    attempt: int
    proc: subprocess.Popen[bytes] | None  # None: adopted after a daemon restart
    pgid: int
    uid: int
    started: float
    events_offset: int = 0
    lines: LineSplitter = field(default_factory=LineSplitter)
    refused: bool = False  # its events file was not the one we made (logged once)
    last_checkpoint_time: float | None = None
    last_checkpoint_step: int | None = None
    preempt_acked: float | None = None
    pids: set[int] = field(default_factory=set)
    oom_kills_at_start: int | None = None
    # the events budget (DaemonLimits.events_*): what this window has taken so far
    window_end: float = 0.0
    window_bytes: int = 0
    window_lines: int = 0
    over: bool = False  # the budget ran out in this window: the backlog is skipped
    dropped_from: int | None = None  # where lines read but past the budget begin


class ProcessExecutor:
    """Starts, signals, kills and reaps job attempts as process groups."""

    def __init__(
        self,
        state_dir: Path,
        *,
        allow_root_jobs: bool = False,
        clock: Callable[[], float] = time.time,
        extra_env: Mapping[str, str] | None = None,
        job_umask: int = 0o022,
        switch_users: bool | None = None,
        events: EventsBudget | None = None,
    ) -> None:
        self._files = JobFiles(Path(state_dir) / "logs")
        self._allow_root = allow_root_jobs
        self._clock = clock
        self._extra_env = dict(extra_env or {})
        self._umask = job_umask
        self._switch = can_switch_users() if switch_users is None else switch_users
        self._running: dict[int, _Attempt] = {}
        self._events: list[JobEvent] = []
        self._reports: list[Report] = []
        self._ended_pids: dict[int, set[int]] = {}
        self._injected: list[Exit] = []
        self._probes = Probes()
        self._probe_env: dict[int, dict[str, str]] = {}
        self._budget = events or EventsBudget()

    @property
    def allow_root_jobs(self) -> bool:
        return self._allow_root

    def close(self) -> None:
        self._probes.close()
        self._files.close()

    # --- paths (for the job's environment and messages) ---------------------------------

    def log_paths(self, job_id: int, attempt: int) -> tuple[Path, Path]:
        return (self._files.path(job_id, attempt, "out"),
                self._files.path(job_id, attempt, "err"))

    def events_path(self, job_id: int, attempt: int) -> Path:
        return self._files.path(job_id, attempt, "events.jsonl")

    def read_log(self, job_id: int, attempt: int, stream: str, *, owner: int, offset: int,
                 size: int) -> bytes:
        """Up to `size` bytes of the attempt's stdout (`out`) or stderr (`err`) at
        `offset`; b"" when there is none. RefusedFile when the file is not the one the
        daemon made for `owner` (a link, a FIFO, another owner...)."""
        got = self._files.read(job_id, attempt, stream, owner=owner, offset=offset,
                               size=size)
        return got[0] if got is not None else b""

    # --- identity ------------------------------------------------------------------------

    def _identity(self, uid: int) -> tuple[int, list[int], str, str]:
        """(gid, groups, user name, home) of `uid`, the submitter (from the socket's peer
        credentials, via the engine); refuses root and identities we cannot take."""
        if uid == 0 and not self._allow_root:
            raise ExecutorError(
                "refusing to run a job as root (uid 0): submit it as an ordinary user, or set "
                "allow_root_jobs: true if this node really needs root jobs"
            )
        try:
            pw = pwd.getpwuid(uid)
        except KeyError:
            raise ExecutorError(f"uid {uid} has no passwd entry on this node") from None
        if uid != os.geteuid() and not self._switch:
            raise ExecutorError(
                f"the launcher runs as uid {os.geteuid()} without CAP_SETUID and CAP_SETGID "
                f"and cannot run a job as uid {uid}; run the daemon as root or give it those "
                "capabilities (docs/LAUNCHER.md, least privilege)"
            )
        groups = os.getgrouplist(pw.pw_name, pw.pw_gid) if self._switch else []
        return pw.pw_gid, groups, pw.pw_name, pw.pw_dir

    # --- Executor protocol ---------------------------------------------------------------

    def start(  # noqa: PLR0917 - the engine's Executor protocol
        self,
        job_id: int,
        attempt: int,
        spec: JobSpec,
        gpus: list[GpuInfo],
        env: dict[str, str],
        uid: int,
    ) -> None:
        """Start one attempt as `uid` in a new session. Raises ExecutorError."""
        if job_id in self._running:
            raise ExecutorError(f"job {job_id} already has a running attempt")
        gid, groups, user, home = self._identity(uid)
        argv = spec.argv if isinstance(spec.command, list) else \
            ["/bin/sh", "-c", spec.command]
        if not argv:
            raise ExecutorError(f"job {job_id} has no command")
        cwd = spec.cwd or home or "/"
        try:
            files = self._files.create_attempt(job_id, attempt, uid)
        except (OSError, RefusedFile) as exc:
            raise ExecutorError(f"job {job_id}: cannot create its files: {exc}") from None
        full_env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": home,
            "LANG": os.environ.get("LANG", "C.UTF-8"),
        }
        full_env.update(self._extra_env)
        full_env.update(env)
        full_env["USER"] = full_env["LOGNAME"] = user
        full_env["GPU_AUDIT_EVENTS_FILE"] = str(files.events)
        full_env["GPU_AUDIT_EXIT_FILE"] = str(files.exit)
        kw: dict[str, Any] = {"user": uid, "group": gid, "extra_groups": groups} \
            if self._switch else {}
        try:
            # cwd "/" here: the job's own directory is entered by the wrapper, as the
            # user (Popen's cwd= would chdir as root, before the identity changes)
            proc = subprocess.Popen(
                ["/bin/sh", "-c", _wrapper(spec.preempt_signal), "gpu-audit-job",
                 str(cwd), *lowered(argv)],
                cwd="/", env=full_env, stdin=subprocess.DEVNULL, stdout=files.stdout,
                stderr=files.stderr, start_new_session=True, close_fds=True,
                umask=self._umask, **kw,
            )
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else str(exc)
            raise ExecutorError(f"job {job_id} could not start: {reason}") from None
        finally:
            files.close()
        # pid and start time, so a restarted daemon can find (and trust) the group again
        try:
            self._files.write_pid(job_id, attempt, proc.pid, procfs.start_ticks(proc.pid))
        except (OSError, RefusedFile) as exc:
            log.warning("job %d: cannot record its pid (%s): a restart will requeue it",
                        job_id, exc)
        self._probe_env[job_id] = full_env
        self._probes.start(job_id, argv, uid=uid, gid=gid, groups=groups, env=full_env,
                           switch=self._switch)
        self._running[job_id] = _Attempt(
            job_id=job_id, attempt=attempt, proc=proc, pgid=proc.pid, uid=uid,
            started=self._clock(), pids={proc.pid},
            oom_kills_at_start=procfs.cgroup_oom_kills(proc.pid),
        )
        log.info("job %s attempt %d started: pid %d as uid %d on %d GPU(s)", job_id, attempt,
                 proc.pid, uid, len(gpus))

    def fingerprint_pending(self, job_id: int) -> bool:
        """Is the job's interpreter still being asked for its versions?"""
        self._probes.poll()
        return self._probes.pending(job_id)

    def fingerprint(self, job_id: int) -> dict[str, str]:
        """The environment fingerprint of the job's newest attempt started by this daemon
        (what is known so far: ask again once fingerprint_pending is False)."""
        env = self._probe_env.get(job_id)
        if env is None:
            return {}
        return fingerprint_from(self._probes.answer(job_id), env)

    def adopt(self, job_id: int, attempt: int, uid: int) -> bool:
        """Take over an attempt a previous daemon started, if its process group still runs
        (same leader pid and start time); False when it is gone."""
        recorded = self._files.read_pid(job_id, attempt)
        if recorded is None:
            return False
        pid, ticks = recorded
        if procfs.start_ticks(pid) != ticks or not self.group_alive(pid):
            return False
        a = _Attempt(job_id=job_id, attempt=attempt, proc=None, pgid=pid, uid=uid,
                     started=self._clock(), pids={pid})
        self._skip_old_events(a)
        self._running[job_id] = a
        log.info("job %s attempt %d adopted: process group %d still runs", job_id, attempt, pid)
        return True

    def finished_while_away(self, job_id: int, attempt: int, uid: int) -> Exit | None:
        """How an attempt that ended while no daemon ran ended, from its exit-status file
        (None: it left none, i.e. it was killed)."""
        status = self._files.read_exit(job_id, attempt, owner=uid)
        if status is None:
            return None
        code, when = status
        t, step = self._files.newest_checkpoint(job_id, attempt, owner=uid)
        return Exit(job_id=job_id, code=code, time=min(when, self._clock()), oom=False,
                    last_checkpoint_time=t, last_checkpoint_step=step)

    def inject_exit(self, exit_: Exit) -> None:
        """Report `exit_` at the next poll (an attempt that ended while no daemon ran)."""
        self._injected.append(exit_)

    def signal(self, job_id: int, signum: int) -> None:
        """Send `signum` to the attempt's whole process group (nothing when none runs)."""
        a = self._running.get(job_id)
        if a is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(a.pgid, signum)

    def kill_group(self, job_id: int) -> None:
        """SIGKILL the attempt's process group (the leader may be gone, members not)."""
        self.signal(job_id, signal.SIGKILL)

    def pids(self, job_id: int) -> set[int]:
        a = self._running.get(job_id)
        if a is not None:
            return set(a.pids)
        # an ended job's processes that are still alive: a GPU state read before they
        # were gone (the exporter samples every few seconds) must not make a dead pid a leak
        return {pid for pid in self._ended_pids.get(job_id, ()) if procfs.alive(pid)}

    def pid_of(self, job_id: int) -> int | None:
        a = self._running.get(job_id)
        return a.pgid if a is not None else None

    def running(self) -> list[int]:
        return list(self._running)

    def group_alive(self, pgid: int) -> bool:
        """Any live (not zombie) process still in process group `pgid`? A zombie is dead:
        an orphaned job's leader stays one where nothing reaps it (no init in a container)."""
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return bool(procfs.group_members({pgid}).get(pgid))

    def reports(self) -> list[Report]:
        """What the jobs reported (checkpoints, telemetry, anomalies) since the last call."""
        for a in self._running.values():
            self._tail_events(a)
        out, self._reports = self._reports, []
        return coalesce(out)

    def poll(self) -> list[Exit]:
        """Reap every attempt that ended (never blocks)."""
        self._probes.poll()
        exits, self._injected = self._injected, []
        members = procfs.group_members({a.pgid for a in self._running.values()})
        for job_id, a in list(self._running.items()):
            a.pids |= members.get(a.pgid, set())
            self._tail_events(a)
            if a.proc is not None:
                code = a.proc.poll()
                if code is None:
                    continue
                if code < 0:
                    code = 128 - code  # killed by a signal: the shell's convention
            else:
                if self.group_alive(a.pgid):
                    continue
                done = self.finished_while_away(job_id, a.attempt, a.uid)
                code = done.code if done is not None else 128 + signal.SIGKILL
            self._tail_events(a)
            if a.over:
                self._skip_backlog(a)  # its newest checkpoint may be in what it skipped
            # the leader is gone; what it left in its group is killed now (the engine's
            # release barrier checks the GPUs on top of this)
            if self.group_alive(a.pgid):
                log.warning("job %s: processes left in group %d after exit; killing them",
                            job_id, a.pgid)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(a.pgid, signal.SIGKILL)
            del self._running[job_id]
            self._ended_pids[job_id] = a.pids
            exits.append(Exit(
                job_id=job_id, code=code, time=self._exit_time(a), oom=self._oom_hint(a, code),
                last_checkpoint_time=a.last_checkpoint_time,
                last_checkpoint_step=a.last_checkpoint_step,
            ))
        return exits

    def drain_events(self) -> list[JobEvent]:
        """Raw event lines read since the last call (for telemetry)."""
        out, self._events = self._events, []
        return out

    # --- internals -----------------------------------------------------------------------

    def _exit_time(self, a: _Attempt) -> float:
        """When the job ended: the wrapper writes its exit status the moment the job exits,
        so that file's mtime beats the time of this poll (up to a tick later)."""
        status = self._files.read_exit(a.job_id, a.attempt, owner=a.uid)
        now = self._clock()
        if status is None:
            return now
        when = status[1]
        return when if a.started <= when <= now else now

    def _oom_hint(self, a: _Attempt, code: int) -> bool:
        if code == 128 + signal.SIGKILL:
            # the kernel's OOM killer: the job's cgroup counted a kill since it started
            kills = procfs.cgroup_oom_kills(a.pgid) or procfs.cgroup_oom_kills(os.getpid())
            if kills is not None and a.oom_kills_at_start is not None \
                    and kills > a.oom_kills_at_start:
                return True
        tail = self._files.tail(a.job_id, a.attempt, "err", owner=a.uid,
                                size=_STDERR_TAIL_BYTES)
        return any(t in tail for t in _OOM_TEXT)

    def _skip_old_events(self, a: _Attempt) -> None:
        """An adopted attempt's events before now were reported to the previous daemon;
        only its newest checkpoint is taken from them."""
        a.last_checkpoint_time, a.last_checkpoint_step = self._files.newest_checkpoint(
            a.job_id, a.attempt, owner=a.uid)
        with contextlib.suppress(OSError, RefusedFile):
            got = self._files.read(a.job_id, a.attempt, "events.jsonl", owner=a.uid,
                                   offset=0, size=0)
            if got is not None:
                a.events_offset = got[1].st_size

    def _tail_events(self, a: _Attempt) -> None:
        """Read what the job appended to its events file, within its budget: at most
        `max_bytes` and `max_lines` per window, never more than what is left of it in one
        read. A job that writes more has the rest skipped when the next window opens (the
        newest checkpoint in the skipped part still counts), is named in the log and gets
        an `events_over_budget` report: it cannot make the daemon read, parse or store
        more than the budget, however fast it writes."""
        b = self._budget
        now = time.monotonic()
        if now >= a.window_end:
            if a.over:
                self._skip_backlog(a)
            a.window_end, a.window_bytes, a.window_lines, a.over = \
                now + b.window_seconds, 0, 0, False
        left = b.max_bytes - a.window_bytes
        if a.over or left <= 0:
            a.over = True
            return
        try:
            got = self._files.read(a.job_id, a.attempt, "events.jsonl", owner=a.uid,
                                   offset=a.events_offset, size=min(left, _EVENTS_READ_LIMIT))
        except RefusedFile as exc:
            if not a.refused:
                log.warning("job %s: its events file is refused (%s); its reports are "
                            "ignored", a.job_id, exc)
                a.refused = True
            return
        except OSError as exc:
            log.warning("job %s: events file unreadable (errno %s)", a.job_id, exc.errno)
            return
        if not got or not got[0]:
            return
        data = got[0]
        read_from = a.events_offset
        a.events_offset += len(data)
        a.window_bytes += len(data)
        if a.window_bytes >= b.max_bytes and got[1].st_size > a.events_offset:
            a.over = True
        for line in a.lines.feed(data):
            if a.window_lines >= b.max_lines:
                a.over = True
                a.dropped_from = read_from  # scanned for a checkpoint when skipping
                break  # the rest of this read is dropped (it is past the budget)
            a.window_lines += 1
            try:
                doc = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue  # the job owns this file; a bad line is its problem, not ours
            if not isinstance(doc, dict):
                continue
            self._note(a, doc)
            self._events.append(JobEvent(a.job_id, a.attempt, doc))

    def _skip_backlog(self, a: _Attempt) -> None:
        """The job wrote past its budget: jump to the end of its events file, taking only
        the newest checkpoint from the last bytes skipped (one bounded read)."""
        try:
            got = self._files.read(a.job_id, a.attempt, "events.jsonl", owner=a.uid,
                                   offset=0, size=0)
        except (OSError, RefusedFile):
            return
        if got is None:
            return
        end = got[1].st_size
        skipped = max(0, end - a.events_offset)
        start = a.events_offset if a.dropped_from is None else a.dropped_from
        a.dropped_from = None
        tail_from = max(start, end - MAX_EVENT_LINE)
        with contextlib.suppress(OSError, RefusedFile):
            tail = self._files.read(a.job_id, a.attempt, "events.jsonl", owner=a.uid,
                                    offset=tail_from, size=end - tail_from)
            lines = tail[0].split(b"\n") if tail else []
            for line in reversed(lines[1:] if tail_from > start else lines):
                found = checkpoint_of(line)
                if found is not None:
                    t, step = found
                    when = min(t, self._clock()) if t is not None else self._clock()
                    if (when, step) != (a.last_checkpoint_time, a.last_checkpoint_step) and (
                            a.last_checkpoint_time is None
                            or when >= a.last_checkpoint_time):
                        a.last_checkpoint_time = when
                        if step is not None:
                            a.last_checkpoint_step = step
                        self._reports.append(Report(a.job_id, when, "checkpoint", {
                            "step": step, "skipped_over_budget": True}))
                    break
        a.events_offset = end
        a.lines = LineSplitter()
        b = self._budget
        log.warning("job %s (uid %d) wrote more to its events file than its budget (%d bytes "
                    "and %d lines per %g s; limits.events_max_bytes, events_max_lines): "
                    "%d bytes skipped", a.job_id, a.uid, b.max_bytes, b.max_lines,
                    b.window_seconds, skipped)
        self._reports.append(Report(a.job_id, self._clock(), "events_over_budget", {
            "attempt": a.attempt, "skipped_bytes": skipped, "max_bytes": b.max_bytes,
            "max_lines": b.max_lines, "window_seconds": b.window_seconds}))

    def _note(self, a: _Attempt, doc: Mapping[str, Any]) -> None:
        event = doc.get("event")
        now = self._clock()
        reported = event_time(doc.get("time"))
        when = min(reported, now) if reported is not None else now  # never in the future
        data = {k: v for k, v in doc.items() if k not in ("event", "time")}
        if event == "checkpoint_committed":
            a.last_checkpoint_time = when
            step = event_step(doc.get("step"))
            if step is not None:
                a.last_checkpoint_step = step
            self._reports.append(Report(a.job_id, when, "checkpoint", data))
        elif event == "metrics":
            self._reports.append(Report(a.job_id, when, "telemetry", data))
        elif event == "anomaly":
            self._reports.append(Report(a.job_id, when, "anomaly", data))
        elif event == "environment":
            self._reports.append(Report(a.job_id, when, "environment", data))
        elif event == "preempt_requested":
            a.preempt_acked = when


_MAX_ANOMALY_KINDS = 8  # distinct anomaly reasons kept per job per round; the rest counted


def coalesce(reports: list[Report]) -> list[Report]:
    """One round's reports, at most a few per job: the newest checkpoint (its `count`:
    how many commits it stands for), the newest telemetry and environment, and anomalies
    merged by reason (the latest of each, with its `count`; past eight reasons the rest
    are one anomaly `other`). A job committing a checkpoint per line thus costs one stored event per
    round, not one per line."""
    out: list[Report] = []
    latest: dict[tuple[int, str], tuple[Report, int]] = {}
    kinds: dict[int, int] = {}
    for rep in reports:
        if rep.kind == "anomaly":
            reason = rep.data.get("reason")
            key = f"anomaly:{reason}" if isinstance(reason, str) else "anomaly:"
            if (rep.job_id, key) not in latest:
                if kinds.get(rep.job_id, 0) >= _MAX_ANOMALY_KINDS:
                    key = "anomaly:\0other"
                else:
                    kinds[rep.job_id] = kinds.get(rep.job_id, 0) + 1
        elif rep.kind in ("checkpoint", "telemetry", "environment"):
            key = rep.kind
        else:
            out.append(rep)
            continue
        prev = latest.get((rep.job_id, key))
        n = prev[1] + 1 if prev is not None else 1
        keep = rep if prev is None or rep.time >= prev[0].time else prev[0]
        latest[(rep.job_id, key)] = (keep, n)
    for (_, key), (rep, n) in latest.items():
        data = dict(rep.data)
        if n > 1:
            data["count"] = n
        if key == "anomaly:\0other":
            data = {"reason": "other", "count": n}
        out.append(Report(rep.job_id, rep.time, rep.kind, data))
    out.sort(key=lambda rep: rep.time)
    return out
