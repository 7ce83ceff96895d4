"""The exporter's HTTP endpoint: /metrics, /, /healthz, /readyz, /status.

`/metrics` sends the bytes rendered by the sampler thread (gzipped once per snapshot when
asked) followed by the live registry rendered at scrape time, so the hot path is a
reference read, an optional auth check and a socket write. TLS, basic auth, extra headers
and a rate limit come from an exporter-toolkit web-config (exporter.webconfig); the
bounds on connections, head time and head size (`exporter.http`) from exporter.httpconn.
`/status` adds what the app layer passes as `extra_status` (spool, shipper) as a plain
dict, so this module never imports another component.

This module must never touch NVML, /proc or the network beyond its own socket, never send
a traceback to a client (errors are logged, the client gets a plain 500), and never log
credentials.
"""

from __future__ import annotations

import email.utils
import gzip
import html
import logging
import socket
import ssl
import struct
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, generate_latest

from exporter.config import HttpLimitsConfig
from exporter.httpconn import (
    Conn,
    ConnectionEnded,
    ConnectionLimiter,
    ConnState,
    HeadTimeout,
    HeadTooLarge,
    read_head,
)
from exporter.render import RenderedSnapshot
from exporter.serving import ServingCollector, StateProvider, readiness, snapshot_age
from exporter.webconfig import BasicAuth, RateLimiter, WebConfig, allowed_san, build_ssl_context
from gpu_audit.model.fields import CATALOGUE

log = logging.getLogger(__name__)

CONTENT_TYPE_METRICS = "text/plain; version=0.0.4; charset=utf-8"


# gzip member header: magic, deflate, no flags, mtime 0, no extra flags, unknown OS.
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"


