"""The standalone shipper's metrics endpoint has the exporter's TLS and basic-auth
options, from its own setting `shipper.web_config_file`: with a web-config naming users,
/metrics and /readyz need credentials."""

from __future__ import annotations

import base64
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import bcrypt
import pytest
import yaml

from gpu_audit_app.config import Config
from tests.netutil import bound_port
from tests.polling import wait_for
from tests.shipper.helpers import ROOT, subprocess_env, wait_for_signal_handler


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
    """With `shipper.web_config_file`: 401 without credentials or with a wrong password;
    200 with the right ones, and the body carries the shipper's counters; SIGTERM still
    exits 0. The exporter's web-config (another file, another user) does not apply."""
    subprocess.run(
        [sys.executable, "-m", "tests.shipper.producer", str(tmp_path / "spool"), "50"],
        cwd=ROOT, env=subprocess_env(), check=True, capture_output=True,
    )
    web = tmp_path / "web.yml"
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    web.write_text(yaml.safe_dump({"basic_auth_users": {"prom": hashed}}))
    exporter_web = tmp_path / "exporter-web.yml"
    exporter_web.write_text(yaml.safe_dump({"basic_auth_users": {"other": hashed}}))
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "log_level": "info",  # the "shipper metrics on ..." line names the bound port
        "exporter": {"web_config_file": str(exporter_web)},
        "spool": {"directory": str(tmp_path / "spool"), "min_free_bytes": 0},
        "shipper": {"metrics_listen": "127.0.0.1:0", "web_config_file": str(web),
                    "sinks": [{"type": "archive", "directory": str(tmp_path / "archive")}]},
    }))
    log = tmp_path / "shipper.log"
    with log.open("ab") as err:
        proc = subprocess.Popen([sys.executable, "-m", "gpu_audit_app", "shipper", "--config",
                                 str(config)], cwd=ROOT, env=subprocess_env(), stderr=err)
    try:
        url = f"http://127.0.0.1:{bound_port(log, proc)}"
        wait_for_signal_handler(proc.pid)
        wait_for(lambda: _get(url + "/healthz")[0] != 0, 20, "endpoint up")
        assert _get(url + "/metrics")[0] == 401
        assert _get(url + "/metrics", "prom:wrong")[0] == 401
        assert _get(url + "/metrics", "other:s3cret")[0] == 401
        status, body = _get(url + "/metrics", "prom:s3cret")
        assert status == 200 and b"gpu_audit_shipper_records_delivered_total" in body
        assert _get(url + "/readyz", "prom:s3cret")[0] == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert proc.returncode == 0, log.read_text(errors="replace")[-2000:]


def test_gpu_audit_shipper_applies_the_environment_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gpu-audit shipper` reads the configuration through the same layers as every
    command: the GPU_AUDIT__* variables override the file, and a bad one is a
    configuration error (exit 2)."""
    import shipper.standalone as entry
    from gpu_audit_app.cli import main

    seen: list[Config] = []

    def fake_run(config: Config, **_: object) -> int:
        seen.append(config)
        return 0

    monkeypatch.setattr(entry, "run_shipper", fake_run)
    config = tmp_path / "c.yaml"
    config.write_text(f"spool:\n  directory: {tmp_path / 'from-file'}\n")
    monkeypatch.setenv("GPU_AUDIT__SPOOL__DIRECTORY", str(tmp_path / "from-env"))
    monkeypatch.setenv("GPU_AUDIT__SHIPPER__BATCH_MAX_RECORDS", "7")
    assert main(["shipper", "--config", str(config)]) == 0
    assert seen[0].spool.directory == tmp_path / "from-env"
    assert seen[0].shipper.batch_max_records == 7

    monkeypatch.setenv("GPU_AUDIT__SHIPPER__BATCH_MAX_RECORDS", "0")
    assert main(["shipper", "--config", str(config)]) == 2
    assert len(seen) == 1


def test_check_config_checks_the_shippers_web_config(tmp_path: Path) -> None:
    """`shipper.web_config_file` is checked like the exporter's: a bad hash in it is
    reported with that file's name and line."""
    web = tmp_path / "web.yml"
    web.write_text("rate_limit:\n  burst: 1\nbasic_auth_users:\n  prom: $2b$04$short\n")
    config = tmp_path / "c.yaml"
    config.write_text(f"spool:\n  directory: {tmp_path / 'spool'}\n"
                      f"shipper:\n  web_config_file: {web}\n")
    res = subprocess.run([sys.executable, "-m", "gpu_audit_app", "check-config", "--config",
                          str(config)], cwd=ROOT, env=subprocess_env(), capture_output=True,
                         text=True, check=False, timeout=60)
    assert res.returncode == 2
    assert f"{web}:4: basic_auth_users.prom: not a complete bcrypt hash" in res.stderr
