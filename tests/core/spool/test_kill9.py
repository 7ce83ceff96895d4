"""kill -9 at random moments: every acknowledged record is present and intact."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpu_audit.spool import verify_spool
from tests.core.spool.conftest import read_all
from tests.core.spool.crash_producer import payload

ROOT = Path(__file__).resolve().parents[3]


def test_sigkill_never_loses_acknowledged_records(tmp_path: Path) -> None:
    """A producer is SIGKILLed at random moments 6 times; afterwards every record it was
    told was committed is readable with its exact bytes, offsets are dense, and the spool
    verifies clean once a writer has recovered it."""
    directory = tmp_path / "spool"
    rng = random.Random(1234)
    acked: dict[int, bytes] = {}
    for run in range(6):
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.core.spool.crash_producer", str(directory), str(run)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        time.sleep(rng.uniform(0.3, 1.2))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        for line in proc.stdout.read().splitlines():
            first, run_no, seq, count = (int(x) for x in line.split())
            for i in range(count):
                acked[first + i] = payload(run_no, seq + i)
    assert len(acked) > 100, "the producer never got going"
    entries, skips = read_all(directory)
    assert skips == []
    stored = dict(entries)
    assert [o for o, _ in entries] == list(range(len(entries)))
    missing = [o for o in acked if stored.get(o) != acked[o]]
    assert missing == []
    # Reopen once as a writer (recovering any torn tail of the last run) and fsck.
    from gpu_audit.spool import SpoolConfig, SpoolWriter

    with SpoolWriter(SpoolConfig(directory=directory, min_free_bytes=0, fsync_window_ms=0)):
        pass
    report = verify_spool(directory)
    assert report.ok, report.render()
