"""Asks a job's own interpreter what it runs on (Python, PyTorch, CUDA versions), in the
background, as the job's user.

`Probes.start(job, ...)` runs `<interpreter> -I -c PROBE` (launcher.audit.PROBE) when the
job's command starts with a Python, in its own session, as the job's uid and groups;
`poll()` (every tick) collects what it printed. A probe is a program the user chose: it
gets `timeout_seconds` and 64 KiB of output, then its process group is killed and the
answer is "unknown". Answers are cached per interpreter file (path and mtime) and uid.

This module must never wait for a probe (the daemon's loop would wait on a user's
program) and never keep more than 64 KiB of what one printed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from launcher.audit import PROBE
from launcher.privileges import lowered

log = logging.getLogger(__name__)

MAX_OUTPUT = 64 * 1024
_Key = tuple[str, int, int]


@dataclass
class _Running:
    proc: subprocess.Popen[bytes]
    deadline: float
    jobs: list[int]
    out: bytearray = field(default_factory=bytearray)


def interpreter(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The Python a job's command starts with (argv[0], or the first word of a `sh -c`
    line), as a path; None when it is not a Python or cannot be found."""
    first = argv[2].split()[0] if list(argv[:2]) == ["/bin/sh", "-c"] and argv[2].split() \
        else argv[0]
    if not Path(first).name.startswith("python"):
        return None
    return first if "/" in first else shutil.which(first, path=env.get("PATH"))


class Probes:
    """The probes in flight and the answers known (see the module docstring)."""

    def __init__(self, *, timeout_seconds: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._timeout = timeout_seconds
        self._clock = clock
        self._cache: dict[_Key, dict[str, Any] | None] = {}
        self._running: dict[_Key, _Running] = {}
        self._answer: dict[int, dict[str, Any] | None] = {}
        self._reap: list[subprocess.Popen[bytes]] = []

    def start(self, job_id: int, argv: Sequence[str], *,
              uid: int, gid: int, groups: list[int], env: Mapping[str, str],
              switch: bool) -> None:
        """Ask the interpreter of `argv` as `uid` (when `switch`: the daemon may change
        identity); the answer is `answer(job_id)` once `pending(job_id)` is False."""
        self._answer.pop(job_id, None)
        exe = interpreter(argv, env)
        try:
            key = (exe, os.stat(exe).st_mtime_ns, uid) if exe else None
        except OSError:
            key = None
        if key is None:
            self._answer[job_id] = None
            return
        if key in self._cache:
            self._answer[job_id] = self._cache[key]
            return
        if key in self._running:
            self._running[key].jobs.append(job_id)
            return
        kw: dict[str, Any] = {"user": uid, "group": gid, "extra_groups": groups} \
            if switch else {}
        try:
            proc = subprocess.Popen(lowered([key[0], "-I", "-c", PROBE]),
                                    stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                    env=dict(env), cwd="/", start_new_session=True,
                                    close_fds=True, **kw)
        except (OSError, ValueError, subprocess.SubprocessError):
            self._cache[key] = self._answer[job_id] = None
            return
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        self._running[key] = _Running(proc, self._clock() + self._timeout, [job_id])

    def pending(self, job_id: int) -> bool:
        return job_id not in self._answer and any(
            job_id in r.jobs for r in self._running.values())

    def answer(self, job_id: int) -> dict[str, Any] | None:
        return self._answer.get(job_id)

    def poll(self) -> None:
        """Collect output of the running probes; end those done, too big or too slow."""
        self._reap = [p for p in self._reap if p.poll() is None]
        now = self._clock()
        for key, run in list(self._running.items()):
            assert run.proc.stdout is not None
            eof = False
            try:
                while len(run.out) <= MAX_OUTPUT:
                    chunk = os.read(run.proc.stdout.fileno(), 65536)
                    if not chunk:
                        eof = True
                        break
                    run.out += chunk
            except BlockingIOError:
                pass
            except OSError:
                eof = True
            too_big = len(run.out) > MAX_OUTPUT
            if not (eof or too_big or now >= run.deadline):
                continue
            result = None if too_big else self._parse(bytes(run.out))
            if not eof or too_big:
                log.info("fingerprint probe of %s (uid %d) %s: killed", key[0], key[2],
                         "printed too much" if too_big else "did not answer in time")
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(run.proc.pid, signal.SIGKILL)
            run.proc.stdout.close()
            if run.proc.poll() is None:
                self._reap.append(run.proc)
            elif run.proc.returncode != 0:
                result = None
            del self._running[key]
            self._cache[key] = result
            for job in run.jobs:
                self._answer[job] = result

    def close(self) -> None:
        for run in self._running.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(run.proc.pid, signal.SIGKILL)
        self._running.clear()

    @staticmethod
    def _parse(data: bytes) -> dict[str, Any] | None:
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        return doc if isinstance(doc, dict) else None
