"""The daemon's socket loop in-process (launcher/connections.py): byte budgets that cannot
deadlock, deadlines, accept failures, and the client that reads while it writes."""

from __future__ import annotations

import errno
import logging
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from launcher.connections import ConnectionLoop
from launcher.limits import DaemonLimits
from launcher.loopstats import LoopStats
from launcher.peer import Caller, peer_of
from launcher.protocol import RequestTooLarge, call
from tests.polling import wait_for


class _Running:
    """A ConnectionLoop on a real unix socket, polled by a thread."""

    def __init__(self, limits: DaemonLimits, listener: Any = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="gpu-audit-conn-"))
        self.path = self.dir / "s"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(self.path))
        sock.listen(128)
        sock.setblocking(False)
        self.sock = sock
        self.stats = LoopStats()
        self.loop = ConnectionLoop(listener(sock) if listener else sock, self._answer,
                                   lambda s: peer_of(s, admin=None), limits=limits,
                                   stats=self.stats)
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def _answer(caller: Caller, line: bytes, token: object) -> dict[str, Any]:
        return {"ok": True, "bytes": len(line)}

    def _run(self) -> None:
        while not self._stop:
            self.loop.poll(0.02)

    def close(self) -> None:
        self._stop = True
        self._thread.join(10)
        self.loop.close()
        self.sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def small() -> Iterator[_Running]:
    r = _Running(DaemonLimits(max_request_bytes=4096, max_buffered_bytes=64 * 1024,
                              per_uid_connections=64, request_timeout_seconds=1,
                              write_timeout_seconds=1))
    yield r
    r.close()


def test_unfinished_requests_cannot_hold_the_byte_budget(small: _Running) -> None:
    """40 connections of one uid each hold 3 KiB of an unfinished request (far past the
    uid's quarter of the budget), then finish it: every one is answered, because the
    fullest unfinished request of a uid over budget is always read."""
    socks = []
    for _ in range(40):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(small.path))
        s.sendall(b'{"pad": "' + b"x" * 3000)
        socks.append(s)
    quarter = 64 * 1024 // 4
    # Wait until the daemon has read up to the uid's quarter of the budget (so the bound
    # below is tested under pressure, not before anything was read), then watch it hold.
    wait_for(lambda: small.loop.buffered_bytes >= quarter, 10,
             "the daemon to buffer the uid's quarter of the budget")
    peak = 0
    for _ in range(20):
        peak = max(peak, small.loop.buffered_bytes)
        time.sleep(0.01)
    assert peak <= quarter + 2 * 4097  # a read past the line
    for s in socks:
        s.sendall(b'"}\n')
    answers = []
    for s in socks:
        s.settimeout(5)
        answers.append(s.recv(100))
        s.close()
    assert all(a.startswith(b'{"ok":true') for a in answers), answers


