"""The standalone `gpu-audit shipper` says what it is doing: a periodic summary line with
the spool and every sink's state, deliveries and lag: a process you can watch."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import yaml

from tests.polling import wait_for
from tests.shipper.helpers import ROOT, subprocess_env, wait_for_signal_handler


def test_standalone_shipper_logs_a_periodic_summary(tmp_path: Path) -> None:
    """With shipper.log_summary_interval_seconds set, the running standalone shipper logs
    `shipping: spool ... ; sinks: archive up, 50 delivered, lag 0 records/0s` once the
    spool's 50 records are archived; with 0 it logs no summary at all."""
    subprocess.run(
        [sys.executable, "-m", "tests.shipper.producer", str(tmp_path / "spool"), "50"],
        cwd=ROOT, env=subprocess_env(), check=True, capture_output=True,
    )

    def run(interval: float, log: Path, until: str | None) -> str:
        config = tmp_path / f"c{interval}.yaml"
        config.write_text(yaml.safe_dump({
            "log_level": "info",
            "spool": {"directory": str(tmp_path / "spool"), "min_free_bytes": 0},
            "shipper": {"log_summary_interval_seconds": interval,
                        "sinks": [{"type": "archive",
                                   "directory": str(tmp_path / "archive")}]},
        }))
        with log.open("ab") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpu_audit_app", "shipper", "--config", str(config)],
                cwd=ROOT, env=subprocess_env(), stderr=err)
        try:
            wait_for_signal_handler(proc.pid)
            if until is not None:
                wait_for(lambda: until in log.read_text(), 30, f"log line {until!r}")
            else:
                wait_for(lambda: "shipping " in log.read_text(), 30, "the start line")
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        return log.read_text()

    text = run(0.2, tmp_path / "on.log", "archive up, 50 delivered, lag 0 records/0s")
    line = next(x for x in text.splitlines() if "shipping: spool" in x)
    assert "accepting" in line and "segments" in line
    assert "shipping: spool" not in run(0, tmp_path / "off.log", None)
