"""The real shipper process SIGKILLed at archive boundaries, several times in a row.

A spool is prefilled with a sealed trail that crosses midnight; the standalone shipper
(`gpu-audit shipper`, through tests/shipper/sinks/archive/crasher.py) ships it
to an archive of
8 KB parts and SIGKILLs itself at a chosen boundary: a torn line, the truncation that
recovery does next, a compression's rename, the unlink after it, the state's rename.
A last clean run finishes and stops on SIGTERM. The archive then holds exactly the
spooled records, once each, in spool order, and `gpu-audit audit verify` passes on it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gpu_audit.archive import list_parts, read_lines
from gpu_audit.spool import CursorStore, SpoolReader
from gpu_audit_app.cli import main
from tests.shipper import producer

ROOT = Path(__file__).resolve().parents[4]
MIDNIGHT_NS = 1_790_035_200 * 1_000_000_000  # 2026-09-22T00:00:00Z
N = 3000

# (label, n): SIGKILL before the nth such call of that life.
KILLS = [
    ("write:part", 12),  # the second half of a line write: a torn line
    ("ftruncate:part", 1),  # the next start dies while cutting that torn line
    ("replace:gz", 2),  # a compression dies before its rename
    ("unlink:part", 1),  # and one after it, before the plain part is deleted
    ("replace:state", 6),  # a plan is written but not yet in place
    ("write:part", 5),  # a first half: a line not written at all
]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def _config(tmp: Path) -> Path:
    cfg = {
        "log_level": "warning",
        "spool": {"directory": str(tmp / "spool"), "min_free_bytes": 0},
        "shipper": {
            "batch_max_records": 40,
            "batch_max_wait_s": 1.0,  # a prefilled spool: every batch is full (deterministic)
            "poll_interval_s": 0.02,
            "commit_interval_s": 0.2,
            "backoff_base_s": 0.05,
            "backoff_cap_s": 0.2,
            "sinks": [{"type": "archive", "name": "archive", "directory": str(tmp / "archive"),
                       "max_file_bytes": 8192}],
        },
    }
    path = tmp / "gpu-audit.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _run(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, env=_env(),
                                stdout=out, stderr=subprocess.STDOUT)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigkill_at_archive_boundaries_in_a_row_leaves_an_exact_archive(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Six SIGKILLs in a row at archive boundaries (torn line, recovery's truncation,
    compression rename, unlink, state rename): every spooled record is in the archive
    exactly once, in spool order, and `audit verify` passes on the directory."""
    assert producer.main([str(tmp_path / "spool"), str(N), "--batch", "500", "--pad", "200",
                          "--start-ns", str(MIDNIGHT_NS - N // 2 * 1_000_000)]) == 0
    capsys.readouterr()
    config = _config(tmp_path)
    log = tmp_path / "shipper.log"
    cursors = CursorStore(tmp_path / "spool")
    for label, nth in KILLS:
        proc = _run(["tests.shipper.sinks.archive.crasher", str(config), label, str(nth)], log)
        try:
            rc = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(
                f"never reached {label} #{nth}: {log.read_text()[-2000:]}") from None
        assert rc == -signal.SIGKILL, (label, rc, log.read_text()[-2000:])
    assert cursors.get("archive") < N, "the kills came too late to test anything"

    final = _run(["gpu_audit_app", "shipper", "--config", str(config)], log)
    deadline = time.monotonic() + 120
    while cursors.get("archive") < N and time.monotonic() < deadline:
        time.sleep(0.1)
    final.send_signal(signal.SIGTERM)
    assert final.wait(30) == 0, log.read_text()[-3000:]
    assert cursors.get("archive") == N

    spooled = [raw for _, raw in SpoolReader(tmp_path / "spool").read(0, N + 1, 1 << 30).entries]
    assert len(spooled) == N
    archive = tmp_path / "archive"
    lines = [line.raw for line in read_lines(archive)]
    assert len(lines) == N, f"{len(lines)} lines for {N} records"
    assert lines == spooled
    parts = list_parts(archive)
    assert len({p.day for p in parts}) == 2 and len(parts) > 20
    assert main(["audit", "verify", str(archive)]) == 0, capsys.readouterr().out
