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
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from launcher.audit import PROBE, fingerprint_from
from launcher.engine import Exit, Report

log = logging.getLogger(__name__)

# The job runs under a small sh that only records its exit status in a file (so a daemon
# restarted while the job ran still learns how it ended). Its traps are no-op handlers,
# which exec resets to the default for the job itself: the preemption signal reaches the
# job unchanged, and the shell outlives it long enough to write the status.
_TRAPPED = ("USR1", "USR2", "TERM", "INT", "HUP")


def _wrapper(preempt_signal: str | None) -> str:
    """The shell script around the job; it also traps the job's own preemption signal (a
    shell killed by it would be reported as the job's end while the job still commits)."""
    names = list(_TRAPPED)
    extra = (preempt_signal or "").upper().removeprefix("SIG")
    if extra and extra.isalnum() and extra not in names:
        names.append(extra)
    return (f'trap : {" ".join(names)}; "$@"; rc=$?; '
            'printf %s "$rc" > "$GPU_AUDIT_EXIT_FILE"; exit "$rc"')
_OOM_TEXT = (b"CUDA out of memory", b"OutOfMemoryError", b"CUBLAS_STATUS_ALLOC_FAILED")
_STDERR_TAIL_BYTES = 16 * 1024
_EVENTS_READ_LIMIT = 1024 * 1024


