"""The long-running commands load only the code they run.

`gpu-audit run` and `gpu-audit exporter` stay resident for months on every GPU node:
each module they import is RSS they keep. Their command line must not pull in the
launcher, chargeback, alerts, dashboards or Slurm code (whose options live there).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.netutil import free_port, http_get
from tests.polling import wait_for

# Packages (and app modules) an exporter process must never import.
FOREIGN = ("launcher", "chargeback", "alerts", "dashboards",
           "gpu_audit_app.launcher", "gpu_audit_app.chargeback", "gpu_audit_app.slurm")
# Without basic auth in the web-config, no bcrypt either.
FOREIGN += ("bcrypt",)
# ... and the exporter alone (no embedded shipper) never reads audit records back.
NOT_IN_EXPORTER = ("gpu_audit.audit.verify", "gpu_audit.archive.reader")

# Runs the real command line, serves until SIGINT, then writes the module names.
PROGRAM = """
import atexit, sys
out = sys.argv[1]
atexit.register(lambda: open(out, "w").write("\\n".join(sorted(sys.modules))))
from gpu_audit_app.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("command", ["exporter", "run"])
def test_running_exporter_never_imports_other_components(command: str,
                                                         tmp_path: Path) -> None:
    """After serving /metrics for a cycle, `gpu-audit exporter` and `gpu-audit run` have
    imported no launcher, chargeback, alerts, dashboards or Slurm module (nor bcrypt
    without basic auth), and the
    exporter alone no audit verifier or archive reader."""
    port = free_port()
    listing = tmp_path / "modules.txt"
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, str(listing), command, "--backend", "sim",
         "--scenario", "busy", "--listen", f"127.0.0.1:{port}",
         "--spool-dir", str(tmp_path / "spool")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: _serves(port), 60, "the exporter's /metrics")
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()[-2000:]
    modules = listing.read_text().split()
    assert "exporter.app" in modules  # the listing is of a process that ran the exporter
    foreign = [m for m in modules if m.startswith(FOREIGN)]
    assert foreign == []
    if command == "exporter":
        assert [m for m in modules if m.startswith(NOT_IN_EXPORTER)] == []


def _serves(port: int) -> bool:
    try:
        status, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=2)
    except OSError:
        return False
    return status == 200 and b"gpu_info" in body