class _GzipCache:
    """The gzip stream of the latest snapshot's body, compressed once per snapshot.

    The body is deflated once and sync-flushed, which ends it on a byte boundary without
    a final block. Each scrape deflates only the small live tail with a fresh compressor
    (its final block closes the stream) and appends the gzip trailer, whose CRC-32
    continues from the body's. The client gets one ordinary gzip member (some clients do
    not read concatenated members), the big part is compressed once per snapshot, and a
    scrape never copies compressor state.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._for: RenderedSnapshot | None = None
        self._prefix = b""
        self._crc = 0
        self._size = 0

    def compress(self, rendered: RenderedSnapshot | None, live: bytes) -> bytes:
        if rendered is None:
            return gzip.compress(live, compresslevel=1, mtime=0)
        with self._lock:
            if self._for is not rendered:
                comp = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
                self._prefix = (_GZIP_HEADER + comp.compress(rendered.body)
                                + comp.flush(zlib.Z_SYNC_FLUSH))
                self._crc = zlib.crc32(rendered.body)
                self._size = len(rendered.body)
                self._for = rendered
            prefix, crc, size = self._prefix, self._crc, self._size
        comp = zlib.compressobj(1, zlib.DEFLATED, -zlib.MAX_WBITS)
        tail = comp.compress(live) + comp.flush()
        trailer = struct.pack("<II", zlib.crc32(live, crc), (size + len(live)) & 0xFFFFFFFF)
        return prefix + tail + trailer


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


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # Connections past max_connections wait here while the slots serve (a burst of
    # scrapes is queued, not refused); the kernel caps it at net.core.somaxconn.
    request_queue_size = 1024

    def __init__(self, addr: tuple[str, int], app: MetricsServer,
                 ssl_ctx: ssl.SSLContext | None, limits: HttpLimitsConfig) -> None:
        self.app = app
        self.ssl_ctx = ssl_ctx
        self.limits = limits
        self.limiter = ConnectionLimiter(limits)
        if ":" in addr[0]:
            self.address_family = socket.AF_INET6
        # _serve_connection builds the handler itself (it needs the admitted Conn)
        super().__init__(addr, _Handler)  # type: ignore[arg-type]

    def process_request(self, request: Any, client_address: Any) -> None:
        # Runs in the accept loop: admission (and eviction) happen before a thread exists.
        conn = self.limiter.admit(request.fileno())
        if conn is None:
            self._refuse(request)
            return
        threading.Thread(target=self._serve_connection, args=(request, client_address, conn),
                         name="gpu-audit-http-conn", daemon=True).start()

    def _refuse(self, request: socket.socket) -> None:
        """Every slot is serving: a fast 503 (plain HTTP) or a close (TLS) instead of a
        wait with no end."""
        if self.ssl_ctx is None:
            try:
                request.setblocking(False)
                request.send(_REFUSED)
            except OSError:
                pass
        self.shutdown_request(request)

    def _serve_connection(self, request: socket.socket, client_address: Any,
                          conn: Conn) -> None:
        sock = request
        try:
            if self.ssl_ctx is not None:
                # The handshake runs here, in the connection's thread, within the head
                # deadline, so a slow or broken client cannot stall accept() or a slot.
                request.settimeout(max(0.001, conn.accepted + self.limits.header_timeout_seconds
                                       - time.monotonic()))
                try:
                    sock = self.ssl_ctx.wrap_socket(request, server_side=True)
                except (ssl.SSLError, OSError) as exc:
                    log.debug("TLS handshake with %s failed: %s", client_address[0], exc)
                    return
            _Handler(sock, client_address, self, conn)
        except Exception:  # noqa: BLE001 - a bug must end this connection only (logged)
            self.handle_error(sock, client_address)
        finally:
            # release before close: the limiter may only touch fds that are still open
            self.limiter.release(conn)
            self.shutdown_request(sock)

    def shutdown(self) -> None:
        self.limiter.close()
        super().shutdown()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.exception("error serving %s", client_address[0] if client_address else "?")


_REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
            b"Retry-After: 1\r\nContent-Length: 20\r\nConnection: close\r\n\r\n"
            b"too many connections")
# A response is written within this long in all (sendall's timeout is a total since
# Python 3.5), so a client that does not read cannot hold a slot longer.
_SEND_TIMEOUT_S = 30.0


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: Prometheus reuses connections
    # Headers and body go out in two writes; with Nagle on, delayed ACKs add ~40 ms.
    disable_nagle_algorithm = True
    server: _Server
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

    def __init__(self, request: Any, client_address: Any, server: _Server,
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
            route = _ROUTES.get(path)
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
        doc = status_document(app.provider)
        doc["http"] = app.connections()
        if app.extra_status is not None:
            doc.update(app.extra_status())
        body = orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
        self._send(200, body, "application/json", head)

    def landing(self, head: bool) -> None:
        self._send(200, landing_page(self.server.app.provider).encode(),
                   "text/html; charset=utf-8", head)


_ROUTES = {
    "/metrics": _Handler.metrics,
    "/healthz": _Handler.healthz,
    "/readyz": _Handler.readyz,
    "/status": _Handler.status,
    "/": _Handler.landing,
}


def status_document(provider: StateProvider) -> dict[str, Any]:
    """The /status JSON: backend, per-GPU state and supported fields, cycle timings."""
    state = provider.state()
    ok, reason = readiness(state)
    snap = state.snapshot
    doc: dict[str, Any] = {
        "ready": ok,
        "reason": reason,
        "snapshot_age_seconds": snapshot_age(state),
        "stale_after_seconds": state.stale_after_seconds,
        "recent_cycle_seconds": list(state.recent_cycle_seconds),
        "series": state.rendered.series if state.rendered else None,
        "dropped_process_series_total": dict(state.dropped_process_series_total),
        "backend": None,
        "gpus": [],
    }
    if snap is not None:
        b = snap.backend
        doc["backend"] = {"name": b.name, "driver_version": b.driver_version,
                          "cuda_version": b.cuda_version, "library_version": b.library_version,
                          "simulated": b.simulated, "detail": b.detail}
        doc["host"] = snap.host
        doc["cycle"] = snap.cycle
        doc["snapshot_timestamp"] = snap.timestamp
        doc["error_counts"] = dict(snap.error_counts)
        for g in snap.gpus:
            doc["gpus"].append({
                "index": g.info.index, "uuid": g.uuid, "name": g.info.name, "up": g.up,
                "error": g.error,
                "supported_fields": [m.name for m in CATALOGUE if m.key in g.values],
                "unsupported_fields": [m.name for m in CATALOGUE if m.key in g.unsupported],
                "processes": len(snap.processes.get(g.uuid, ())),
            })
    return doc


def landing_page(provider: StateProvider) -> str:
    state = provider.state()
    snap = state.snapshot
    backend = html.escape(snap.backend.name) if snap else "(not started)"
    banner = ""
    if snap is not None and snap.backend.simulated:
        banner = ('<p style="background:#fc3;padding:.5em"><b>SIMULATED DATA</b>: this'
                  " exporter runs the scenario simulator; no real GPU is measured.</p>")
    ok, reason = readiness(state)
    return (
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>gpu-audit exporter"
        f"</title></head><body><h1>gpu-audit exporter</h1>{banner}"
        f"<p>Backend: {backend}. Ready: {'yes' if ok else 'no'} ({html.escape(reason)}).</p>"
        '<ul><li><a href="/metrics">/metrics</a></li><li><a href="/status">/status</a></li>'
        '<li><a href="/healthz">/healthz</a></li><li><a href="/readyz">/readyz</a></li></ul>'
        "</body></html>\n"
    )


class MetricsServer:
    """The HTTP endpoint, on daemon threads; `start()` binds and serves, `stop()` ends."""

    def __init__(self, host: str, port: int, provider: StateProvider,
                 web: WebConfig | None = None, registry: CollectorRegistry | None = None,
                 *, limits: HttpLimitsConfig | None = None,
                 extra_status: Callable[[], Mapping[str, Any]] | None = None) -> None:
        self.provider = provider
        # The app layer's sections of /status (spool, shipper, ...): a plain dict, so this
        # module never needs to know the components that produce it.
        self.extra_status = extra_status
        self.web = web or WebConfig()
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        # Snapshot age and the scrape count are computed on every scrape; the other live
        # counters (sampler, audit, shipper) are rendered at most once per
        # `live_cache_seconds`, so concurrent scrapers share that work.
        self.collector = ServingCollector(provider)
        self._serving_registry = CollectorRegistry(auto_describe=True)
        self._serving_registry.register(self.collector)
        self.live_cache_seconds = 1.0
        self._live: tuple[float, bytes] | None = None
        self.auth = BasicAuth(self.web.basic_auth_users)
        self.rate_limiter = RateLimiter(self.web.rate_limit)
        self.gzip_cache = _GzipCache()
        ctx = build_ssl_context(self.web.tls_server_config) if self.web.tls_server_config else None
        self._server = _Server((host, port), self, ctx, limits or HttpLimitsConfig())
        self._thread: threading.Thread | None = None

    def live_bytes(self) -> bytes:
        """The scrape-time families: cached live counters plus the per-scrape ones."""
        now = time.monotonic()
        cached = self._live
        if cached is None or now - cached[0] > self.live_cache_seconds:
            cached = (now, generate_latest(self.registry))
            self._live = cached
        return cached[1] + generate_latest(self._serving_registry)

    def connections(self) -> dict[str, Any]:
        """Connections now (by state) and since start (accepted, evicted, refused, cut)."""
        return self._server.limiter.status()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def tls(self) -> bool:
        return self._server.ssl_ctx is not None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.2},
                                        name="gpu-audit-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:  # shutdown() waits forever for a loop never started
            self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