class ExecutorError(Exception):
    """An attempt could not be started; the message says why and what to do."""


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
    proc: subprocess.Popen[bytes] | None  # None: adopted after a daemon restart
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
    pids: set[int] = field(default_factory=set)
    oom_kills_at_start: int | None = None


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
        self._reports: list[Report] = []
        self._ended_pids: dict[Any, set[int]] = {}
        self._injected: list[Exit] = []
        self._fingerprints: dict[Any, dict[str, str]] = {}
        self._probes: dict[tuple[str, int, int], dict[str, Any] | None] = {}
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
        if uid != os.geteuid() and not self._is_root:
            raise ExecutorError(
                f"the launcher runs as uid {os.geteuid()} and cannot run a job as uid {uid}; "
                "run the daemon as root to serve several users"
            )
        groups = os.getgrouplist(pw.pw_name, pw.pw_gid) if self._is_root else []
        return pw.pw_gid, groups, pw.pw_name, pw.pw_dir

    def _open_owned(self, path: Path, uid: int, gid: int) -> int:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
        if self._is_root:
            os.fchown(fd, uid, gid)
        return fd

    # --- Executor protocol ---------------------------------------------------------------

    def start(  # noqa: PLR0917 - the engine's Executor protocol
        self,
        job_id: Any,
        attempt: int,
        spec: Any,
        gpus: Sequence[Any],
        env: Mapping[str, str],
        uid: int,
    ) -> None:
        """Start one attempt as `uid` in a new session. Raises ExecutorError."""
        if job_id in self._running:
            raise ExecutorError(f"job {job_id} already has a running attempt")
        gid, groups, user, home = self._identity(uid)
        out, err = self.log_paths(job_id, attempt)
        events = self.events_path(job_id, attempt)
        status = self.exit_path(job_id, attempt)
        out.parent.mkdir(parents=True, exist_ok=True)
        command = _spec_get(spec, "command")
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else \
            [str(a) for a in (command or [])]
        if not argv:
            raise ExecutorError(f"job {job_id} has no command")
        cwd = _spec_get(spec, "cwd") or home
        full_env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": home,
            "LANG": os.environ.get("LANG", "C.UTF-8"),
        }
        full_env.update(self._extra_env)
        full_env.update(env)
        full_env["USER"] = full_env["LOGNAME"] = user
        full_env["GPU_AUDIT_EVENTS_FILE"] = str(events)
        full_env["GPU_AUDIT_EXIT_FILE"] = str(status)
        with contextlib.suppress(FileNotFoundError):
            status.unlink()
        fds: list[int] = []
        try:
            fds = [self._open_owned(p, uid, gid) for p in (out, err, events, status)]
            if self._is_root:
                os.chown(out.parent, 0, gid)
                os.chmod(out.parent, 0o770)  # noqa: S103 - the job's own group, not others
            kw: dict[str, Any] = {}
            if self._is_root:
                kw = {"user": uid, "group": gid, "extra_groups": groups}
            try:
                proc = subprocess.Popen(
                    ["/bin/sh", "-c", _wrapper(_spec_get(spec, "preempt_signal")),
                     "gpu-audit-job", *argv],
                    cwd=str(cwd), env=full_env, stdin=subprocess.DEVNULL,
                    stdout=fds[0], stderr=fds[1], start_new_session=True, close_fds=True,
                    **kw,
                )
            except OSError as exc:
                raise ExecutorError(
                    f"job {job_id} could not start: {exc.strerror} (cwd {cwd})") from None
        finally:
            for fd in fds:
                os.close(fd)
        # pid and start time, so a restarted daemon can find (and trust) the group again
        self.pid_path(job_id, attempt).write_text(f"{proc.pid} {_start_ticks(proc.pid)}\n")
        self._fingerprints[job_id] = fingerprint_from(
            self._probe(argv, uid, gid, groups, full_env), full_env)
        self._running[job_id] = _Attempt(
            job_id=job_id, attempt=attempt, proc=proc, pgid=proc.pid, uid=uid,
            started=self._clock(), stdout=out, stderr=err, events=events, pids={proc.pid},
            oom_kills_at_start=_cgroup_oom_kills(proc.pid),
        )
        log.info("job %s attempt %d started: pid %d as uid %d on %d GPU(s)", job_id, attempt,
                 proc.pid, uid, len(gpus))

    def fingerprint(self, job_id: Any) -> dict[str, str]:
        """The environment fingerprint of the job's newest attempt started by this daemon."""
        return dict(self._fingerprints.get(job_id, {}))

    def _probe(self, argv: Sequence[str], uid: int, gid: int, groups: list[int],
               env: Mapping[str, str]) -> dict[str, Any] | None:
        """Ask the job's interpreter (argv[0] when it is a Python) for its versions, as the
        job's user; cached per interpreter file and user. None for anything else."""
        first = argv[2].split()[0] if argv[:2] == ["/bin/sh", "-c"] and argv[2].split() \
            else argv[0]
        if not Path(first).name.startswith("python"):
            return None
        exe = first if "/" in first else shutil.which(first, path=env.get("PATH"))
        if exe is None:
            return None
        try:
            st = os.stat(exe)
        except OSError:
            return None
        key = (exe, st.st_mtime_ns, uid)
        if key in self._probes:
            return self._probes[key]
        kw: dict[str, Any] = {}
        if self._is_root:
            kw = {"user": uid, "group": gid, "extra_groups": groups}
        try:
            r = subprocess.run([exe, "-I", "-c", PROBE], capture_output=True, timeout=10,
                               env=dict(env), check=False, cwd="/", **kw)
            doc = orjson.loads(r.stdout) if r.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired, orjson.JSONDecodeError):
            doc = None
        result = doc if isinstance(doc, dict) else None
        self._probes[key] = result
        return result

    def adopt(self, job_id: Any, attempt: int) -> bool:
        """Take over an attempt a previous daemon started, if its process group still runs
        (same leader pid and start time); False when it is gone."""
        try:
            pid_s, ticks_s = self.pid_path(job_id, attempt).read_text().split()
            pid, ticks = int(pid_s), int(ticks_s)
        except (OSError, ValueError):
            return False
        if _start_ticks(pid) != ticks or not self.group_alive(pid):
            return False
        out, err = self.log_paths(job_id, attempt)
        a = _Attempt(job_id=job_id, attempt=attempt, proc=None, pgid=pid, uid=-1,
                     started=self._clock(), stdout=out, stderr=err,
                     events=self.events_path(job_id, attempt), pids={pid})
        self._skip_old_events(a)
        self._running[job_id] = a
        log.info("job %s attempt %d adopted: process group %d still runs", job_id, attempt, pid)
        return True

    def finished_while_away(self, job_id: Any, attempt: int) -> Exit | None:
        """How an attempt that ended while no daemon ran ended, from its exit-status file
        (None: it left none, i.e. it was killed)."""
        try:
            code = int(self.exit_path(job_id, attempt).read_text().strip())
        except (OSError, ValueError):
            return None
        t, step = read_checkpoint_events(self.events_path(job_id, attempt))
        try:
            when = self.exit_path(job_id, attempt).stat().st_mtime
        except OSError:
            when = self._clock()
        return Exit(job_id=job_id, code=code, time=when, oom=False,
                    last_checkpoint_time=t, last_checkpoint_step=step)

    def inject_exit(self, exit_: Exit) -> None:
        """Report `exit_` at the next poll (an attempt that ended while no daemon ran)."""
        self._injected.append(exit_)

    def signal(self, job_id: Any, signum: int) -> None:
        """Send `signum` to the attempt's whole process group (nothing when none runs)."""
        a = self._running.get(job_id)
        if a is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(a.pgid, signum)

    def kill_group(self, job_id: Any) -> None:
        """SIGKILL the attempt's process group (the leader may be gone, members not)."""
        self.signal(job_id, signal.SIGKILL)

    def pids(self, job_id: Any) -> set[int]:
        a = self._running.get(job_id)
        if a is not None:
            return set(a.pids)
        # an ended job's processes that are still alive: a GPU state read before they
        # were gone (the exporter samples every few seconds) must not make a dead pid a leak
        return {pid for pid in self._ended_pids.get(job_id, ()) if _alive(pid)}

    def pid_of(self, job_id: Any) -> int | None:
        a = self._running.get(job_id)
        return a.pgid if a is not None else None

    def running(self) -> list[Any]:
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
        return bool(_group_members({pgid}).get(pgid))

    def reports(self) -> list[Report]:
        """What the jobs reported (checkpoints, telemetry, anomalies) since the last call."""
        for a in self._running.values():
            self._tail_events(a)
        out, self._reports = self._reports, []
        return out

    def poll(self) -> list[Exit]:
        """Reap every attempt that ended (never blocks)."""
        exits, self._injected = self._injected, []
        members = _group_members({a.pgid for a in self._running.values()})
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
                done = self.finished_while_away(job_id, a.attempt)
                code = done.code if done is not None else 128 + signal.SIGKILL
            self._tail_events(a)
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

    def pid_path(self, job_id: Any, attempt: int) -> Path:
        return self._logs / str(job_id) / f"{attempt}.pid"

    def exit_path(self, job_id: Any, attempt: int) -> Path:
        return self._logs / str(job_id) / f"{attempt}.exit"

    def _exit_time(self, a: _Attempt) -> float:
        """When the job ended: the wrapper writes its exit status the moment the job exits,
        so that file's mtime beats the time of this poll (up to a tick later)."""
        try:
            when = self.exit_path(a.job_id, a.attempt).stat().st_mtime
        except OSError:
            return self._clock()
        now = self._clock()
        return when if a.started <= when <= now else now

    def _oom_hint(self, a: _Attempt, code: int) -> bool:
        if code == 128 + signal.SIGKILL:
            # the kernel's OOM killer: the job's cgroup counted a kill since it started
            kills = _cgroup_oom_kills(a.pgid) or _cgroup_oom_kills(os.getpid())
            if kills is not None and a.oom_kills_at_start is not None \
                    and kills > a.oom_kills_at_start:
                return True
        try:
            size = a.stderr.stat().st_size
            with open(a.stderr, "rb") as fh:
                fh.seek(max(0, size - _STDERR_TAIL_BYTES))
                tail = fh.read(_STDERR_TAIL_BYTES)
        except OSError:
            return False
        return any(t in tail for t in _OOM_TEXT)

    def _skip_old_events(self, a: _Attempt) -> None:
        """An adopted attempt's events before now were reported to the previous daemon;
        only its newest checkpoint is taken from them."""
        a.last_checkpoint_time, a.last_checkpoint_step = read_checkpoint_events(a.events)
        with contextlib.suppress(OSError):
            a.events_offset = a.events.stat().st_size

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
        lines = (a.events_partial + data).split(b"\n")
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

    def _note(self, a: _Attempt, doc: Mapping[str, Any]) -> None:
        event = doc.get("event")
        t = doc.get("time")
        when = float(t) if isinstance(t, int | float) and not isinstance(t, bool) \
            else self._clock()
        data = {k: v for k, v in doc.items() if k not in ("event", "time")}
        if event == "checkpoint_committed":
            step = doc.get("step")
            a.last_checkpoint_time = when
            if isinstance(step, int) and not isinstance(step, bool):
                a.last_checkpoint_step = step
            self._reports.append(Report(a.job_id, when, "checkpoint", data))
        elif event == "metrics":
            self._reports.append(Report(a.job_id, when, "telemetry", data))
        elif event == "anomaly":
            self._reports.append(Report(a.job_id, when, "anomaly", data))
        elif event == "preempt_requested":
            a.preempt_acked = when


