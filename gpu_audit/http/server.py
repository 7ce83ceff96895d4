"""The HTTP endpoint every component serves: /metrics, /, /healthz, /readyz, /status.

`/metrics` sends the bytes a component rendered for its latest state (gzipped once per
snapshot when asked, gzipcache.py) followed by the live registry rendered at scrape time,
so the hot path is a reference read, an optional auth check and a socket write. TLS, basic
auth, extra headers and a rate limit come from an exporter-toolkit web-config
(webconfig.py); the bounds on connections, head time and head size from connections.py.
What `/status` and `/` say is the component's business: it passes them in (`status`,
`landing`), so this module knows no component (the exporter's are in exporter/endpoint.py).

This module must never touch NVML, /proc or the network beyond its own socket, never send
a traceback to a client (errors are logged, the client gets a plain 500), and never log
credentials.
"""

from __future__ import annotations

import html
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from http.server import ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from gpu_audit.http.config import HttpLimitsConfig
from gpu_audit.http.connections import (
    Conn,
    ConnectionLimiter,
)
from gpu_audit.http.gzipcache import GzipCache
from gpu_audit.http.handler import RequestHandler
from gpu_audit.http.state import (
    ServingCollector,
    ServingState,
    StateProvider,
    readiness,
    snapshot_age,
)
from gpu_audit.http.webconfig import (
    BasicAuth,
    RateLimiter,
    WebConfig,
    build_ssl_context,
)

log = logging.getLogger(__name__)

class HttpServer(ThreadingHTTPServer):
    """The listening socket: admits each connection (connections.py) before a thread exists
    for it, then serves it with a RequestHandler on its own thread."""

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
        super().__init__(addr, RequestHandler)  # type: ignore[arg-type]

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
            RequestHandler(sock, client_address, self, conn)
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


def state_document(state: ServingState) -> dict[str, Any]:
    """The part of /status every endpoint has: readiness, snapshot age, cycle timings."""
    ok, reason = readiness(state)
    return {
        "ready": ok,
        "reason": reason,
        "snapshot_age_seconds": snapshot_age(state),
        "stale_after_seconds": state.stale_after_seconds,
        "recent_cycle_seconds": list(state.recent_cycle_seconds),
        "series": state.rendered.series if state.rendered else None,
        "dropped_process_series_total": dict(state.dropped_process_series_total),
    }


def landing_page(provider: StateProvider, title: str) -> str:
    """A plain page linking the endpoints, for a component that has nothing to add."""
    ok, reason = readiness(provider.state())
    name = html.escape(title)
    return (
        f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{name}</title></head>"
        f"<body><h1>{name}</h1><p>Ready: {'yes' if ok else 'no'} ({html.escape(reason)}).</p>"
        '<ul><li><a href="/metrics">/metrics</a></li><li><a href="/status">/status</a></li>'
        '<li><a href="/healthz">/healthz</a></li><li><a href="/readyz">/readyz</a></li></ul>'
        "</body></html>\n"
    )


class MetricsServer:
    """The HTTP endpoint, on daemon threads; `start()` binds and serves, `stop()` ends."""

    def __init__(self, host: str, port: int, provider: StateProvider,
                 web: WebConfig | None = None, registry: CollectorRegistry | None = None,
                 *, limits: HttpLimitsConfig | None = None,
                 status: Callable[[], Mapping[str, Any]] | None = None,
                 landing: Callable[[], str] | None = None,
                 title: str = "gpu-audit") -> None:
        self.provider = provider
        # What /status and / say: the component's own content (the exporter's GPUs, the
        # app layer's spool and shipper sections), plain data, so this module never needs
        # to know the components that produce it.
        self.status: Callable[[], Mapping[str, Any]] = (
            status if status is not None else lambda: state_document(provider.state()))
        self.landing: Callable[[], str] = (
            landing if landing is not None else lambda: landing_page(provider, title))
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
        self.gzip_cache = GzipCache()
        ctx = build_ssl_context(self.web.tls_server_config) if self.web.tls_server_config else None
        self._server = HttpServer((host, port), self, ctx, limits or HttpLimitsConfig())
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
