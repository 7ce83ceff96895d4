"""Connection limits of the HTTP endpoint: how many connections, for how long, how big.

The endpoint serves each connection on its own thread (a scrape is a reference read and
one socket write, so threads are the fast path). Unbounded, that lets anyone exhaust the
process: 3,000 idle connections were 3,006 threads and 274 MB. So:

- `ConnectionLimiter` admits at most `max_connections` at once. When full, a new
  connection takes the place of another that is not doing anything: the longest idle
  keep-alive connection, else the oldest that has sent nothing for `_SILENT_GRACE_S`,
  else the oldest whose head is still incomplete `_EVICT_GRACE_S` after it started. So
  idle and slowloris clients can never lock out a scrape, and the accept loop stalls
  only briefly behind them (a flood of silent connections is churned through, and the
  scrape queued behind them gets in). A scrape's request is usually in the socket when
  it is accepted, so it counts as heard at once and is never the one evicted.
  When every slot is serving a response, the new connection waits (the listen backlog
  holds the rest) for up to `header_timeout_seconds`, then gets 503 (TLS: is closed).
- `read_head` reads a request head against a total deadline, not a per-recv timeout:
  a client trickling a byte every few seconds is cut when the deadline passes. The first
  request must be complete `header_timeout_seconds` after accept (TLS handshake
  included); on a kept-alive connection the next request may wait `idle_timeout_seconds`
  to start and must then be complete within `header_timeout_seconds`. A head larger than
  `max_header_bytes` gets 431 (414 when the request line alone is that long).

Nothing here parses HTTP beyond finding the end of the head; it never logs client data.
"""

from __future__ import annotations

import enum
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpu_audit.errors import GpuAuditError
from gpu_audit.http.config import HttpLimitsConfig

# A connection whose head is not complete this long after it started may be evicted when
# the endpoint is full: long enough for a TLS handshake over a slow link, short next to
# any deadline an attacker could use.
_EVICT_GRACE_S = 1.0
# A connection that has sent nothing at all this long may be evicted when the endpoint is
# full. Shorter: a flood of silent connections is churned through quickly, so a scrape
# queued behind them waits less. Not zero: a client may connect a moment before it
# writes, and evicting it then would fail a genuine scrape in a burst.
_SILENT_GRACE_S = 0.25


class ConnState(enum.Enum):
    HEAD = "head"  # connected or request started, head not complete yet
    BUSY = "busy"  # serving a request: never evicted
    IDLE = "idle"  # kept alive between requests


@dataclass(eq=False)
class Conn:
    """One admitted connection; `fd` stays open until `ConnectionLimiter.release`."""

    fd: int
    accepted: float
    state: ConnState = ConnState.HEAD
    since: float = field(default=0.0)
    heard: bool = False  # has sent at least one byte (or had one waiting when accepted)


