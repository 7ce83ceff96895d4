"""Golden-file and promtool checks shared by the exposition tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

GOLDEN = Path(__file__).parent / "golden"
PROMTOOL = shutil.which("promtool")


def promtool_check(body: bytes) -> tuple[int, str]:
    assert PROMTOOL, "promtool is installed on these machines"
    r = subprocess.run([PROMTOOL, "check", "metrics"], input=body, capture_output=True,
                       timeout=60, check=False)
    return r.returncode, (r.stdout + r.stderr).decode()


def check_golden(name: str, body: bytes) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_bytes(body)
    assert path.exists(), f"{path} missing: run with UPDATE_GOLDEN=1"
    assert body.decode() == path.read_text(encoding="utf-8")
