"""The standalone shipper's metrics endpoint has the exporter's TLS and basic-auth
options: with a web-config naming users, /metrics and /readyz need credentials."""

from __future__ import annotations

import base64
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import bcrypt
import yaml

from tests.netutil import free_port, wait_for
from tests.shipper.test_crash import ROOT, _env, _wait_for_signal_handler


def _get(url: str, auth: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def test_standalone_shipper_metrics_need_basic_auth(tmp_path: Path) -> None:
    """401 without credentials or with a wrong password; 200 with the right ones, and the
    body carries the shipper's counters; SIGTERM still exits 0."""
    subprocess.run(
        [sys.executable, "-m", "tests.shipper.producer", str(tmp_path / "spool"), "50"],
        cwd=ROOT, env=_env(), check=True, capture_output=True,
    )
    web = tmp_path / "web.yml"
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    web.write_text(yaml.safe_dump({"basic_auth_users": {"prom": hashed}}))
    port = free_port()
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "log_level": "warning",
        "exporter": {"web_config_file": str(web)},
        "spool": {"directory": str(tmp_path / "spool"), "min_free_bytes": 0},
        "shipper": {"metrics_listen": f"127.0.0.1:{port}",
                    "sinks": [{"type": "archive", "directory": str(tmp_path / "archive")}]},
    }))
    proc = subprocess.Popen([sys.executable, "-m", "gpu_audit.cli", "shipper", "--config",
                             str(config)], cwd=ROOT, env=_env(), stderr=subprocess.PIPE)
    try:
        _wait_for_signal_handler(proc.pid)
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _get(url + "/healthz")[0] != 0, 20, "endpoint up")
        assert _get(url + "/metrics")[0] == 401
        assert _get(url + "/metrics", "prom:wrong")[0] == 401
        status, body = _get(url + "/metrics", "prom:s3cret")
        assert status == 200 and b"gpu_audit_shipper_records_delivered_total" in body
        assert _get(url + "/readyz", "prom:s3cret")[0] == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()[-2000:]
