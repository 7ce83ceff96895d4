"""One HTTP connection of the endpoint: read each request head within its deadline and
bound (connections.py), parse it, check rate limit, client certificate and basic auth
(webconfig.py), and answer from the routes (/metrics, /healthz, /readyz, /status, /).

The request line and headers are parsed here, not by the standard library's e-mail
parser (a scrape's largest CPU cost). A handler bug ends in a logged 500, never a
traceback sent to the client; credentials are never logged.
"""

from __future__ import annotations

import email.utils
import logging
import ssl
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

import orjson

from gpu_audit.http.connections import (
    Conn,
    ConnectionEnded,
    ConnState,
    HeadTimeout,
    HeadTooLarge,
    read_head,
)
from gpu_audit.http.state import readiness
from gpu_audit.http.webconfig import allowed_san

if TYPE_CHECKING:
    from gpu_audit.http.server import HttpServer

log = logging.getLogger("gpu_audit.http.server")  # one logger for the endpoint

CONTENT_TYPE_METRICS = "text/plain; version=0.0.4; charset=utf-8"


class _Headers(dict[str, str]):
    """Request headers by lower-cased name; `get` ignores case like email.Message."""

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key.lower(), default)


_date_cache: tuple[int, str] = (0, "")


def _http_date() -> str:
    """The Date header value, formatted once per second instead of once per response."""
    global _date_cache  # noqa: PLW0603 - a tiny per-process memo, replaced atomically
    now = int(time.time())
    cached = _date_cache
    if cached[0] != now:
        cached = (now, email.utils.formatdate(now, usegmt=True))
        _date_cache = cached
    return cached[1]


# A response is written within this long in all (sendall's timeout is a total since
# Python 3.5), so a client that does not read cannot hold a slot longer.
_SEND_TIMEOUT_S = 30.0


class RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: Prometheus reuses connections
    # Headers and body go out in two writes; with Nagle on, delayed ACKs add ~40 ms.
    disable_nagle_algorithm = True
    server: HttpServer
    server_version = "gpu-audit"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if log.isEnabledFor(logging.DEBUG):
            super().log_request(code, size)

    def date_time_string(self, timestamp: float | None = None) -> str:
        if timestamp is not None:
            return super().date_time_string(timestamp)
        return _http_date()

    def __init__(self, request: Any, client_address: Any, server: HttpServer,
                 conn: Conn) -> None:
        self.conn = conn
        self._buf = bytearray()  # bytes received past the current head (pipelining)
        self._served = 0
        self._head_lines: list[bytes] = []
        super().__init__(request, client_address, server)

    def handle_one_request(self) -> None:
        """Read one head within its deadline and bound, parse it, dispatch it."""
        self.close_connection = True
        srv = self.server
        limits, limiter, conn = srv.limits, srv.limiter, self.conn
        try:
            if self._served == 0:  # the first head is due header_timeout after accept
                due = conn.accepted + limits.header_timeout_seconds
                head = read_head(self.connection, self._buf, wait_until=due, head_until=due,
                                 head_timeout=limits.header_timeout_seconds,
                                 max_bytes=limits.max_header_bytes,
                                 on_first_byte=lambda: self._mark(ConnState.HEAD))
            else:
                head = read_head(
                    self.connection, self._buf,
                    wait_until=time.monotonic() + limits.idle_timeout_seconds, head_until=None,
                    head_timeout=limits.header_timeout_seconds,
                    max_bytes=limits.max_header_bytes,
                    on_first_byte=lambda: self._mark(ConnState.HEAD))
        except HeadTooLarge as exc:
            limiter.count("heads_too_large")
            self.connection.settimeout(_SEND_TIMEOUT_S)
            self.request_version = "HTTP/1.1"
            self.requestline = ""
            self.send_error(exc.status, "Request head too large")
            return
        except HeadTimeout:
            if self._served == 0 or self._buf:
                limiter.count("head_timeouts")
            return
        except ConnectionEnded:
            return
        if not limiter.mark(conn, ConnState.BUSY):
            return  # evicted between the last byte and now
        self.connection.settimeout(_SEND_TIMEOUT_S)
        lines = head.split(b"\n")
        self.raw_requestline = lines[0]
        self._head_lines = lines[1:]
        if not self.parse_request():
            return
        method = getattr(self, "do_" + self.command, None)
        if method is None:
            self.send_error(501, f"Unsupported method ({self.command!r})")
            return
        method()
        self.wfile.flush()
        self._served += 1
        if not self.close_connection:
            limiter.mark(conn, ConnState.IDLE)

    def _mark(self, state: ConnState) -> None:
        self.server.limiter.mark(self.conn, state)

    def parse_request(self) -> bool:
        """The request line and headers, parsed directly from the head read above.

        The standard library runs every request's headers through the e-mail parser,
        which was ~40% of a scrape's CPU. Scrapes are GET/HEAD with a handful of headers,
        so a line split does the same job; errors follow the standard handler (431 for
        too many headers, 400 for malformed lines; the size bound is read_head's).
        """
        self.command = ""
        # Errors before a valid request line still answer with an HTTP/1.1 status line
        # (never an HTTP/0.9 body-only reply).
        self.request_version = version = "HTTP/1.1"
        self.close_connection = True
        raw: bytes = self.raw_requestline
        requestline = str(raw, "iso-8859-1").rstrip("\r\n")
        self.requestline = requestline
        words = requestline.split()
        if len(words) != 3 or not words[2].startswith("HTTP/1."):
            self.send_error(400, f"Bad request line ({requestline!r})")
            return False
        self.command, self.path, self.request_version = words
        version = words[2]
        headers = _Headers()
        for line in self._head_lines:
            if len(headers) >= 100:
                self.send_error(431, "Too many headers")
                return False
            name, sep, value = line.decode("iso-8859-1").partition(":")
            if not sep or not name.strip():
                self.send_error(400, "Malformed header line")
                return False
            headers[name.strip().lower()] = value.strip()
        self.headers = headers  # type: ignore[assignment]
        connection = headers.get("connection", "").lower()
        self.close_connection = connection == "close" or (
            version == "HTTP/1.0" and connection != "keep-alive")
        return True

    def do_GET(self) -> None:
        self._dispatch(head=False)

    def do_HEAD(self) -> None:
        self._dispatch(head=True)

    def _dispatch(self, head: bool) -> None:
        app = self.server.app
        try:
            if not app.rate_limiter.allow():
                self._send(429, b"too many requests\n", "text/plain; charset=utf-8", head)
                return
            if not self._client_allowed():
                self._send(403, b"client certificate not allowed\n",
                           "text/plain; charset=utf-8", head)
                return
            if not app.auth.check(self.headers.get("Authorization")):
                self._send(401, b"unauthorized\n", "text/plain; charset=utf-8", head,
                           extra={"WWW-Authenticate": 'Basic realm="gpu-audit"'})
                return
            path = self.path.split("?", 1)[0]
            route = ROUTES.get(path)
            if route is None:
                self._send(404, b"not found\n", "text/plain; charset=utf-8", head)
                return
            route(self, head)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception:  # a handler bug must not kill the server or leak a traceback
            log.exception("error handling %s", self.path)
            try:
                self._send(500, b"internal error\n", "text/plain; charset=utf-8", head)
            except OSError:
                self.close_connection = True

    def _client_allowed(self) -> bool:
        tls = self.server.app.web.tls_server_config
        if tls is None or not tls.client_allowed_sans:
            return True
        conn = self.connection
        peer: dict[str, Any] | None = (conn.getpeercert() if isinstance(conn, ssl.SSLSocket)
                                       else None)
        return allowed_san(peer, tls.client_allowed_sans)

    def _send(self, code: int, body: bytes, ctype: str, head: bool, *,
              extra: dict[str, str] | None = None, encoding: str | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        if encoding:
            self.send_header("Content-Encoding", encoding)
        for k, v in self.server.app.web.http_server_config.headers.items():
            self.send_header(k, v)
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    # --- routes ------------------------------------------------------------------------
    def metrics(self, head: bool) -> None:
        app = self.server.app
        app.collector.count_scrape()
        state = app.provider.state()
        live = app.live_bytes()
        rendered = state.rendered
        gz = "gzip" in self.headers.get("Accept-Encoding", "")
        if gz:
            body = app.gzip_cache.compress(rendered, live)
            self._send(200, body, CONTENT_TYPE_METRICS, head,
                       extra={"Vary": "Accept-Encoding"}, encoding="gzip")
        else:
            body = (rendered.body if rendered is not None else b"") + live
            self._send(200, body, CONTENT_TYPE_METRICS, head, extra={"Vary": "Accept-Encoding"})

    def healthz(self, head: bool) -> None:
        self._send(200, b"ok\n", "text/plain; charset=utf-8", head)

    def readyz(self, head: bool) -> None:
        ok, reason = readiness(self.server.app.provider.state())
        self._send(200 if ok else 503, f"{reason}\n".encode(), "text/plain; charset=utf-8",
                   head)

    def status(self, head: bool) -> None:
        app = self.server.app
        doc = dict(app.status())
        doc["http"] = app.connections()
        body = orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
        self._send(200, body, "application/json", head)

    def landing(self, head: bool) -> None:
        self._send(200, self.server.app.landing().encode(), "text/html; charset=utf-8", head)


ROUTES: dict[str, Callable[[RequestHandler, bool], None]] = {
    "/metrics": RequestHandler.metrics,
    "/healthz": RequestHandler.healthz,
    "/readyz": RequestHandler.readyz,
    "/status": RequestHandler.status,
    "/": RequestHandler.landing,
}