def test_a_client_that_trickles_is_dropped_at_its_deadline(small: _Running) -> None:
    """A request sent a byte at a time slower than request_timeout_seconds is dropped and
    counted; the connection is closed by the daemon."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(small.path))
    s.settimeout(5)
    s.sendall(b"{")
    assert s.recv(100) == b"", "the slow client was not dropped"
    assert small.stats.count("dropped", "read_timeout") == 1
    s.close()


def test_accept_failures_pause_accepting_and_are_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    """accept() failing with EMFILE (injected: the first 5 calls) is counted each time,
    logged once, and accepting resumes after a backoff: the client is then served."""
    failures = [5]

    class Flaky:
        def __init__(self, sock: socket.socket) -> None:
            self._sock = sock

        def accept(self) -> tuple[socket.socket, Any]:
            if failures[0] > 0:
                failures[0] -= 1
                raise OSError(errno.EMFILE, "Too many open files")
            return self._sock.accept()

        def fileno(self) -> int:
            return self._sock.fileno()

    caplog.set_level(logging.INFO, logger="launcher.connections")
    r = _Running(DaemonLimits(), listener=Flaky)
    try:
        assert call(r.path, {"op": "ping"}, timeout=10)["ok"]
        assert r.stats.count("accept_errors", "EMFILE") == 5
        errors = [m for m in caplog.messages if "cannot accept connections" in m]
        assert len(errors) == 1, caplog.messages
        assert any("accepting connections again" in m for m in caplog.messages)
    finally:
        r.close()


def test_the_client_reports_a_request_the_daemon_refused_for_its_size(
        small: _Running) -> None:
    """The client keeps reading while it writes: a 200 KiB request refused at 4 KiB is
    reported with its size and the limit, never a broken pipe."""
    with pytest.raises(RequestTooLarge) as info:
        call(small.path, {"op": "submit", "spec": "x" * 200_000}, timeout=10)
    assert info.value.limit == 4096 and info.value.size > 200_000
    assert str(info.value) == f"request too large: {info.value.size} bytes, limit 4096"
    assert small.stats.count("dropped", "too_large") == 1


def test_per_uid_cap_refuses_with_the_uid_and_the_cap() -> None:
    """A uid past per_uid_connections gets "too many connections for uid U: N" at once;
    its other connections keep their slots."""
    r = _Running(DaemonLimits(per_uid_connections=2))
    try:
        held = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2)]
        for s in held:
            s.connect(str(r.path))
        time.sleep(0.1)
        extra = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        extra.connect(str(r.path))
        extra.settimeout(5)
        import os

        assert extra.recv(200).decode() == (
            '{"ok":false,"error":"busy","message":"too many connections for uid '
            f'{os.getuid()}: 2","retry":true}}\n')
        assert r.stats.count("refused", "per_uid") == 1
        held[0].sendall(b'{"op":"ping"}\n')
        held[0].settimeout(5)
        assert held[0].recv(100).startswith(b'{"ok":true')
    finally:
        r.close()


def test_connect_rate_per_uid_refuses_the_excess_cheaply_and_recovers() -> None:
    """A uid opening connections faster than per_uid_connect_rate (past its burst) is
    answered busy, marked retryable, counted; once the bucket refills it is served."""
    r = _Running(DaemonLimits(per_uid_connect_rate=5, per_uid_connect_burst=3))
    try:
        answers = []
        for _ in range(6):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(r.path))
            s.sendall(b'{"op":"ping"}\n')
            s.settimeout(5)
            answers.append(s.recv(300).decode())
            s.close()
        busy = [a for a in answers if '"error":"busy"' in a]
        assert busy and all('"retry":true' in a and "new connections" in a for a in busy)
        assert r.stats.count("refused", "per_uid_rate") == len(busy)
        time.sleep(0.5)  # the bucket refills at 5 a second
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(r.path))
        s.sendall(b'{"op":"ping"}\n')
        s.settimeout(5)
        assert s.recv(100).startswith(b'{"ok":true')
    finally:
        r.close()


def test_the_client_retries_a_full_queue_then_says_the_daemon_is_busy() -> None:
    """A daemon whose listen queue is full (here: a listener that never accepts, its
    queue filled): the client keeps trying for a few seconds, then raises DaemonBusy
    with a message that says so, instead of "Resource temporarily unavailable"."""
    from launcher.protocol import BUSY_RETRY_SECONDS, DaemonBusy

    d = Path(tempfile.mkdtemp())
    path = d / "full.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(0)
    fillers = []
    try:
        while True:  # fill the queue: the next connect would get EAGAIN
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(str(path))
            except BlockingIOError:
                s.close()
                break
            fillers.append(s)
        with pytest.raises(DaemonBusy) as err:
            call(path, {"op": "ping"}, timeout=30)
        assert f"took no new connection for {BUSY_RETRY_SECONDS:g} s" in str(err.value)
        assert "queue is full" in str(err.value)
    finally:
        for s in fillers:
            s.close()
        listener.close()
        shutil.rmtree(d, ignore_errors=True)
