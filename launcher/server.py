"""The launcher daemon: the engine's tick loop, the unix socket, and what watches them.

`run_daemon()` checks the state directory (no component another user could swap:
launcher.safefs), takes the single-instance lock (`<state>/launcher.lock`), raises the
file limit to its hard limit, empties the ambient capability set (jobs must inherit no
capability), opens the SQLite store, recovers (attempts recorded as running whose
process is gone are requeued by the engine's recovery, never started twice), binds the
socket and then loops: answer clients (launcher.connections: one JSON line each way,
bounded in connections, bytes and time), run `engine.tick()` every `tick_seconds`, turn
what changed into audit records, job-mapping files and telemetry. SIGTERM / SIGINT end
the loop after the current step; running jobs keep running and are found again by the
next daemon (their process group ids are in the store's events).

Who may do what: the caller is whoever the kernel says (SO_PEERCRED); a user may cancel,
hold, release and read the logs of their own jobs; members of the configured admin group
(and root) may act on all. Nothing in a request names the caller.

The socket is created through a descriptor of its checked directory: a stale socket
there is removed by name relative to it (never following a link), the mode comes from
the umask at bind and the group from fchownat without following links. A directory
made for it is chmod'ed explicitly (0755, never the daemon's 077 umask); an existing
one the users socket_mode admits could not search is refused with the fix named.
Beside it, each user gets a socket of their own after their first connection
(launcher.usersockets), so no user's flood queues in front of another's connection.

This module must never run a job or a client request as root on someone's behalf, never
wait on a client, and never let a bad request take the daemon down (it gets an error
answer).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_audit.lockfile import ProcessLock
from launcher import protocol
from launcher.connections import ConnectionLoop
from launcher.limits import DaemonLimits
from launcher.loopstats import LoopStats
from launcher.peer import Caller, admin_gid, peer_of
from launcher.privileges import drop_ambient, raise_nofile, raise_priority
from launcher.safefs import UnsafePath, open_dir
from launcher.service import Service
from launcher.submissions import SubmissionReader
from launcher.usersockets import UserSockets

log = logging.getLogger(__name__)

_RESERVED_FILES = 64  # descriptors kept for the store, spool, jobs and the metrics server


class Daemon:
    """One launcher daemon: the loop around a Service (engine + store + executor)."""

    def __init__(
        self,
        service: Service,
        *,
        socket_path: Path,
        socket_mode: int = 0o666,
        socket_group: str | None = None,
        admin_group: str | None = None,
        tick_seconds: float = 1.0,
        lock: ProcessLock,
        limits: DaemonLimits | None = None,
        stats: LoopStats | None = None,
    ) -> None:
        self.service = service
        self.socket_path = Path(os.path.abspath(socket_path))
        self._mode = socket_mode
        self._group = socket_group
        self._admin = admin_gid(admin_group)
        if admin_group and self._admin is None:
            log.warning("admin group %r does not exist: nobody but root is an admin",
                        admin_group)
        self._tick = tick_seconds
        self._lock = lock
        self.limits = limits or DaemonLimits()
        self.stats = stats or LoopStats()
        self._stop = False
        self._listener: socket.socket | None = None
        self._dirfd: int | None = None
        self._bound_ino: int | None = None
        self._loop: ConnectionLoop | None = None
        self._users: UserSockets | None = None
        self._reader: SubmissionReader | None = None
        self._pending: dict[object, tuple[Caller, protocol.Request]] = {}
        self._last_tick_error: str | None = None

    # --- lifecycle -----------------------------------------------------------------------

    def request_stop(self, *_: Any) -> None:
        self._stop = True

    def _bind(self) -> socket.socket:
        name = self.socket_path.name
        dirfd = open_dir(self.socket_path.parent, mode=0o755, shared_final=True)
        self._dirfd = dirfd
        self._check_reachable(dirfd)
        # we hold the instance lock, so a socket file left here is a dead daemon's; a
        # link or anything else with its name is removed, never followed
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dirfd)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o777 & ~self._mode)  # the mode is set as bind creates the file
        try:
            s.bind(f"/proc/self/fd/{dirfd}/{name}")  # through the checked directory
        finally:
            os.umask(old)
        if self._group:
            import grp  # noqa: PLC0415 - only with a restricted socket

            os.chown(name, 0 if os.geteuid() == 0 else -1, grp.getgrnam(self._group).gr_gid,
                     dir_fd=dirfd, follow_symlinks=False)
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        if not stat.S_ISSOCK(st.st_mode):
            raise UnsafePath(f"{self.socket_path} is not the socket just bound")
        self._bound_ino = st.st_ino
        s.listen(self.limits.listen_backlog)
        s.setblocking(False)
        return s

    def _check_reachable(self, dirfd: int) -> None:
        """Refuse a socket directory the users socket_mode admits could not enter: a
        socket they may open is no use behind a directory they may not search."""
        st = os.fstat(dirfd)
        dmode = stat.S_IMODE(st.st_mode)
        where = self.socket_path.parent
        if self._mode & 0o007 and not dmode & 0o001:
            raise UnsafePath(
                f"{where} is mode {dmode:04o}: other users cannot reach the socket in it, "
                f"which socket_mode {self._mode:04o} opens to them; chmod o+x {where} (or "
                "remove it and let the launcher create it 0755)")
        if self._mode & 0o070 and not self._mode & 0o007 and not dmode & 0o001:
            import grp  # noqa: PLC0415 - only with a group socket

            gid = grp.getgrnam(self._group).gr_gid if self._group else os.getegid()
            if not (dmode & 0o010 and st.st_gid == gid):
                raise UnsafePath(
                    f"{where} is mode {dmode:04o}, group {st.st_gid}: the socket's group "
                    f"(gid {gid}) cannot reach the socket in it; give it that group with "
                    f"g+x, or o+x")

    def serve(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self.request_stop)
        self.service.start()
        self._listener = self._bind()
        self._users = UserSockets(self.socket_path, cap=self.limits.max_user_sockets)
        self._users.open()
        self._loop = ConnectionLoop(
            self._listener, self._handle,
            lambda sock: peer_of(sock, admin=self._admin),
            limits=self.limits, stats=self.stats, own_socket=self._users.ensure)
        self._reader = SubmissionReader(
            timeout_seconds=self.limits.submit_timeout_seconds,
            levels=list(self.service.engine.scheduler.config.urgency_levels),
            max_expanded=self.service.engine.config.quotas.max_expanded_bytes)
        self._loop.watch(self._reader.wakeup_fd, self._submissions_read)
        log.info("launcher listening on %s (tick %.2g s; at most %d connections, %d per "
                 "uid)", self.socket_path, self._tick, self.limits.max_connections,
                 self.limits.per_uid_connections)
        next_tick = 0.0
        try:
            while not self._stop:
                now = time.monotonic()
                if now >= next_tick:
                    self._safe_tick()
                    next_tick = now + self._tick
                self._loop.poll(max(0.0, min(next_tick - time.monotonic(), 0.5)))
        finally:
            self._shutdown()
        return 0

    def _handle(self, caller: Caller, line: bytes, token: object) -> dict[str, Any] | None:
        """One request line -> its answer, or None for a submission handed to the reader
        (answered by _submissions_read when it is read)."""
        request = _parse(caller, line)
        if isinstance(request, protocol.Request) and request.op == "submit" \
                and self._reader is not None:
            refused = self.service.refuse_submission(caller, request)
            if refused is None:
                busy = self._reader.submit(token, caller.uid, request.spec or "",
                                           request.path)
                if busy is None:
                    self._pending[token] = (caller, request)
                    return None
                refused = protocol.error("busy", busy)
            self.stats.request("submit", str(refused.get("error")))
            return refused
        return handle_line(self.service, caller, line, self.stats, parsed=request)

    def _submissions_read(self) -> None:
        assert self._reader is not None and self._loop is not None
        for token, parsed in self._reader.results():
            caller, request = self._pending.pop(token)
            try:
                response = self.service.finish_submission(caller, request, parsed)
            except Exception:
                log.exception("submission from uid %d failed", caller.uid)
                response = protocol.error("internal", "the launcher failed on this "
                                                      "request; see its log")
            self.stats.request("submit", "ok" if response.get("ok") else
                               str(response.get("error")))
            self._loop.reply(token, response)

    def _safe_tick(self) -> None:
        """One engine round; a failure is logged (once per distinct error) and the loop goes
        on, so requests are still answered and the next tick may succeed."""
        try:
            self.service.tick()
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            if text != self._last_tick_error:
                log.exception("engine tick failed; retrying every tick")
                self._last_tick_error = text
        else:
            if self._last_tick_error is not None:
                log.info("engine tick works again")
            self._last_tick_error = None

    def _shutdown(self) -> None:
        log.info("launcher stopping; running jobs keep running and are adopted on restart")
        if self._loop is not None:
            self._loop.close()
        if self._reader is not None:
            self._reader.close()
        if self._listener is not None:
            self._listener.close()
        if self._users is not None:
            self._users.close()
        if self._dirfd is not None:
            with contextlib.suppress(OSError):
                st = os.stat(self.socket_path.name, dir_fd=self._dirfd, follow_symlinks=False)
                if st.st_ino == self._bound_ino:
                    os.unlink(self.socket_path.name, dir_fd=self._dirfd)
            os.close(self._dirfd)
        self.service.close()
        self._lock.release()


def _parse(caller: Caller, line: bytes) -> protocol.Request | dict[str, Any]:
    try:
        return protocol.parse_request(line)
    except Exception:  # a parser bug must not take the daemon down: the fuzz hunts them
        log.exception("the request parser failed on a %d-byte request from uid %d",
                      len(line), caller.uid)
        return protocol.error("internal", "the launcher failed on this request; see its "
                                          "log")


def handle_line(service: Service, caller: Caller, line: bytes,
                stats: LoopStats | None = None, *,
                parsed: protocol.Request | dict[str, Any] | None = None) -> dict[str, Any]:
    """One request line -> its answer (the frame parser, then the service); nothing a
    client sends escapes as an exception. The protocol fuzz drives exactly this (a
    submission is read inline here; the daemon reads it in a worker process)."""
    request = _parse(caller, line) if parsed is None else parsed
    if isinstance(request, dict):
        if stats is not None:
            stats.request("invalid", str(request.get("error")))
        return request
    try:
        response = service.handle(caller, request)
    except Exception:
        log.exception("request %r from uid %d failed", request.op, caller.uid)
        response = protocol.error("internal", "the launcher failed on this request; "
                                              "see its log")
    if stats is not None:
        stats.request(request.op, "ok" if response.get("ok") else str(response.get("error")))
    return response


def prepare_process(limits: DaemonLimits) -> None:
    """Process-wide settings before anything starts: the file limit raised to its hard
    limit (warned about when the connection cap does not fit under it), the CPU priority
    raised (limits.daemon_nice; what it starts for users is put back) and no ambient
    capability for the jobs to inherit."""
    soft, _ = raise_nofile()
    if limits.max_connections + _RESERVED_FILES > soft:
        log.warning("limits.max_connections %d does not fit under the file limit %d (minus "
                    "%d for the daemon's own files): accept() will fail first; the daemon "
                    "then pauses accepting and keeps serving", limits.max_connections, soft,
                    _RESERVED_FILES)
    raise_priority(limits.daemon_nice)
    if not drop_ambient():
        raise RuntimeError("cannot clear the ambient capability set: refusing to start "
                           "jobs that would inherit the daemon's capabilities")


def run_daemon(
    build: Callable[[], Service],
    *,
    state_dir: Path,
    socket_path: Path,
    socket_mode: int,
    socket_group: str | None,
    admin_group: str | None,
    tick_seconds: float,
    limits: DaemonLimits | None = None,
    stats: LoopStats | None = None,
) -> int:
    """Check the state directory, take the single-instance lock, then build the service
    (opening the store only under the lock) and serve until SIGTERM/SIGINT. Raises
    UnsafePath when a directory could be swapped by another user."""
    limits = limits or DaemonLimits()
    os.close(open_dir(state_dir, mode=0o711))  # trusted from / down, created if missing
    lock = ProcessLock.acquire(Path(state_dir) / "launcher.lock",
                               f"launcher state {state_dir}")
    try:
        prepare_process(limits)
        service = build()
    except BaseException:
        lock.release()
        raise
    daemon = Daemon(service, socket_path=socket_path, socket_mode=socket_mode,
                    socket_group=socket_group, admin_group=admin_group,
                    tick_seconds=tick_seconds, lock=lock, limits=limits, stats=stats)
    return daemon.serve()
