"""SIGTERM on the standalone shipper: stop reading, commit cursors, close sinks, exit 0."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from gpu_audit.spool import CursorStore
from tests.netutil import bound_port, http_get
from tests.shipper.helpers import ROOT, archive_docs, subprocess_env, wait_for_signal_handler


def test_sigterm_commits_cursors_and_exits_zero(tmp_path: Path) -> None:
    """A SIGTERM in the middle of a backlog too big to drain within the shutdown grace
    exits 0 promptly; the committed cursor covers exactly what the archive holds, and a
    restart (serving its metrics on metrics_listen) delivers the rest with no duplicate."""
    n = 100000
    subprocess.run(
        [sys.executable, "-m", "tests.shipper.producer", str(tmp_path / "spool"), str(n),
         "--batch", "1000", "--pad", "400"],
        cwd=ROOT, env=subprocess_env(), check=True, capture_output=True,
    )
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "log_level": "info",  # the "shipper metrics on ..." line names the bound port
        "spool": {"directory": str(tmp_path / "spool"), "min_free_bytes": 0},
        "shipper": {"batch_max_records": 200, "commit_interval_s": 0.05,
                    "shutdown_grace_s": 0.3,
                    "metrics_listen": "127.0.0.1:0",
                    "sinks": [{"type": "archive", "name": "archive", "compress": False,
                               "directory": str(tmp_path / "archive")}]},
    }))
    cursors = CursorStore(tmp_path / "spool")

    def start(log: Path) -> tuple[subprocess.Popen[bytes], int]:
        with log.open("ab") as err:
            proc = subprocess.Popen([sys.executable, "-m", "gpu_audit_app", "shipper",
                                     "--config", str(config)],
                                    cwd=ROOT, env=subprocess_env(), stderr=err)
        port = bound_port(log, proc)
        wait_for_signal_handler(proc.pid)
        return proc, port

    first_log = tmp_path / "first.log"
    proc, _ = start(first_log)
    deadline = time.monotonic() + 60
    while cursors.get("archive") == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0, first_log.read_text(errors="replace")[-2000:]
    stopped_at = cursors.get("archive")
    assert 0 < stopped_at < n, "the SIGTERM did not land in the middle of the backlog"
    assert len(list(archive_docs(tmp_path / "archive"))) == stopped_at

    proc, port = start(tmp_path / "second.log")
    status, body = http_get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200 and b'gpu_audit_shipper_cursor_lag_records{sink="archive"}' in body
    deadline = time.monotonic() + 60
    while cursors.get("archive") < n and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    ids = [d["id"] for d in archive_docs(tmp_path / "archive")]
    assert len(ids) == n == len(set(ids))


def test_sigterm_delivers_the_spooled_backlog_before_exiting(tmp_path: Path) -> None:
    """Within the shutdown grace, a SIGTERM first delivers what the spool holds, then
    commits and exits 0: nothing is left pending."""
    n = 5000
    subprocess.run(
        [sys.executable, "-m", "tests.shipper.producer", str(tmp_path / "spool"), str(n),
         "--batch", "1000", "--pad", "400"],
        cwd=ROOT, env=subprocess_env(), check=True, capture_output=True,
    )
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "log_level": "warning",
        "spool": {"directory": str(tmp_path / "spool"), "min_free_bytes": 0},
        "shipper": {"batch_max_records": 200, "shutdown_grace_s": 30,
                    "sinks": [{"type": "archive", "name": "archive", "compress": False,
                               "directory": str(tmp_path / "archive")}]},
    }))
    proc = subprocess.Popen([sys.executable, "-m", "gpu_audit_app", "shipper",
                             "--config", str(config)],
                            cwd=ROOT, env=subprocess_env(), stderr=subprocess.PIPE)
    wait_for_signal_handler(proc.pid)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=40)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert CursorStore(tmp_path / "spool").get("archive") == n
    ids = [d["id"] for d in archive_docs(tmp_path / "archive")]
    assert len(ids) == n == len(set(ids))
