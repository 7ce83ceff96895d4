"""The port helpers of the tests themselves: a server that loses its port to another
process between `free_port()` and its bind is not mistaken for one that started, and the
real-server fixtures start it again on another port."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from tests.netutil import free_port, owns_listener
from tests.realservers import PortLost, _Server, _start_on_free_ports


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def impostor() -> Iterator[int]:
    """Another process's server (here: a thread) holding a port and answering 200."""
    server = HTTPServer(("127.0.0.1", 0), _Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _http_server(port: int, tmp_path: Path) -> _Server:
    return _Server([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                   f"http://127.0.0.1:{port}", "/", tmp_path / f"log-{port}.txt")


def test_a_server_whose_port_was_taken_is_not_taken_for_started(
    impostor: int, tmp_path: Path
) -> None:
    """The port answers 200, but not from our process (it failed to bind): start()
    raises PortLost instead of returning as if our server were up."""
    server = _http_server(impostor, tmp_path)
    with pytest.raises(PortLost):
        server.start()
    server.stop()


def test_the_fixture_starts_again_on_another_port(impostor: int, tmp_path: Path) -> None:
    """_start_on_free_ports retries with a fresh port when the first was lost."""
    ports = iter([impostor, free_port()])
    server = _start_on_free_ports(lambda: _http_server(next(ports), tmp_path))
    try:
        assert server.proc is not None
        port = int(server.url.rsplit(":", 1)[1])
        assert port != impostor and owns_listener(server.proc.pid, port)
    finally:
        server.stop()
