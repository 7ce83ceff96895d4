"""The launcher daemon: the engine's tick loop, the unix socket, and what watches them.

`Daemon.serve()` takes the single-instance lock (`<state>/launcher.lock`), opens the
SQLite store, recovers (attempts recorded as running whose process is gone are requeued
by the engine's recovery, never started twice), binds the socket and then loops: accept
and answer requests (one JSON line each way, launcher.protocol), run `engine.tick()`
every `tick_seconds`, turn what changed into audit records, job-mapping files and
telemetry. SIGTERM / SIGINT end the loop after the current step; running jobs keep
running and are found again by the next daemon (their process group ids are in the
store's events).

Who may do what: the caller is whoever the kernel says (SO_PEERCRED); a user may cancel,
hold, release and read the logs of their own jobs; members of the configured admin group
(and root) may act on all. Nothing in a request names the caller.

This module must never run a job or a client request as root on someone's behalf, never
block the loop on one slow client (each connection has a deadline), and never let a bad
request take the daemon down (it gets an error answer).
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gpu_audit.lockfile import ProcessLock
from launcher import protocol
from launcher.peer import Caller, admin_gid, peer_of
from launcher.service import Service

log = logging.getLogger(__name__)

_CLIENT_DEADLINE = 10.0


@dataclass
class _Conn:
    sock: socket.socket
    caller: Caller
    deadline: float
    buf: bytearray = field(default_factory=bytearray)


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
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.service = service
        self.socket_path = Path(socket_path)
        self._mode = socket_mode
        self._group = socket_group
        self._admin = admin_gid(admin_group)
        if admin_group and self._admin is None:
            log.warning("admin group %r does not exist: nobody but root is an admin",
                        admin_group)
        self._tick = tick_seconds
        self._lock = lock
        self._clock = clock
        self._stop = False
        self._sel = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self._last_tick_error: str | None = None

    # --- lifecycle -----------------------------------------------------------------------

    def request_stop(self, *_: Any) -> None:
        self._stop = True

    def _bind(self) -> socket.socket:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        # we hold the instance lock, so a socket file left here is a dead daemon's
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(self.socket_path))
        if self._group:
            import grp  # noqa: PLC0415 - only with a restricted socket

            os.chown(self.socket_path, 0 if os.geteuid() == 0 else -1,
                     grp.getgrnam(self._group).gr_gid)
        os.chmod(self.socket_path, self._mode)
        s.listen(64)
        s.setblocking(False)
        return s

    def serve(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self.request_stop)
        self.service.start()
        self._listener = self._bind()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        log.info("launcher listening on %s (tick %.2g s)", self.socket_path, self._tick)
        next_tick = 0.0
        try:
            while not self._stop:
                now = time.monotonic()
                if now >= next_tick:
                    self._safe_tick()
                    next_tick = now + self._tick
                self._poll_io(max(0.0, min(next_tick - time.monotonic(), 0.5)))
        finally:
            self._shutdown()
        return 0

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
        for key in list(self._sel.get_map().values()):
            with contextlib.suppress(OSError):
                key.fileobj.close()  # type: ignore[union-attr]
        self._sel.close()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        self.service.close()
        self._lock.release()

    # --- I/O -----------------------------------------------------------------------------

    def _poll_io(self, timeout: float) -> None:
        for key, _ in self._sel.select(timeout):
            if key.data is None:
                self._accept()
            else:
                self._read(key.data)
        now = time.monotonic()
        for key in list(self._sel.get_map().values()):
            conn = key.data
            if isinstance(conn, _Conn) and now > conn.deadline:
                self._close(conn)

    def _accept(self) -> None:
        assert self._listener is not None
        try:
            sock, _ = self._listener.accept()
        except BlockingIOError:
            return
        try:
            caller = peer_of(sock, admin=self._admin)
        except OSError as exc:
            log.warning("client without peer credentials refused: %s", exc)
            sock.close()
            return
        sock.setblocking(False)
        conn = _Conn(sock, caller, time.monotonic() + _CLIENT_DEADLINE)
        self._sel.register(sock, selectors.EVENT_READ, conn)

    def _close(self, conn: _Conn) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        conn.sock.close()

    def _read(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            self._close(conn)
            return
        if not chunk:
            self._close(conn)
            return
        conn.buf += chunk
        if len(conn.buf) > protocol.MAX_LINE:
            self._answer(conn, protocol.error("bad_request", "request too large"))
            return
        if b"\n" not in conn.buf:
            return
        line = bytes(conn.buf.split(b"\n", 1)[0])
        try:
            request = orjson.loads(line)
        except orjson.JSONDecodeError:
            self._answer(conn, protocol.error("bad_request", "request is not JSON"))
            return
        if not isinstance(request, dict):
            self._answer(conn, protocol.error("bad_request", "request is not an object"))
            return
        try:
            response = self.service.handle(conn.caller, request)
        except Exception:
            log.exception("request %r from uid %d failed", request.get("op"), conn.caller.uid)
            response = protocol.error("internal", "the launcher failed on this request; "
                                                  "see its log")
        self._answer(conn, response)

    def _answer(self, conn: _Conn, response: Mapping[str, Any]) -> None:
        data = protocol.encode(dict(response))
        try:
            conn.sock.setblocking(True)
            conn.sock.settimeout(_CLIENT_DEADLINE)
            conn.sock.sendall(data)
        except OSError:
            pass
        self._close(conn)


def run_daemon(
    build: Callable[[], Service],
    *,
    state_dir: Path,
    socket_path: Path,
    socket_mode: int,
    socket_group: str | None,
    admin_group: str | None,
    tick_seconds: float,
) -> int:
    """Take the single-instance lock, then build the service (opening the store only
    under the lock) and serve until SIGTERM/SIGINT."""
    lock = ProcessLock.acquire(state_dir / "launcher.lock", f"launcher state {state_dir}")
    try:
        service = build()
    except BaseException:
        lock.release()
        raise
    daemon = Daemon(service, socket_path=socket_path, socket_mode=socket_mode,
                    socket_group=socket_group, admin_group=admin_group,
                    tick_seconds=tick_seconds, lock=lock)
    return daemon.serve()
