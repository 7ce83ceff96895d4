"""Runs job attempts as real processes: one process group per attempt, as the submitting user.

`ProcessExecutor` is the engine's `Executor`. Each attempt gets its own session (so
`kill_group` reaches every process the job forked), its stdout/stderr in
`<state>/logs/<job>/<attempt>.out|.err`, and an events file
(`GPU_AUDIT_EVENTS_FILE`) that the job-side helper (gpu_audit_ckpt) appends JSON lines
to: checkpoint commits, metrics, anomalies, preemption acknowledgements. `poll()` reaps
exited attempts without blocking and reports, per exit, the code, an out-of-memory hint
and the newest committed checkpoint the events file names.

Identity: a daemon running as root drops to the submitter's uid, primary gid and
supplementary groups before exec; a job is never run as uid 0 unless
`allow_root_jobs` is set. A daemon that is not root can only run jobs as itself and
refuses jobs of other users (it cannot change identity, and must not pretend to).

This module must never wait for a process (no blocking waitpid), never send a signal to
a process group it did not create, and never read a job's log or events file past the
bytes that were there when it looked (it tails incrementally).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import pwd
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger(__name__)

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: the ckpt helper's "checkpointed, please requeue"
_OOM_TEXT = (b"CUDA out of memory", b"OutOfMemoryError", b"CUBLAS_STATUS_ALLOC_FAILED")
_STDERR_TAIL_BYTES = 16 * 1024
_EVENTS_READ_LIMIT = 1024 * 1024


class ExecutorError(Exception):
    """An attempt could not be started; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class Exit:
    """One attempt that ended: what `poll()` reports to the engine."""

    job_id: Any
    code: int  # exit status, or -signum when killed by a signal
    time: float
    oom: bool = False
    last_checkpoint_time: float | None = None
    last_checkpoint_step: int | None = None


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One line of a job's events file (decoded), with the attempt it came from."""

    job_id: Any
    attempt: int
    doc: Mapping[str, Any]


@dataclass(slots=True)
class _Attempt:
    job_id: Any
    attempt: int
    proc: subprocess.Popen[bytes]
    pgid: int
    uid: int
    started: float
    stdout: Path
    stderr: Path
    events: Path
    events_offset: int = 0
    events_partial: bytes = b""
    last_checkpoint_time: float | None = None
    last_checkpoint_step: int | None = None
    preempt_acked: float | None = None


def _spec_get(spec: Any, name: str, default: Any = None) -> Any:
    if isinstance(spec, Mapping):
        return spec.get(name, default)
    return getattr(spec, name, default)


