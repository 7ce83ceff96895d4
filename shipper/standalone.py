"""`gpu-audit shipper`: the shipper as its own process, beside an exporter that writes the spool.

Builds the engine from the whole configuration, optionally serves its metrics
(`shipper.metrics_listen`, through core's HTTP endpoint, gpu_audit.http, with TLS and
basic auth from its own `shipper.web_config_file`), runs until SIGTERM/SIGINT and
returns the exit code. It never opens the spool for writing (the exporter holds the
single-writer lock and runs the segment GC with `gpu_audit.spool.gc_floor`).

Start-up order: configuration and secrets (ConfigError, exit 2), the shipper's locks
(another shipper on the same cursors, archive or dead-letter directory: exit 1 naming
its pid), the metrics socket (a port in use: exit 1); only then does shipping begin.
"""

from __future__ import annotations

import logging
import math
import sys
from typing import Protocol

from prometheus_client import CollectorRegistry

from gpu_audit.errors import EXIT_FAILURE, LockHeld
from gpu_audit.http.config import parse_listen
from gpu_audit.http.server import MetricsServer
from gpu_audit.http.state import LatestState
from gpu_audit.http.webconfig import WebConfig, load_web_config
from gpu_audit.spool.config import SpoolConfig
from shipper.config import ShipperConfig
from shipper.engine import Shipper

log = logging.getLogger(__name__)


class ShipperSettings(Protocol):
    """The configuration sections the standalone shipper reads (the app layer's root
    configuration has them; read-only, as the frozen models are)."""

    @property
    def shipper(self) -> ShipperConfig: ...

    @property
    def spool(self) -> SpoolConfig: ...


def run_shipper(config: ShipperSettings, seal_key: bytes | None = None) -> int:
    """Run the standalone shipper until a stop signal; 0 after a clean stop. `seal_key`:
    the trail's HMAC key, which the archive sink's seals carry a MAC under.

    Raises ConfigError (a sink's missing secret, ...) before anything is started.
    """
    web_file = config.shipper.web_config_file
    web = load_web_config(web_file) if web_file is not None else WebConfig()
    listen = config.shipper.metrics_listen
    address = parse_listen(listen) if listen is not None else None
    try:
        shipper = Shipper(config.shipper, config.spool, seal_key=seal_key)
    except LockHeld as exc:
        print(f"gpu-audit: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except OSError as exc:
        print(f"gpu-audit: cannot start the shipper: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    server: MetricsServer | None = None
    if address is not None:
        registry = CollectorRegistry()
        registry.register(shipper.collector())
        state = LatestState(math.inf, snapshots_expected=False)
        try:
            server = MetricsServer(address[0], address[1], state, web, registry,
                                   title="gpu-audit shipper")
        except OSError as exc:
            shipper.stop()
            print(f"gpu-audit: cannot listen on {listen}: {exc.strerror or exc}",
                  file=sys.stderr)
            return EXIT_FAILURE
        server.start()
        state.set_backend(True)
        # the bound port, not the configured one: with port 0 this line is how it is learnt
        log.info("shipper metrics on %s://%s:%d/metrics", "https" if server.tls else "http",
                 address[0], server.port)
    log.info("shipping %s to %s", config.spool.directory,
             ", ".join(s.name for s in shipper.sinks) or "no sinks")
    try:
        return shipper.run_forever()
    finally:
        if server is not None:
            server.stop()
