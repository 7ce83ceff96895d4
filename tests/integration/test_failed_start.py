"""A start that fails writes nothing: configuration, secrets, locks and the listening
socket are all settled before the first audit record, and the real CLI exits at once with
the documented code (2: bad configuration, 1: runtime such as a port in use)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpu_audit.spool import spool_stats

ROOT = Path(__file__).resolve().parents[2]
MISSING_ENV = "GPU_AUDIT_TEST_SURELY_UNSET_PASSWORD"


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop(MISSING_ENV, None)
    # 60 s is far beyond a prompt exit; the old code waited shutdown_grace_s (300 here)
    return subprocess.run([sys.executable, "-m", "gpu_audit_app", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def _config(tmp: Path, sinks: list[dict[str, object]]) -> Path:
    path = tmp / "c.yaml"
    path.write_text(yaml.safe_dump({
        "exporter": {"backend": "sim", "scenario": "busy", "interval_seconds": 0.2},
        "spool": {"directory": str(tmp / "spool"), "min_free_bytes": 0},
        "shipper": {"shutdown_grace_s": 300, "sinks": sinks},
    }))
    return path


def _records(spool: Path) -> int:
    return int(spool_stats(spool)["next_offset"]) if spool.exists() else 0


@pytest.mark.parametrize("command", ["run", "exporter"])
def test_a_port_in_use_exits_1_at_once_and_writes_no_record(tmp_path: Path,
                                                            command: str) -> None:
    """With the listen port taken, `run` and `exporter` exit 1 saying so, without waiting
    for the shutdown grace and with no exporter_start/stop record in the spool or archive."""
    archive = tmp_path / "archive"
    config = _config(tmp_path, [{"type": "archive", "directory": str(archive)}])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = _run([command, "--config", str(config), "--listen", f"127.0.0.1:{port}"])
    assert res.returncode == 1, res.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in res.stderr
    assert "Traceback" not in res.stderr
    assert _records(tmp_path / "spool") == 0
    assert not archive.exists() or not [p for p in archive.iterdir() if ".jsonl" in p.name]


def test_a_missing_secret_exits_2_and_writes_no_record(tmp_path: Path) -> None:
    """A sink whose password variable is unset stops `run` with exit 2 naming the
    variable, before any audit record is written."""
    config = _config(tmp_path, [
        {"type": "archive", "directory": str(tmp_path / "archive")},
        {"type": "influxdb_v1", "url": "http://127.0.0.1:9", "database": "x",
         "username": "u", "password_env": MISSING_ENV},
    ])
    res = _run(["run", "--config", str(config), "--listen", "127.0.0.1:0"])
    assert res.returncode == 2, res.stderr
    assert MISSING_ENV in res.stderr
    assert _records(tmp_path / "spool") == 0
