"""The HTTP endpoint under abuse: connection cap, head deadline, head size, keep-alive
idle timeout, and scrapes that still answer while idle clients fill the cap."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

import gpu_audit.http.handler as handler_mod
from exporter.exposition.render import RenderOptions, render_snapshot
from gpu_audit.http import connections as httpconn
from gpu_audit.http.config import HttpLimitsConfig
from gpu_audit.http.server import MetricsServer
from gpu_audit.http.state import LatestState
from tests.exporter.exposition.snapshots import small_snapshot
from tests.polling import wait_for


def closed_by_server(sock: socket.socket) -> bool:
    """True once the server has closed `sock` (EOF or reset), without blocking."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(65536, socket.MSG_PEEK) == b""
    except OSError:
        return True


@pytest.fixture
def fast_eviction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httpconn, "_EVICT_GRACE_S", 0.2)


def start(limits: HttpLimitsConfig) -> MetricsServer:
    state = LatestState(stale_after_seconds=15.0)
    snap = small_snapshot()
    state.set_backend(True)
    state.publish(snap, render_snapshot(snap, RenderOptions()))
    srv = MetricsServer("127.0.0.1", 0, state, limits=limits)
    srv.start()
    return srv


@pytest.fixture
def make_server() -> Iterator[Callable[..., MetricsServer]]:
    servers: list[MetricsServer] = []

    def make(**kw: float) -> MetricsServer:
        srv = start(HttpLimitsConfig.model_validate(kw))
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.stop()


