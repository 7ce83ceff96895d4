"""Runs an example training script as real processes and preempts it with real signals.

The parent tails the child's events file (GPU_AUDIT_EVENTS_FILE) and sends the signal once
the child reports a step at or past the target, so the preemption lands at whatever step
the child happens to be on: random, not chosen by the test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120.0


@dataclass
class Segment:
    rc: int
    stdout: str
    stderr: str
    events: list[dict[str, object]]


def events(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    # The job appends while we read: a last line without its newline is still being
    # written (one write(2) is not atomic against a concurrent read), so it is not read yet.
    complete = path.read_bytes().rpartition(b"\n")[0]
    return [json.loads(line) for line in complete.splitlines() if line.strip()]


def _env(events_file: Path, extra: dict[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    env["GPU_AUDIT_EVENTS_FILE"] = str(events_file)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    for k in ("GPU_AUDIT_PREEMPT_SIGNAL", "GPU_AUDIT_PREEMPT_GRACE_SECONDS"):
        env.pop(k, None)
    env.update(extra or {})
    return env


def start(script: str, args: list[str], events_file: Path) -> subprocess.Popen[str]:
    """Start a run without waiting (the reference run overlaps the preempted chain)."""
    return subprocess.Popen(
        [sys.executable, str(REPO / "examples" / script), *args],
        env=_env(events_file, None), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def finish(proc: subprocess.Popen[str], events_file: Path) -> Segment:
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    return Segment(proc.returncode, out, err, events(events_file))


def run(script: str, args: list[str], events_file: Path) -> Segment:
    return finish(start(script, args, events_file), events_file)


def run_and_preempt(
    script: str, args: list[str], events_file: Path, *, at_step: int, sig: int,
    env: dict[str, str] | None = None,
) -> Segment:
    """Start the script, send `sig` once it reports step >= at_step, wait for its exit."""
    start = len(events(events_file))
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "examples" / script), *args],
        env=_env(events_file, env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            seen = events(events_file)[start:]
            if any(e["event"] == "metrics" and _int(e["step"]) >= at_step for e in seen):
                proc.send_signal(sig)
                break
            time.sleep(0.005)
        out, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    return Segment(proc.returncode, out, err, events(events_file)[start:])


def _int(v: object) -> int:
    assert isinstance(v, int), v
    return v


def final_hash(stdout: str) -> str:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("params sha256 ")]
    assert lines, f"no final hash in output:\n{stdout}"
    return lines[-1].split()[-1]


SIGNALS = {"USR1": signal.SIGUSR1, "TERM": signal.SIGTERM, "USR2": signal.SIGUSR2}
