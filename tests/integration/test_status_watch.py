"""/status shows the spool and each sink's shipper state, and the summary line and the
spool's refusal are logged, for a real `gpu-audit run` process (in-process ExporterApp
with the app layer's embedded shipper)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.app import ExporterApp
from gpu_audit_app.config import Config
from gpu_audit_app.run import exporter_app
from tests.netutil import http_get
from tests.polling import wait_for


def make_config(tmp: Path, **spool: int) -> Config:
    return Config.model_validate({
        "exporter": {"backend": "sim", "scenario": "xid", "time_scale": 60,
                     "interval_seconds": 0.05, "listen": "127.0.0.1:0",
                     "log_summary_interval_seconds": 0.2},
        # records every cycle: the simulator dates them on the wall clock, so the
        # default 60 s audit interval would write none within the test's seconds
        "audit": {"interval_seconds": 0.05},
        "spool": {"directory": str(tmp / "spool"), "min_free_bytes": 0, **spool},
        "shipper": {"batch_max_wait_s": 0.05, "poll_interval_s": 0.05,
                    "sinks": [{"type": "archive", "directory": str(tmp / "archive")}]},
    })


@pytest.fixture
def running() -> Iterator[list[ExporterApp]]:
    apps: list[ExporterApp] = []
    yield apps
    for app in apps:
        app.stop()


def status(app: ExporterApp) -> dict[str, Any]:
    assert app.server is not None
    code, body = http_get(f"http://127.0.0.1:{app.server.port}/status")
    assert code == 200
    doc: dict[str, Any] = json.loads(body)
    return doc


def test_status_shows_spool_and_per_sink_shipper_state(
        tmp_path: Path, running: list[ExporterApp], caplog: pytest.LogCaptureFixture) -> None:
    """`gpu-audit run` wiring: /status has the spool (bytes, free bytes, writable, records
    held) and, per sink, its position, delivered count, lag and hold; the connection
    counters; and the summary line is logged with the same numbers."""
    app = exporter_app(make_config(tmp_path), with_shipper=True)
    running.append(app)
    with caplog.at_level(logging.INFO, logger="gpu_audit.watch"):
        app.start()

        def delivered() -> bool:
            sinks = status(app).get("shipper", {}).get("sinks", {})
            return sinks.get("archive", {}).get("delivered", 0) > 0

        wait_for(delivered, 30, "the archive sink to deliver")
        wait_for(lambda: any(r.getMessage().startswith("running: ")
                             for r in caplog.records), 30, "a summary line")
    doc = status(app)
    spool = doc["spool"]
    assert spool["writable"] is True and spool["refusing"] is None
    assert spool["bytes"] > 0 and spool["records"] > 0 and spool["free_bytes"] > 0
    assert spool["directory"] == str(tmp_path / "spool")
    sink = doc["shipper"]["sinks"]["archive"]
    assert sink["kind"] == "archive" and sink["blocked"] is None
    assert {"position", "delivered", "lag_records", "lag_seconds", "dead_lettered"} <= set(sink)
    assert doc["audit"]["records_written"] > 0 and doc["sampler"]["cycles"] > 0
    assert doc["http"]["max_connections"] == 64 and doc["http"]["connections"] >= 1
    summary = next(r.getMessage() for r in caplog.records
                   if r.getMessage().startswith("running: "))
    assert "cycles" in summary and "records written" in summary
    assert "spool" in summary and "writable" in summary and "archive lag" in summary


def test_full_spool_is_logged_once_and_shown_in_status(
        tmp_path: Path, running: list[ExporterApp], caplog: pytest.LogCaptureFixture) -> None:
    """An exporter (no shipper, so nothing frees space) whose spool reaches max_bytes:
    /status says the spool refuses records and why, the refusal is logged once however
    many cycles it lasts, and the summary line says REFUSING."""
    app = exporter_app(make_config(tmp_path, max_bytes=8192, segment_bytes=4096),
                      with_shipper=False)
    running.append(app)
    with caplog.at_level(logging.INFO):
        app.start()
        wait_for(lambda: status(app)["spool"]["writable"] is False, 30, "the spool to fill")
        cycles = status(app)["sampler"]["cycles"]
        wait_for(lambda: status(app)["sampler"]["cycles"] > cycles + 10, 30, "more cycles")
        wait_for(lambda: any("REFUSING" in r.getMessage() for r in caplog.records), 30,
                 "a summary line while refusing")
    spool = status(app)["spool"]
    assert spool["refusing"] and "shipper" not in status(app)
    refusals = [r for r in caplog.records if "not written to the spool" in r.getMessage()]
    assert len(refusals) == 1, [r.getMessage() for r in refusals]
