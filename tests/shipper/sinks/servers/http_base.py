"""Shared plumbing of the in-process HTTP fault servers: a threaded server on a free
loopback port, and a queue of misbehaviours consumed one per request.

A Fault says what the next matching request gets instead of a normal answer:
a status (with an optional Retry-After and body), a delay before the normal answer, or a
connection reset (the socket is closed with RST, no response at all).
"""

from __future__ import annotations

import collections
import gzip
import socket
import struct
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


@dataclass
class Fault:
    status: int | None = None
    body: bytes = b""
    retry_after: str | None = None
    delay_s: float = 0.0
    reset: bool = False
    path_contains: str = ""  # only requests whose path contains this consume the fault


class FaultServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.faults: collections.deque[Fault] = collections.deque()
        self.requests: list[tuple[str, str]] = []  # (method, path) seen
        self.lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def add_fault(self, fault: Fault, times: int = 1) -> None:
        with self.lock:
            for _ in range(times):
                self.faults.append(fault)

    def take_fault(self, path: str) -> Fault | None:
        with self.lock:
            for i, fault in enumerate(self.faults):
                if fault.path_contains in path:
                    del self.faults[i]
                    return fault
        return None

    def __enter__(self) -> FaultServer:
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()
        self.server_close()


class FaultHandler(BaseHTTPRequestHandler):
    server: FaultServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return

    def read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        return body

    def reply(
        self,
        status: int,
        body: bytes = b"",
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if body or status not in (204, 304):
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def reset_connection(self) -> None:
        # SO_LINGER 0 makes close() send RST: the client sees a reset, not a clean EOF
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.close_connection = True

    def apply_fault(self, extra_headers: dict[str, str] | None = None) -> bool:
        """Apply the next fault for this path; True if the request has been answered."""
        with self.server.lock:
            self.server.requests.append((self.command, self.path))
        fault = self.server.take_fault(self.path)
        if fault is None:
            return False
        if fault.delay_s:
            time.sleep(fault.delay_s)
        if fault.reset:
            self.reset_connection()
            return True
        if fault.status is None:
            return False
        headers = dict(extra_headers or {})
        if fault.retry_after is not None:
            headers["Retry-After"] = fault.retry_after
        self.reply(fault.status, fault.body, headers=headers)
        return True
