"""The daemon's side of its unix socket: many clients, none of which can stall, crash or
bloat it.

`ConnectionLoop.poll(timeout)` runs one round of a non-blocking selectors loop: accept,
read requests, write answers, enforce deadlines. Each connection carries one request
and one answer (launcher.protocol), and everything it may cost is bounded
(launcher.limits.DaemonLimits):
- connections: a total cap and a per-uid cap (the uid from SO_PEERCRED); a connection
  past either is answered "too many connections for uid U: N" and closed at once; new
  connections per uid are a token bucket checked on SO_PEERCRED alone, before anything
  else is done for the connection, so a connect/close loop costs one getsockopt and a
  short "busy" answer per connection (marked `retry`: nothing of it was read);
- bytes: a request longer than `max_request_bytes` is answered "request too large" and
  closed; a uid holding more than a quarter of `max_buffered_bytes` has its unfinished
  requests left unread (in the kernel) until its answers drain, and above the whole
  budget no request is read at all: memory stays bounded whatever clients send;
- time: a client has `request_timeout_seconds` to send its request and
  `write_timeout_seconds` to read its answer, or it is dropped. Answers are written as
  the socket takes them; the loop never waits for a client;
- queues: after a uid's first connection through the common socket, the daemon gives
  it a listening socket of its own (launcher.usersockets, `own_socket`), which its
  client uses from then on; a uid over its connect rate on its own socket has that
  socket left out of the loop for 50 ms..2 s (its flood waits in its own kernel
  queue), and a flood of the common socket is accepted in batches 20 ms apart, so
  the loop keeps its CPU for the users on their own sockets;
- accept() failing for want of files or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) is
  logged once per episode, counted, and accepting pauses with a growing backoff (50 ms to
  1 s) while the open connections are served and time out.

Refusals and drops are counted (launcher.loopstats) and logged once per uid and reason
an hour. This module must never block, never raise out of `poll()` for anything a
client did, and never read more than it has room for.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import selectors
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from launcher import protocol
from launcher.limits import DaemonLimits
from launcher.loopstats import LoopStats
from launcher.peer import Caller

log = logging.getLogger(__name__)

# A handler answers at once (a dict), or returns None and answers later with
# ConnectionLoop.reply(token, answer); the token is the handler's second argument.
Handler = Callable[[Caller, bytes, object], dict[str, Any] | None]
Identify = Callable[[socket.socket], Caller]
# A uid's first connection through the common socket -> a new listening socket of that
# uid's own (launcher.usersockets), or None.
OwnSocket = Callable[[int], socket.socket | None]

_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_ACCEPTS_PER_ROUND = 256  # so reading, writing and the engine keep their turns in a flood
_UCRED = struct.Struct("3i")
_RATE_UIDS = 4096  # uids whose connect rate is remembered at once (bounded memory)
_SWEEP_EVERY = 0.05
_OWN_PAUSE_MIN, _OWN_PAUSE_MAX = 0.05, 2.0  # a uid over its rate on its own socket
_FLOOD_REFUSALS = 32  # refused for rate in one round on the common socket: a flood
_COMMON_PAUSE = 0.02  # ... which is then accepted in batches this far apart
_READ, _WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    caller: Caller
    deadline: float
    rbuf: bytearray = field(default_factory=bytearray)
    out: bytes = b""
    sent: int = 0
    writing: bool = False
    waiting: bool = False  # the request is read; its answer comes later (reply())
    parked: bool = False  # reading: left out of the selector while over a byte budget
    closed: bool = False

    @property
    def held(self) -> int:
        return len(self.rbuf) + len(self.out) - self.sent


@dataclass(eq=False)
class _Listener:
    """A listening socket: the common one (uid None) or one uid's own
    (launcher.usersockets), with its pause: a listener out of the selector is left to
    its kernel queue until `resume`."""

    sock: socket.socket
    uid: int | None
    registered: bool = True
    resume: float = 0.0
    backoff: float = 0.0


class _LogOnce:
    """True the first time a key is seen in `window` seconds (bounded memory)."""

    def __init__(self, window: float = 3600.0, cap: int = 4096) -> None:
        self._window, self._cap = window, cap
        self._seen: dict[tuple[str, int], float] = {}

    def first(self, key: tuple[str, int], now: float) -> bool:
        last = self._seen.get(key)
        if last is not None and now - last < self._window:
            return False
        if len(self._seen) >= self._cap:
            self._seen.clear()
        self._seen[key] = now
        return True


class ConnectionLoop:
    """The clients of one listening socket (see the module docstring)."""

    def __init__(self, listener: socket.socket, handle: Handler, identify: Identify, *,
                 limits: DaemonLimits, stats: LoopStats,
                 clock: Callable[[], float] = time.monotonic,
                 own_socket: OwnSocket | None = None) -> None:
        self._main = _Listener(listener, None)
        self._listeners = [self._main]
        self._own_socket = own_socket
        self._handle = handle
        self._identify = identify
        self.limits = limits
        self.stats = stats
        self._clock = clock
        self._sel = selectors.DefaultSelector()
        self._sel.register(listener, _READ, self._main)
        self._conns: set[_Conn] = set()
        self._per_uid: dict[int, int] = {}
        self._uid_bytes: dict[int, int] = {}
        self._buffered = 0
        self._all_paused = False
        self._keepers: set[_Conn] = set()  # read even over a budget (see _budget)
        self._accept_backoff = 0.0
        self._accept_failures = 0
        self._accept_logged = False
        self._notes = _LogOnce()
        self._next_sweep = 0.0
        self._rate: dict[int, tuple[float, float]] = {}  # uid -> (tokens, as of)

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    @property
    def buffered_bytes(self) -> int:
        return self._buffered

    # --- the round -----------------------------------------------------------------------

    def poll(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for I/O and handle what came; enforce deadlines."""
        now = self._clock()
        for lst in self._listeners:
            if not lst.registered:
                if now >= lst.resume:
                    self._sel.register(lst.sock, _READ, lst)
                    lst.registered = True
                else:
                    timeout = min(timeout, lst.resume - now)
        for key, mask in self._sel.select(max(0.0, timeout)):
            if isinstance(key.data, _Listener):
                self._accept(key.data)
                continue
            if callable(key.data):
                key.data()
                continue
            conn: _Conn = key.data
            if mask & _READ and not conn.writing and not conn.closed and not conn.parked:
                self._read(conn)
            if mask & _WRITE and conn.writing and not conn.closed:
                self._write(conn)
        now = self._clock()
        if now >= self._next_sweep:
            self._sweep(now)
            self._next_sweep = now + _SWEEP_EVERY
        self._budget()
        self.stats.gauges(len(self._conns), self._buffered)

    def watch(self, fd: int, callback: Callable[[], None]) -> None:
        """Call `callback` from poll() whenever `fd` is readable (a worker's wake-up)."""
        self._sel.register(fd, _READ, callback)

    def reply(self, token: object, response: dict[str, Any]) -> None:
        """The later answer to a request whose handler returned None (dropped when the
        client is gone meanwhile)."""
        if isinstance(token, _Conn) and token.waiting and not token.closed:
            token.waiting = False
            self._sel.register(token.sock, _WRITE, token)
            self._answer(token, response, registered=True)

    @property
    def own_sockets(self) -> int:
        """Listening sockets of single uids (launcher.usersockets)."""
        return len(self._listeners) - 1

    def close(self) -> None:
        """Close every client connection (the listeners are the caller's)."""
        for conn in list(self._conns):
            self._close(conn)
        for lst in self._listeners:
            if lst.registered:
                with contextlib.suppress(KeyError, ValueError):
                    self._sel.unregister(lst.sock)
        self._sel.close()

    # --- accept --------------------------------------------------------------------------

    def _pause(self, lst: _Listener, seconds: float) -> None:
        lst.resume = self._clock() + seconds
        if lst.registered:
            self._sel.unregister(lst.sock)
            lst.registered = False

    def _accept(self, lst: _Listener) -> None:
        over_rate = 0
        for _ in range(_ACCEPTS_PER_ROUND):
            try:
                sock, _ = lst.sock.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                if exc.errno == errno.ECONNABORTED:
                    continue
                self._accept_failed(exc)
                return
            if self._accept_failures:
                if self._accept_logged:
                    log.info("accepting connections again (after %d failed accepts)",
                             self._accept_failures)
                self._accept_failures, self._accept_logged = 0, False
                self._accept_backoff = 0.0
            uid = self._admit(sock, lst)
            if uid is None:
                continue
            over_rate += 1
            if lst.uid is not None:
                # one uid over its rate on its own socket: stop listening there for a
                # while; its flood waits in its own kernel queue, at no cost to anyone
                lst.backoff = min(_OWN_PAUSE_MAX, max(_OWN_PAUSE_MIN, lst.backoff * 2))
                if self._notes.first(("own_paused", lst.uid), self._clock()):
                    log.warning("uid %d is over its connect rate on its own socket: not "
                                "listening there for %.2g s at a time while it lasts",
                                lst.uid, lst.backoff)
                self._pause(lst, lst.backoff)
                return
        if lst.uid is not None:
            lst.backoff = 0.0
        elif over_rate >= _FLOOD_REFUSALS:
            # the common socket flooded: accept it in paced batches, so the loop keeps
            # CPU for everyone on their own sockets (a first contact waits a moment)
            self._pause(lst, _COMMON_PAUSE)

    def _accept_failed(self, exc: OSError) -> None:
        name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        self.stats.accept_error(name)
        if self._accept_failures == 0 and self._notes.first(("accept_" + name, -1),
                                                            self._clock()):
            self._accept_logged = True
            hint = (" (the file limit: raise LimitNOFILE or lower limits.max_connections)"
                    if exc.errno in (errno.EMFILE, errno.ENFILE) else "")
            log.error("cannot accept connections: %s%s; %d open, pausing accept and "
                      "serving those meanwhile (logged once an hour; counted in "
                      "gpu_audit_launcher_accept_errors_total)", exc.strerror or name, hint,
                      len(self._conns))
        self._accept_failures += 1
        self._accept_backoff = min(1.0, max(0.05, self._accept_backoff * 2))
        for lst in self._listeners:
            self._pause(lst, self._accept_backoff)

    def _over_rate(self, uid: int) -> bool:
        """A token bucket per uid: per_uid_connect_rate new connections a second, bursts
        of per_uid_connect_burst."""
        now = self._clock()
        rate, burst = self.limits.per_uid_connect_rate, self.limits.per_uid_connect_burst
        tokens, then = self._rate.get(uid, (float(burst), now))
        tokens = min(float(burst), tokens + (now - then) * rate)
        if tokens < 1.0:
            self._rate[uid] = (tokens, now)
            return True
        if len(self._rate) >= _RATE_UIDS and uid not in self._rate:
            self._rate = {u: v for u, v in self._rate.items() if v[0] < burst - 1}
        self._rate[uid] = (tokens - 1.0, now)
        return False

    def _admit(self, sock: socket.socket, lst: _Listener) -> int | None:
        """Take a new connection; the uid when it was refused for its connect rate."""
        sock.setblocking(False)
        try:
            # the uid alone first (one getsockopt): a uid over its connect rate costs
            # nothing more than this and a short answer
            _, uid, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                      _UCRED.size))
        except OSError:
            sock.close()
            return None
        if self._over_rate(uid):
            self._refuse(sock, uid, "per_uid_rate", f"too many new connections from uid "
                                                    f"{uid}: at most "
                                                    f"{self.limits.per_uid_connect_rate:g} a "
                                                    "second; try again")
            return int(uid)
        try:
            caller = self._identify(sock)
        except OSError as exc:
            log.warning("client without peer credentials refused: %s", exc)
            sock.close()
            return None
        uid = caller.uid
        if lst.uid is None and self._own_socket is not None:
            own = self._own_socket(uid)  # None when it has one (or may not have one)
            if own is not None:
                mine = _Listener(own, uid)
                self._listeners.append(mine)
                self._sel.register(own, _READ, mine)
        if len(self._conns) >= self.limits.max_connections:
            self._refuse(sock, uid, "total",
                         f"too many connections: {self.limits.max_connections}")
            return None
        if self._per_uid.get(uid, 0) >= self.limits.per_uid_connections:
            self._refuse(sock, uid, "per_uid", f"too many connections for uid {uid}: "
                                               f"{self.limits.per_uid_connections}")
            return None
        conn = _Conn(sock, caller, self._clock() + self.limits.request_timeout_seconds)
        self._conns.add(conn)
        self._per_uid[uid] = self._per_uid.get(uid, 0) + 1
        self._sel.register(sock, _READ, conn)  # parked by _budget if over a budget
        return None

    def _refuse(self, sock: socket.socket, uid: int, reason: str, message: str) -> None:
        self.stats.refused(reason)
        if self._notes.first((f"refused_{reason}", uid), self._clock()):
            log.warning("uid %d: %s (refused; further refusals of this uid are counted in "
                        "gpu_audit_launcher_connections_refused_total)", uid, message)
        with contextlib.suppress(OSError):
            # retry: nothing of the request was read, so the client may send it again
            sock.send(protocol.encode(protocol.error("busy", message, retry=True)),
                      socket.MSG_NOSIGNAL)
        sock.close()

    # --- read, answer, write -------------------------------------------------------------

    def _read(self, conn: _Conn) -> None:
        over = self._buffered >= self.limits.max_buffered_bytes or \
            self._uid_over(conn.caller.uid)
        if over and conn not in self._keepers:
            self._sel.unregister(conn.sock)  # until _budget picks who is read
            conn.parked = True
            return
        room = self.limits.max_request_bytes + 1 - len(conn.rbuf)
        try:
            chunk = conn.sock.recv(min(65536, room))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn, "error")
            return
        if not chunk:
            self._close(conn)  # the client went away before asking anything
            return
        newline = chunk.find(b"\n")
        if newline < 0:
            self._hold(conn, len(chunk))
            conn.rbuf += chunk
            if len(conn.rbuf) > self.limits.max_request_bytes:
                self._too_large(conn)
            return
        line = bytes(conn.rbuf) + chunk[:newline]
        self._hold(conn, -len(conn.rbuf))
        conn.rbuf = bytearray()
        if len(line) > self.limits.max_request_bytes:
            self._too_large(conn)
            return
        response = self._handle(conn.caller, line, conn)
        if response is not None:
            self._answer(conn, response)
            return
        conn.waiting = True  # answered by reply(); its deadline still holds
        self._sel.unregister(conn.sock)

    def _too_large(self, conn: _Conn) -> None:
        self.stats.dropped("too_large")
        limit = self.limits.max_request_bytes
        if self._notes.first(("too_large", conn.caller.uid), self._clock()):
            log.warning("uid %d sent a request over %d bytes: answered and closed",
                        conn.caller.uid, limit)
        self._hold(conn, -len(conn.rbuf))
        conn.rbuf = bytearray()
        self._answer(conn, protocol.error(
            "too_large", f"request too large: more than {limit} bytes", limit=limit))

    def _answer(self, conn: _Conn, response: dict[str, Any], *,
                registered: bool = False) -> None:
        data = protocol.encode(response)
        conn.out, conn.sent, conn.writing = data, 0, True
        conn.deadline = self._clock() + self.limits.write_timeout_seconds
        self._hold(conn, len(data))
        if conn.parked:
            self._sel.register(conn.sock, _WRITE, conn)
            conn.parked = False
        elif not registered:
            self._sel.modify(conn.sock, _WRITE, conn)
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        try:
            n = conn.sock.send(memoryview(conn.out)[conn.sent:], socket.MSG_NOSIGNAL)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn, "error")
            return
        conn.sent += n
        self._hold(conn, -n)
        if conn.sent >= len(conn.out):
            self._close(conn)

    # --- budgets and deadlines -----------------------------------------------------------

    def _hold(self, conn: _Conn, delta: int) -> None:
        self._buffered += delta
        uid = conn.caller.uid
        self._uid_bytes[uid] = self._uid_bytes.get(uid, 0) + delta

    def _uid_over(self, uid: int) -> bool:
        return self._uid_bytes.get(uid, 0) > self.limits.max_buffered_bytes // 4

    def _budget(self) -> None:
        """Park reading connections while over a byte budget; unpark them below it (the
        whole budget resumes at three quarters, so reading does not flap). The fullest
        unfinished request of a uid over its share (and the fullest of all, over the
        whole budget) is still read: it ends in an answer or "too large" either way and
        frees its bytes, so partial requests can never hold the budget for good."""
        cap = self.limits.max_buffered_bytes
        if not self._all_paused and self._buffered >= cap:
            self._all_paused = True
            self.stats.paused()
            log.warning("%d bytes held for clients (limit %d): reading only the fullest "
                        "request until answers drain or slow clients time out",
                        self._buffered, cap)
        elif self._all_paused and self._buffered <= cap * 3 // 4:
            self._all_paused = False
        readers = [c for c in self._conns if not c.writing and not c.waiting]
        fullest: dict[int, _Conn] = {}
        for conn in readers:
            uid = conn.caller.uid
            if self._uid_over(uid) and (uid not in fullest
                                        or len(conn.rbuf) > len(fullest[uid].rbuf)):
                fullest[uid] = conn
        parked = {c for c in readers if self._uid_over(c.caller.uid)
                  and fullest[c.caller.uid] is not c}
        self._keepers = set(fullest.values())
        if self._all_paused:
            candidates = [c for c in readers if c not in parked]
            keep = max(candidates, key=lambda c: len(c.rbuf), default=None)
            parked |= {c for c in candidates if c is not keep}
            self._keepers = {keep} if keep is not None else set()
        for conn in readers:
            if conn in parked and not conn.parked:
                self._sel.unregister(conn.sock)
                conn.parked = True
            elif conn not in parked and conn.parked:
                self._sel.register(conn.sock, _READ, conn)
                conn.parked = False

    def _sweep(self, now: float) -> None:
        for conn in [c for c in self._conns if now > c.deadline and not c.waiting]:
            if conn.writing:
                self._drop(conn, "write_timeout")
            else:
                self._drop(conn, "read_timeout")

    def _drop(self, conn: _Conn, reason: str) -> None:
        self.stats.dropped(reason)
        if reason != "error" and self._notes.first((reason, conn.caller.uid), self._clock()):
            what = {"write_timeout": "did not read its answer within "
                                     f"{self.limits.write_timeout_seconds:g} s",
                    "read_timeout": "sent no whole request within "
                                    f"{self.limits.request_timeout_seconds:g} s"}[reason]
            log.warning("uid %d (pid %d) %s: dropped (further drops of this uid are counted "
                        "in gpu_audit_launcher_connections_dropped_total)", conn.caller.uid,
                        conn.caller.pid, what)
        self._close(conn)

    def _close(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        if not conn.parked and not conn.waiting:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(conn.sock)
        with contextlib.suppress(OSError):
            conn.sock.close()
        self._hold(conn, -conn.held)
        self._conns.discard(conn)
        self._keepers.discard(conn)
        uid = conn.caller.uid
        left = self._per_uid.get(uid, 1) - 1
        if left > 0:
            self._per_uid[uid] = left
        else:
            self._per_uid.pop(uid, None)
            self._uid_bytes.pop(uid, None)
