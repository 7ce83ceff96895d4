"""`gpu-audit shipper`: the shipper as its own process, beside an exporter that writes the spool.

Builds the engine from the whole configuration, optionally serves its metrics
(`shipper.metrics_listen`), runs until SIGTERM/SIGINT and returns the exit code. It never
opens the spool for writing (the exporter holds the single-writer lock and runs the
segment GC with `shipper.engine.gc_floor`).
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, start_http_server

from gpu_audit.config import Config
from shipper.engine import Shipper

log = logging.getLogger(__name__)


def run_shipper(config: Config) -> int:
    """Run the standalone shipper until a stop signal; 0 after a clean stop.

    Raises ConfigError (a sink's missing secret, ...) before anything is started.
    """
    shipper = Shipper(config.shipper, config.spool)
    listen = config.shipper.metrics_listen
    if listen is not None:
        host, _, port = listen.rpartition(":")
        registry = CollectorRegistry()
        registry.register(shipper.collector())
        start_http_server(int(port), addr=host or "0.0.0.0", registry=registry)  # noqa: S104
        log.info("shipper metrics on http://%s/metrics", listen)
    log.info("shipping %s to %s", config.spool.directory,
             ", ".join(s.name for s in shipper.sinks) or "no sinks")
    return shipper.run_forever()
