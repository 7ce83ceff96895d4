"""The process lock behind "one writer per spool, one shipper per cursors/archive": held
by a live process, refused to others with the holder's pid, and gone with its process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_audit.errors import LockHeld
from gpu_audit.lockfile import ProcessLock, lock_holder

HOLD = (
    "import sys, time; from pathlib import Path; from gpu_audit.lockfile import ProcessLock; "
    "lock = ProcessLock.acquire(Path(sys.argv[1]), 'test dir'); print('held', flush=True); "
    "time.sleep(600)"
)


def test_a_lock_held_by_a_live_process_is_refused_naming_its_pid(tmp_path: Path) -> None:
    """A second process gets LockHeld naming the holder's pid and the protected thing;
    after the holder is SIGKILLed the lock can be taken at once (no stale lock)."""
    path = tmp_path / "dir" / ".lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        assert lock_holder(path) == f"pid {holder.pid}"
        with pytest.raises(LockHeld, match=f"archive dir x is in use .*pid {holder.pid}"):
            ProcessLock.acquire(path, "archive dir x")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
    assert lock_holder(path) is None
    with ProcessLock.acquire(path, "archive dir x") as lock:
        assert lock.held
        assert path.read_text() == f"pid {os.getpid()}\n"
    assert not lock.held
    assert lock_holder(path) is None
