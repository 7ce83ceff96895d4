"""A real InfluxDB that is down when `gpu-audit shipper` starts: the shipper's metrics show
the real lag and a down sink from the first scrape, the outage and the recovery are
logged once each, and once influxd is back every record is delivered."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from tests.netutil import bound_port, http_get
from tests.polling import wait_for
from tests.realservers import influxd_server

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def _metric(body: bytes, name: str) -> float | None:
    m = re.search(rb"^" + re.escape(name.encode()) + rb'\{sink="influx"\} (\S+)$', body, re.M)
    return float(m.group(1)) if m else None


def test_influxdb_down_at_start_shows_lag_and_down_state_and_logs_once_each_way(
    tmp_path: Path,
) -> None:
    """1,631 records an hour old, influxd stopped: lag_records 1631, lag_seconds >= 3600
    (not 0), sink_up 0 and retried > 0 while it is down; one 'down' line and, after
    influxd is started again, one 'up again' line and all 1,631 records delivered."""
    n = 1631
    spool = tmp_path / "spool"
    subprocess.run([sys.executable, "-m", "tests.shipper.producer", str(spool), str(n)],
                   cwd=ROOT, env=_env(), check=True, capture_output=True)
    with influxd_server(tmp_path) as influx:
        influx.stop()
        config = tmp_path / "c.yaml"
        config.write_text(yaml.safe_dump({
            "log_level": "info",
            "spool": {"directory": str(spool), "min_free_bytes": 0},
            "shipper": {"backoff_base_s": 0.05, "backoff_cap_s": 0.3,
                        "metrics_listen": "127.0.0.1:0",
                        "sinks": [{"type": "influxdb_v1", "name": "influx", "url": influx.url,
                                   "database": influx.database, "timeout_s": 5}]},
        }))
        log = tmp_path / "shipper.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpu_audit_app", "shipper", "--config", str(config)],
                cwd=ROOT, env=_env(), stdout=out, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{bound_port(log, proc)}/metrics"
            def retried() -> bool:
                assert proc.poll() is None, log.read_text()
                value = _metric(http_get(url)[1], "gpu_audit_shipper_records_retried_total")
                return (value or 0) > 0
            wait_for(retried, 60, "retries counted")
            body = http_get(url)[1]
            assert _metric(body, "gpu_audit_shipper_cursor_lag_records") == n
            assert (_metric(body, "gpu_audit_shipper_cursor_lag_seconds") or 0) >= 3600
            assert _metric(body, "gpu_audit_shipper_sink_up") == 0
            influx.start()
            wait_for(lambda: _metric(http_get(url)[1],
                                     "gpu_audit_shipper_records_delivered_total") == n,
                     60, "delivered after influxd came back")
            body = http_get(url)[1]
            assert _metric(body, "gpu_audit_shipper_sink_up") == 1
            assert _metric(body, "gpu_audit_shipper_cursor_lag_seconds") == 0
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0, log.read_text()
    text = log.read_text()
    assert len(re.findall(r"sink influx: down \(", text)) == 1, text
    assert len(re.findall(r"sink influx: up again after being down for", text)) == 1, text
    assert f"it was {n} records" in text