class ConnectionLimiter:
    """Admission, eviction and accounting of the endpoint's connections (thread-safe)."""

    def __init__(self, limits: HttpLimitsConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._cond = threading.Condition()
        self._conns: set[Conn] = set()
        self._closing = False
        self.counters = {"accepted": 0, "evicted": 0, "rejected": 0, "head_timeouts": 0,
                         "heads_too_large": 0}

    def admit(self, fd: int) -> Conn | None:
        """Register a new connection, making room if needed; None: reject it (503)."""
        limits = self.limits
        heard = _readable(fd)
        with self._cond:
            now = self._clock()
            deadline = now + limits.header_timeout_seconds
            while len(self._conns) >= limits.max_connections:
                victim = self._victim(now)
                if victim is not None:
                    self._evict(victim)
                    continue
                wake = min([deadline] + [
                    c.since + (_EVICT_GRACE_S if c.heard else _SILENT_GRACE_S)
                    for c in self._conns if c.state is ConnState.HEAD])
                if self._closing or now >= deadline:
                    self.counters["rejected"] += 1
                    return None
                self._cond.wait(max(0.001, wake - now))
                now = self._clock()
            conn = Conn(fd, now, ConnState.HEAD, now, heard)
            self._conns.add(conn)
            self.counters["accepted"] += 1
            return conn

    def _victim(self, now: float) -> Conn | None:
        idle = [c for c in self._conns if c.state is ConnState.IDLE]
        if idle:
            return min(idle, key=lambda c: c.since)
        silent = [c for c in self._conns if c.state is ConnState.HEAD and not c.heard
                  and now - c.since >= _SILENT_GRACE_S]
        if silent:
            return min(silent, key=lambda c: c.since)
        slow = [c for c in self._conns
                if c.state is ConnState.HEAD and now - c.since >= _EVICT_GRACE_S]
        return min(slow, key=lambda c: c.since) if slow else None

    def _evict(self, conn: Conn) -> None:
        # The fd is still open (release() runs before close), so the dup is this socket.
        # shutdown() wakes the connection's thread out of recv(); it then ends and closes.
        self._conns.discard(conn)
        self.counters["evicted"] += 1
        try:
            dup = socket.socket(fileno=os.dup(conn.fd))
        except OSError:
            return
        try:
            dup.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already gone
        finally:
            dup.close()

    def mark(self, conn: Conn, state: ConnState) -> bool:
        """Move `conn` to `state`; False when it was evicted meanwhile (stop serving it)."""
        with self._cond:
            if conn not in self._conns:
                return False
            conn.state = state
            conn.since = self._clock()
            conn.heard = True
            if state is ConnState.IDLE:
                self._cond.notify()  # an admission may now evict it
            return True

    def release(self, conn: Conn) -> None:
        with self._cond:
            self._conns.discard(conn)
            self._cond.notify()

    def count(self, what: str) -> None:
        with self._cond:
            self.counters[what] += 1

    def close(self) -> None:
        """Stop waiting for room (the server is shutting down)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()

    def status(self) -> dict[str, Any]:
        with self._cond:
            states = [c.state.value for c in self._conns]
            return {
                "connections": len(states),
                "busy": states.count("busy"),
                "idle": states.count("idle"),
                "reading_head": states.count("head"),
                "max_connections": self.limits.max_connections,
                **self.counters,
            }


def _readable(fd: int) -> bool:
    """Whether bytes (or EOF) are already waiting on `fd` (poll: no FD_SETSIZE limit)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


class HeadTooLarge(GpuAuditError):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class HeadTimeout(GpuAuditError):
    """The request head did not arrive in time."""


class ConnectionEnded(GpuAuditError):
    """The client closed the connection (or it was evicted) before a complete head."""


def read_head(sock: socket.socket, buf: bytearray, *, wait_until: float,
              head_until: float | None, head_timeout: float, max_bytes: int,
              on_first_byte: Callable[[], None] | None = None,
              clock: Callable[[], float] = time.monotonic) -> bytes:
    """The next request head (request line and headers, without the blank line).

    `buf` holds bytes already received (a pipelined request) and keeps what follows the
    head. The first byte must arrive by `wait_until`; the whole head by `head_until` when
    given, else within `head_timeout` of the first byte. Raises HeadTimeout,
    HeadTooLarge or ConnectionEnded.
    """
    started = False
    deadline = wait_until
    while True:
        # RFC 9112 2.2: ignore empty lines before a request line
        while buf and buf[0] in b"\r\n":
            del buf[:1]
        if buf and not started:
            started = True
            if on_first_byte is not None:
                on_first_byte()
            deadline = head_until if head_until is not None else clock() + head_timeout
        end, sep = buf.find(b"\r\n\r\n"), 4
        lf = buf.find(b"\n\n")
        if lf != -1 and (end == -1 or lf < end):
            end, sep = lf, 2
        if end != -1 and end <= max_bytes:
            head = bytes(buf[:end])
            del buf[:end + sep]
            return head
        if len(buf) > max_bytes or end != -1:
            line_end = buf.find(b"\n", 0, max_bytes)
            raise HeadTooLarge(414 if line_end == -1 else 431)
        remaining = deadline - clock()
        if remaining <= 0:
            raise HeadTimeout
        sock.settimeout(remaining)
        try:
            data = sock.recv(65536)
        except TimeoutError:
            raise HeadTimeout from None
        except OSError as exc:
            raise ConnectionEnded from exc
        if not data:
            raise ConnectionEnded
        buf += data
