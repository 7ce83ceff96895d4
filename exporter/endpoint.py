"""The exporter's HTTP endpoint: core's MetricsServer with what the exporter says on
/status (the backend, each GPU's state and supported fields, the cycle timings) and on /
(a landing page that warns of simulated data).

The server itself (gpu_audit.http.server) knows no component; this module gives it the
exporter's content. Reads the latest state only: never samples, never reads /proc.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from gpu_audit.http.config import HttpLimitsConfig
from gpu_audit.http.server import MetricsServer, state_document
from gpu_audit.http.state import StateProvider, readiness
from gpu_audit.http.webconfig import WebConfig
from gpu_audit.model.fields import CATALOGUE


def status_document(provider: StateProvider) -> dict[str, Any]:
    """The /status JSON: backend, per-GPU state and supported fields, cycle timings."""
    state = provider.state()  # one view for the whole document
    snap = state.snapshot
    doc = state_document(state)
    doc["backend"] = None
    doc["gpus"] = []
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
    """The exporter's page: backend, readiness, links, and a banner for simulated data."""
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


def exporter_server(host: str, port: int, provider: StateProvider,
                    web: WebConfig | None = None, registry: CollectorRegistry | None = None,
                    *, limits: HttpLimitsConfig | None = None,
                    extra_status: Callable[[], Mapping[str, Any]] | None = None,
                    ) -> MetricsServer:
    """The exporter's endpoint; `extra_status` adds the sections of the components that
    run beside it (sampler, audit, spool, shipper) to /status, as plain data."""

    def status() -> dict[str, Any]:
        doc = status_document(provider)
        if extra_status is not None:
            doc.update(extra_status())
        return doc

    return MetricsServer(host, port, provider, web, registry, limits=limits, status=status,
                         landing=lambda: landing_page(provider))
