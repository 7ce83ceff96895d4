"""`gpu-audit shipper`: the shipper as its own process, beside an exporter that writes the spool.

Builds the engine from the whole configuration, optionally serves its metrics
(`shipper.metrics_listen`, through the exporter's HTTP endpoint code, with TLS and basic
auth from its own `shipper.web_config_file`), runs until SIGTERM/SIGINT and returns the
exit code. It never
opens the spool for writing (the exporter holds the single-writer lock and runs the
segment GC with `shipper.engine.gc_floor`).
"""

from __future__ import annotations

import logging
import math

from prometheus_client import CollectorRegistry

from exporter.config import parse_listen
from exporter.http import MetricsServer
from exporter.serving import LatestState
from exporter.webconfig import WebConfig, load_web_config
from gpu_audit.config import Config
from shipper.engine import Shipper

log = logging.getLogger(__name__)


def run_shipper(config: Config) -> int:
    """Run the standalone shipper until a stop signal; 0 after a clean stop.

    Raises ConfigError (a sink's missing secret, ...) before anything is started.
    """
    web_file = config.shipper.web_config_file
    web = load_web_config(web_file) if web_file is not None else WebConfig()
    shipper = Shipper(config.shipper, config.spool)
    server: MetricsServer | None = None
    listen = config.shipper.metrics_listen
    if listen is not None:
        host, port = parse_listen(listen)
        registry = CollectorRegistry()
        registry.register(shipper.collector())
        state = LatestState(math.inf, snapshots_expected=False)
        server = MetricsServer(host, port, state, web, registry)
        server.start()
        state.set_backend(True)
        log.info("shipper metrics on %s://%s/metrics", "https" if server.tls else "http",
                 listen)
    log.info("shipping %s to %s", config.spool.directory,
             ", ".join(s.name for s in shipper.sinks) or "no sinks")
    try:
        return shipper.run_forever()
    finally:
        if server is not None:
            server.stop()
