"""Submissions are read off the daemon's loop: a worker process parses the YAML, a thread
talks to it, the loop only hands over and picks up.

`SubmissionReader.submit(token, uid, text, source)` queues a submission (at most
`per_uid` waiting per uid and `max_pending` in all: the next is refused) and returns at
once. The thread takes the uids in turn (round robin), so a user with many large
submissions delays another user's by at most one read; it writes each to the worker process
(launcher/parseworker.py: unprivileged, memory-capped), waits for its answer up to
`timeout_seconds` (then kills the worker, answers "took too long to read" and starts a
new one), and leaves the result for the loop, which it wakes through a pipe
(`wakeup_fd`, in the loop's selector). `results()` gives (token, specs or problems).

This module must never let the loop wait: the loop's calls only take a lock for a queue
operation. The thread never touches the store or the engine.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import orjson

from launcher.parseworker import frame
from launcher.privileges import lower_child
from launcher.spec import TRUSTED, JobSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Parsed:
    """A submission read: its specs, or every problem with it."""

    specs: list[JobSpec] | None
    problems: list[str]


@dataclass(frozen=True, slots=True)
class _Job:
    token: object
    uid: int
    text: str
    source: str


class SubmissionReader:
    """See the module docstring."""

    def __init__(self, *, timeout_seconds: float = 10.0, max_pending: int = 64,
                 per_uid: int = 8, levels: list[str] | None = None,
                 max_expanded: int | None = None) -> None:
        self._timeout = timeout_seconds
        self._levels = levels  # the urgency levels (an unknown one is listed as a problem)
        self._max_expanded = max_expanded  # quotas.max_expanded_bytes, checked there
        self._max_pending, self._per_uid = max_pending, per_uid
        self._lock = threading.Condition()
        self._waiting: collections.OrderedDict[int, collections.deque[_Job]] = \
            collections.OrderedDict()  # uid -> its submissions; the first uid goes next
        self._pending = 0
        self._closing = False
        self._done: collections.deque[tuple[object, Parsed]] = collections.deque()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._worker: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._run, name="submission-reader",
                                        daemon=True)
        self._thread.start()

    @property
    def wakeup_fd(self) -> int:
        return self._wake_r

    def submit(self, token: object, uid: int, text: str, source: str) -> str | None:
        """Queue a submission; None when queued, else why it was refused."""
        with self._lock:
            mine = self._waiting.get(uid)
            if mine is not None and len(mine) >= self._per_uid:
                return (f"{self._per_uid} submissions of uid {uid} are waiting to be read; "
                        "submit again when they are answered")
            if self._pending >= self._max_pending:
                return "too many submissions are waiting to be read; try again in a moment"
            self._waiting.setdefault(uid, collections.deque()).append(
                _Job(token, uid, text, source))
            self._pending += 1
            self._lock.notify()
        return None

    def _next(self) -> _Job | None:
        """The next submission, the uids taken in turn; None when closing."""
        with self._lock:
            while not self._pending and not self._closing:
                self._lock.wait()
            if self._closing:
                return None
            uid, mine = next(iter(self._waiting.items()))
            job = mine.popleft()
            if mine:
                self._waiting.move_to_end(uid)
            else:
                del self._waiting[uid]
            self._pending -= 1
            return job

    def results(self) -> list[tuple[object, Parsed]]:
        """The submissions read since the last call (and empty the wake-up pipe)."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass
        out: list[tuple[object, Parsed]] = []
        with self._lock:
            while self._done:
                out.append(self._done.popleft())
        return out

    def close(self) -> None:
        with self._lock:
            self._closing = True
            self._lock.notify()
        self._thread.join(timeout=self._timeout + 5)
        self._stop_worker()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    # --- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            job = self._next()
            if job is None:
                return
            try:
                parsed = self._read(job)
            except Exception as exc:
                log.exception("reading a submission failed")
                parsed = Parsed(None, [f"the launcher could not read it: {exc}"])
                self._stop_worker()
            with self._lock:
                self._done.append((job.token, parsed))
            with contextlib.suppress(BlockingIOError):
                os.write(self._wake_w, b"x")

    def _start_worker(self) -> subprocess.Popen[bytes]:
        if self._worker is None or self._worker.poll() is not None:
            # this very interpreter, through /proc/self/exe: a daemon that gave up root
            # may no longer be able to look up the path it was started from
            # (not through nice(1), which would need a path the account may not reach:
            # its priority is put back once it runs; it reads before it computes)
            argv = [sys.executable, "-m", "launcher.parseworker"]
            exe = "/proc/self/exe" if os.path.exists("/proc/self/exe") else None
            self._worker = subprocess.Popen(
                argv, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True,
                start_new_session=True, cwd="/", executable=exe)
            lower_child(self._worker.pid)
        return self._worker

    def _stop_worker(self) -> None:
        worker, self._worker = self._worker, None
        if worker is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(worker.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.wait(timeout=10)
        for stream in (worker.stdin, worker.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def _read(self, job: _Job) -> Parsed:
        worker = self._start_worker()
        assert worker.stdin is not None and worker.stdout is not None
        deadline = time.monotonic() + self._timeout
        try:
            worker.stdin.write(frame({"text": job.text, "source": job.source,
                                      "levels": self._levels,
                                      "max_expanded": self._max_expanded}))
            worker.stdin.flush()
        except OSError:
            self._stop_worker()
            return Parsed(None, ["the launcher's submission reader failed; try again"])
        data = self._answer(worker, deadline)
        if data is None:
            self._stop_worker()
            log.warning("uid %d: a submission took more than %g s to read: refused",
                        job.uid, self._timeout)
            return Parsed(None, [f"the submission took more than {self._timeout:g} s to "
                                 "read: make it smaller or less nested"])
        doc: dict[str, Any] = orjson.loads(data)
        if "problems" in doc:
            return Parsed(None, [str(p) for p in doc["problems"]])
        # the worker validated them; only the command's splitting is not repeated
        return Parsed([JobSpec.model_validate(s, context=TRUSTED) for s in doc["specs"]], [])

    @staticmethod
    def _answer(worker: subprocess.Popen[bytes], deadline: float) -> bytes | None:
        """The worker's next frame, or None when it did not come by `deadline`."""
        assert worker.stdout is not None
        fd = worker.stdout.fileno()
        buf = bytearray()
        need = 4
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return None  # the worker died (MemoryError past its cap, killed)
            buf += chunk
            if need == 4 and len(buf) >= 4:
                need = 4 + int.from_bytes(buf[:4], "big")
            if len(buf) >= need > 4:
                return bytes(buf[4:need])