def _cgroup_oom_kills(pid: int) -> int | None:
    """oom_kill count of the cgroup (v2) `pid` lived in, or None where not readable."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("0::"):
            events = Path("/sys/fs/cgroup") / line[3:].lstrip("/") / "memory.events"
            try:
                for ev in events.read_text().splitlines():
                    name, _, value = ev.partition(" ")
                    if name == "oom_kill":
                        return int(value)
            except (OSError, ValueError):
                return None
    return None


class ProcessExecutor:
    """Starts, signals, kills and reaps job attempts as process groups."""

    def __init__(
        self,
        state_dir: Path,
        *,
        allow_root_jobs: bool = False,
        clock: Callable[[], float] = time.time,
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        self._state = Path(state_dir)
        self._logs = self._state / "logs"
        self._logs.mkdir(parents=True, exist_ok=True)
        self._allow_root = allow_root_jobs
        self._clock = clock
        self._extra_env = dict(extra_env or {})
        self._running: dict[Any, _Attempt] = {}
        self._events: list[JobEvent] = []
        self._is_root = os.geteuid() == 0

    @property
    def allow_root_jobs(self) -> bool:
        return self._allow_root

    # --- paths ---------------------------------------------------------------------------

    def log_paths(self, job_id: Any, attempt: int) -> tuple[Path, Path]:
        d = self._logs / str(job_id)
        return d / f"{attempt}.out", d / f"{attempt}.err"

    def events_path(self, job_id: Any, attempt: int) -> Path:
        return self._logs / str(job_id) / f"{attempt}.events.jsonl"

    # --- identity ------------------------------------------------------------------------

    def _identity(
        self, spec: Any, env: Mapping[str, str]
    ) -> tuple[int, int, list[int], str, str]:
        """(uid, gid, groups, user name, home) the attempt runs as: the submitter, whom the
        engine names in the job's USER (taken from the socket's peer credentials)."""
        uid_raw = _spec_get(spec, "uid")
        if uid_raw is None:
            name = env.get("USER")
            if not name:
                raise ExecutorError("the job's environment names no USER to run as")
            try:
                uid_raw = pwd.getpwnam(name).pw_uid
            except KeyError:
                raise ExecutorError(f"user {name!r} has no passwd entry on this node") \
                    from None
        uid = int(uid_raw)
        if uid == 0 and not self._allow_root:
            raise ExecutorError(
                "refusing to run a job as root (uid 0): submit it as an ordinary user, or set "
                "launcher allow_root_jobs: true if this node really needs root jobs"
            )
        try:
            pw = pwd.getpwuid(uid)
        except KeyError:
            raise ExecutorError(f"uid {uid} has no passwd entry on this node") from None
        if uid != os.geteuid() and not self._is_root:
            raise ExecutorError(
                f"the launcher runs as uid {os.geteuid()} and cannot run a job as uid {uid}; "
                "run the daemon as root to serve several users"
            )
        groups = os.getgrouplist(pw.pw_name, pw.pw_gid) if self._is_root else []
        return uid, pw.pw_gid, groups, pw.pw_name, pw.pw_dir

    # --- Executor protocol ---------------------------------------------------------------

    def start(
        self,
        job_id: Any,
        attempt: int,
        spec: Any,
        gpus: Sequence[Any],
        env: Mapping[str, str],
    ) -> int:
        """Start one attempt; returns its pid (= process group id). Raises ExecutorError."""
        if job_id in self._running:
            raise ExecutorError(f"job {job_id} already has a running attempt")
        uid, gid, groups, user, home = self._identity(spec, env)
        out, err = self.log_paths(job_id, attempt)
        events = self.events_path(job_id, attempt)
        out.parent.mkdir(parents=True, exist_ok=True)
        command = _spec_get(spec, "command")
        argv: list[str]
        if isinstance(command, str):
            argv = ["/bin/sh", "-c", command]
        else:
            argv = [str(a) for a in (command or [])]
        if not argv:
            raise ExecutorError(f"job {job_id} has no command")
        cwd_raw = _spec_get(spec, "cwd") or home
        full_env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": home,
            "LOGNAME": user,
            "USER": user,
            "LANG": os.environ.get("LANG", "C.UTF-8"),
        }
        full_env.update(self._extra_env)
        full_env.update(env)
        full_env["USER"] = full_env["LOGNAME"] = user
        full_env["GPU_AUDIT_EVENTS_FILE"] = str(events)
        # Files the job writes are its own: created by the daemon, handed to the user.
        fds: list[int] = []
        try:
            for path in (out, err, events):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
                fds.append(fd)
                if self._is_root:
                    os.fchown(fd, uid, gid)
            if self._is_root:
                os.chown(out.parent, 0, gid)
                os.chmod(out.parent, 0o750)  # noqa: S103 - the job's group reads its logs
            popen_kw: dict[str, Any] = {}
            if self._is_root:
                popen_kw = {"user": uid, "group": gid, "extra_groups": groups}
            try:
                proc = subprocess.Popen(
                    argv,
                    cwd=str(cwd_raw),
                    env=full_env,
                    stdin=subprocess.DEVNULL,
                    stdout=fds[0],
                    stderr=fds[1],
                    start_new_session=True,
                    close_fds=True,
                    **popen_kw,
                )
            except OSError as exc:
                raise ExecutorError(
                    f"job {job_id} could not start {argv[0]!r}: {exc.strerror} "
                    f"(cwd {cwd_raw})"
                ) from None
        finally:
            for fd in fds:
                os.close(fd)
        self._running[job_id] = _Attempt(
            job_id=job_id, attempt=attempt, proc=proc, pgid=proc.pid, uid=uid,
            started=self._clock(), stdout=out, stderr=err, events=events,
        )
        log.info("job %s attempt %d started: pid %d as uid %d on %d GPU(s)", job_id, attempt,
                 proc.pid, uid, len(gpus))
        return proc.pid

    def signal(self, job_id: Any, signum: int) -> bool:
        """Send `signum` to the attempt's whole process group; False when none runs."""
        a = self._running.get(job_id)
        if a is None:
            return False
        try:
            os.killpg(a.pgid, signum)
        except ProcessLookupError:
            return False
        return True

    def kill_group(self, job_id: Any) -> bool:
        """SIGKILL the attempt's process group (the leader may be gone, members not)."""
        return self.signal(job_id, signal.SIGKILL)

    def pid_of(self, job_id: Any) -> int | None:
        a = self._running.get(job_id)
        return a.pgid if a is not None else None

    def running(self) -> list[Any]:
        return list(self._running)

    def group_alive(self, pgid: int) -> bool:
        """Any process still in process group `pgid` (leader reaped or not)?"""
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def poll(self) -> list[Exit]:
        """Reap every attempt that ended (never blocks) and tail events files."""
        exits: list[Exit] = []
        for job_id, a in list(self._running.items()):
            self._tail_events(a)
            code = a.proc.poll()
            if code is None:
                continue
            self._tail_events(a)
            # The leader is gone; anything it left in its group is killed now (the release
            # barrier checks GPU memory on top of this).
            if self.group_alive(a.pgid):
                log.warning("job %s: processes left in group %d after exit; killing them",
                            job_id, a.pgid)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(a.pgid, signal.SIGKILL)
            oom = self._oom_hint(a, code)
            del self._running[job_id]
            exits.append(Exit(
                job_id=job_id, code=code, time=self._clock(), oom=oom,
                last_checkpoint_time=a.last_checkpoint_time,
                last_checkpoint_step=a.last_checkpoint_step,
            ))
        return exits

    def drain_events(self) -> list[JobEvent]:
        """Events read from running and just-exited attempts since the last call."""
        for a in self._running.values():
            self._tail_events(a)
        out, self._events = self._events, []
        return out

    def last_checkpoint(self, job_id: Any) -> tuple[float | None, int | None]:
        a = self._running.get(job_id)
        if a is None:
            return None, None
        return a.last_checkpoint_time, a.last_checkpoint_step

    # --- internals -----------------------------------------------------------------------

    def _oom_hint(self, a: _Attempt, code: int) -> bool:
        if code in (137, -signal.SIGKILL):
            kills = _cgroup_oom_kills(os.getpid())
            if kills:
                return True
        try:
            size = a.stderr.stat().st_size
            with open(a.stderr, "rb") as fh:
                fh.seek(max(0, size - _STDERR_TAIL_BYTES))
                tail = fh.read(_STDERR_TAIL_BYTES)
        except OSError:
            return False
        return any(t in tail for t in _OOM_TEXT)

    def _tail_events(self, a: _Attempt) -> None:
        try:
            with open(a.events, "rb") as fh:
                fh.seek(a.events_offset)
                data = fh.read(_EVENTS_READ_LIMIT)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                log.warning("job %s: events file unreadable (errno %s)", a.job_id, exc.errno)
            return
        if not data:
            return
        a.events_offset += len(data)
        data = a.events_partial + data
        lines = data.split(b"\n")
        a.events_partial = lines.pop()  # an unfinished last line waits for its newline
        for line in lines:
            if not line.strip():
                continue
            try:
                doc = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue  # the job owns this file; a bad line is its problem, not ours
            if not isinstance(doc, dict):
                continue
            self._note(a, doc)
            self._events.append(JobEvent(a.job_id, a.attempt, doc))

    @staticmethod
    def _note(a: _Attempt, doc: Mapping[str, Any]) -> None:
        event = doc.get("event")
        if event == "checkpoint_committed":
            t, step = doc.get("time"), doc.get("step")
            if isinstance(t, int | float) and not isinstance(t, bool):
                a.last_checkpoint_time = float(t)
            if isinstance(step, int) and not isinstance(step, bool):
                a.last_checkpoint_step = step
        elif event == "preempt_requested":
            t = doc.get("time")
            if isinstance(t, int | float) and not isinstance(t, bool):
                a.preempt_acked = float(t)


def read_checkpoint_events(path: Path) -> tuple[float | None, int | None]:
    """Newest checkpoint_committed (time, step) in an events file; (None, None) if none."""
    last_t: float | None = None
    last_step: int | None = None
    try:
        data = path.read_bytes()
    except OSError:
        return None, None
    for line in data.splitlines():
        try:
            doc = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(doc, dict) and doc.get("event") == "checkpoint_committed":
            t, step = doc.get("time"), doc.get("step")
            if isinstance(t, int | float) and not isinstance(t, bool):
                last_t = float(t)
            if isinstance(step, int) and not isinstance(step, bool):
                last_step = step
    return last_t, last_step