def scrape(port: int, timeout: float = 10.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
        chunks = []
        while data := s.recv(65536):
            chunks.append(data)
    return b"".join(chunks)


def test_idle_connections_never_hold_more_threads_than_the_cap_and_are_closed(
        make_server: Callable[..., MetricsServer], fast_eviction: None) -> None:
    """200 clients that connect and send nothing: the endpoint never runs more than
    max_connections connection threads (plus those just evicted, ending), and every one
    of the 200 is closed by the server once its head deadline has passed."""
    cap = 20
    srv = make_server(max_connections=cap, header_timeout_seconds=0.5)
    baseline = threading.active_count()
    clients = [socket.create_connection(("127.0.0.1", srv.port), timeout=5)
               for _ in range(200)]
    peak_threads = peak_conns = 0
    try:
        def all_closed() -> bool:
            nonlocal peak_threads, peak_conns
            peak_threads = max(peak_threads, threading.active_count() - baseline)
            peak_conns = max(peak_conns, srv.connections()["connections"])
            return all(closed_by_server(c) for c in clients)

        wait_for(all_closed, 30, "the server to close every idle connection")
    finally:
        for c in clients:
            c.close()
    assert peak_conns <= cap
    assert peak_threads <= 2 * cap, f"{peak_threads} threads for {cap} connection slots"
    wait_for(lambda: threading.active_count() <= baseline, 10, "connection threads to end")


def test_slowloris_trickling_a_head_is_cut_at_the_deadline(
        make_server: Callable[..., MetricsServer]) -> None:
    """A client sending one header byte every 50 ms (each recv well inside any per-recv
    timeout) is disconnected once the head's total deadline has passed, unanswered."""
    srv = make_server(header_timeout_seconds=1.0)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
        started = time.monotonic()
        cut = False
        while time.monotonic() - started < 10:
            if closed_by_server(s):
                cut = True
                break
            try:
                s.sendall(b"a")
            except OSError:
                cut = True
                break
            time.sleep(0.05)
        elapsed = time.monotonic() - started
        assert cut, "the trickling client was never cut"
        assert elapsed >= 0.5, "cut long before the deadline"
        with contextlib.suppress(OSError):
            assert b"200 OK" not in s.recv(65536)
    assert srv.connections()["head_timeouts"] == 1


def test_oversized_heads_get_431_and_long_request_lines_414(
        make_server: Callable[..., MetricsServer]) -> None:
    """20 headers of 60 KB (1.2 MB in all) get 431; a request line longer than the bound
    gets 414; a head just inside the bound is served."""
    srv = make_server(max_header_bytes=16384)
    big = b"".join(b"X-Big-%d: %s\r\n" % (i, b"v" * 60_000) for i in range(20))
    assert scrape_raw(srv.port, b"GET /metrics HTTP/1.1\r\n" + big + b"\r\n") \
        .startswith(b"HTTP/1.1 431")
    assert scrape_raw(srv.port, b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n") \
        .startswith(b"HTTP/1.1 414")
    fits = b"GET /healthz HTTP/1.1\r\nConnection: close\r\nX-Pad: " + b"p" * 15_000 + b"\r\n\r\n"
    assert scrape_raw(srv.port, fits).startswith(b"HTTP/1.1 200")
    assert srv.connections()["heads_too_large"] == 2


def scrape_raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        # the server may answer and close before the whole request is sent
        with contextlib.suppress(OSError):
            s.sendall(request)
        chunks = []
        try:
            while data := s.recv(65536):
                chunks.append(data)
        except ConnectionResetError:
            pass
    return b"".join(chunks)


def test_scrape_succeeds_while_idle_clients_fill_every_slot(
        make_server: Callable[..., MetricsServer], fast_eviction: None) -> None:
    """With every connection slot held by clients that send nothing (and a long head
    deadline), a normal scrape is still answered 200: it takes the place of the client
    that has been silent longest."""
    cap = 10
    srv = make_server(max_connections=cap, header_timeout_seconds=60)
    idle = [socket.create_connection(("127.0.0.1", srv.port), timeout=5) for _ in range(cap)]
    try:
        wait_for(lambda: srv.connections()["connections"] == cap, 10, "the slots to fill")
        response = scrape(srv.port)
        assert response.startswith(b"HTTP/1.1 200") and b"gpu_up" in response
        assert srv.connections()["evicted"] >= 1
        assert sum(closed_by_server(c) for c in idle) >= 1
    finally:
        for c in idle:
            c.close()


def test_kept_alive_connection_is_closed_after_the_idle_timeout(
        make_server: Callable[..., MetricsServer]) -> None:
    """A keep-alive connection that sends no next request is closed after
    idle_timeout_seconds (it no longer holds its thread forever)."""
    srv = make_server(idle_timeout_seconds=0.5)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
        wait_for(lambda: b"ok\n" in s.recv(65536, socket.MSG_PEEK), 5, "the answer")
        s.recv(65536)
        wait_for(lambda: closed_by_server(s), 10, "the idle connection to be closed")
    assert srv.connections()["connections"] == 0


def test_every_slot_busy_gives_a_fast_503(make_server: Callable[..., MetricsServer],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """When every slot is serving (a request that does not finish) a new connection
    waits at most header_timeout_seconds, then gets 503 with Retry-After."""
    release = threading.Event()
    entered = threading.Event()

    def blocking(handler: handler_mod.RequestHandler, head: bool) -> None:
        entered.set()
        release.wait(30)
        handler._send(200, b"done\n", "text/plain", head)

    monkeypatch.setitem(handler_mod.ROUTES, "/block", blocking)
    srv = make_server(max_connections=1, header_timeout_seconds=0.5)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as busy:
        busy.sendall(b"GET /block HTTP/1.1\r\nConnection: close\r\n\r\n")
        assert entered.wait(10)
        response = scrape(srv.port)
        assert response.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in response
        release.set()
        assert busy.recv(65536).startswith(b"HTTP/1.1 200")
    assert srv.connections()["rejected"] == 1


def test_pipelined_requests_on_one_connection_are_all_answered(
        make_server: Callable[..., MetricsServer]) -> None:
    """Two requests sent in one write are answered in order (bytes past a head are kept
    for the next one)."""
    srv = make_server()
    response = scrape_raw(srv.port, b"GET /healthz HTTP/1.1\r\n\r\n"
                                    b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert response.count(b"HTTP/1.1 200") == 2