def _start_ticks(pid: int) -> int:
    """The process's start time in clock ticks (field 22 of /proc/<pid>/stat); -1 if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    try:
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return -1


def _alive(pid: int) -> bool:
    """A live (not zombie) process with this pid, from /proc."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _group_members(pgids: set[int]) -> dict[int, set[int]]:
    """Live (not zombie) pids of the given process groups, from /proc."""
    out: dict[int, set[int]] = {}
    if not pgids:
        return out
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            state, pgrp = fields[0], int(fields[2])
        except (OSError, IndexError, ValueError):
            continue
        if pgrp in pgids and state not in ("Z", "X"):
            out.setdefault(pgrp, set()).add(int(name))
    return out


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


class SimGpuBinding(ProcessExecutor):
    """A ProcessExecutor whose real jobs show up on simulated GPUs (`gpus: sim:N`): each
    started attempt's leader appears on its GPUs with its admitted memory (default 1 GiB)
    and disappears when it exits, so placement, fair share and the release barrier see
    the launched jobs' usage without a GPU."""

    def __init__(self, state_dir: Path, sim: Any, *, default_bytes: int = 1 << 30,
                 **kw: Any) -> None:
        super().__init__(state_dir, **kw)
        self._sim = sim
        self._default = default_bytes

    def start(  # noqa: PLR0917 - the engine's Executor protocol
        self, job_id: Any, attempt: int, spec: Any, gpus: Sequence[Any],
        env: Mapping[str, str], uid: int,
    ) -> None:
        super().start(job_id, attempt, spec, gpus, env, uid)
        pid = self.pid_of(job_id)
        limit = env.get("GPU_AUDIT_GPU_MEMORY_LIMIT_BYTES")
        used = int(limit) if limit and limit.isdigit() else self._default
        for g in gpus:
            if pid is not None:
                self._sim.add_process(g.uuid, pid, used)

    def poll(self) -> list[Exit]:
        exits = super().poll()
        for e in exits:
            self._sim.remove_pids(self.pids(e.job_id))
        return exits

    def sync(self) -> None:
        """Take the processes of attempts that already exited (not yet polled) off the
        simulated GPUs, as a real GPU would show them gone."""
        for a in self._running.values():
            if a.proc is not None and a.proc.poll() is not None:
                self._sim.remove_pids(a.pids)


class SimGpuView:
    """The GpuStateSource of a `sim:N` daemon: the simulated GPUs as they are now."""

    def __init__(self, sim: Any, binding: SimGpuBinding) -> None:
        self.sim = sim
        self._binding = binding

    def read(self, now: float) -> list[Any]:
        self._binding.sync()
        result: list[Any] = self.sim.read(now)
        return result
