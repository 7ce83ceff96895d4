"""An exporter whose spool cannot be written keeps sampling and serving /metrics, counts
the records it could not write, and resumes writing once the spool is usable again."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.netutil import bound_port, http_get
from tests.polling import wait_for


def _metric(body: bytes, pattern: str) -> float:
    m = re.search(pattern.encode() + rb"(?:\{[^}]*\})? ([0-9.e+]+)$", body, re.M)
    return float(m.group(1)) if m else -1.0


def test_unwritable_spool_is_counted_and_never_stops_the_exporter(tmp_path: Path) -> None:
    """With the spool path under a regular file (ENOTDIR), /readyz stays 200, /metrics
    keeps serving, failed records are counted by reason and spool_writable is 0; once
    the path becomes a directory, records are written again."""
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    log = tmp_path / "exporter.log"
    with log.open("ab") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpu_audit_app", "exporter", "--backend", "sim",
             "--scenario", "busy", "--interval", "0.2", "--listen", "127.0.0.1:0",
             "--spool-dir", str(blocker / "spool")],
            stdout=subprocess.DEVNULL, stderr=err,
            # the per-cycle trail: records every cycle, so writing resumes at once
            env={**os.environ, "GPU_AUDIT__AUDIT__INTERVAL_SECONDS": "0.2"})
    try:
        url = f"http://127.0.0.1:{bound_port(log, proc)}"
        wait_for(lambda: http_get(url + "/readyz")[0] == 200, 30, "readyz")
        # (the known reasons are served at 0 from the start: look at this one's)
        wait_for(lambda: _metric(http_get(url + "/metrics")[1],
                                 r'gpu_audit_records_failed_total\{reason="ENOTDIR"\}') > 0,
                 20, "failures counted")
        body = http_get(url + "/metrics")[1]
        assert _metric(body, "gpu_audit_spool_writable") == 0
        assert b'reason="ENOTDIR"' in body
        assert _metric(body, "gpu_utilization_ratio") >= 0  # sampling goes on
        blocker.unlink()
        blocker.mkdir()
        wait_for(lambda: _metric(http_get(url + "/metrics")[1],
                                 r"gpu_audit_records_written_total") > 0, 20, "writes resume")
        assert _metric(http_get(url + "/metrics")[1], "gpu_audit_spool_writable") == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
