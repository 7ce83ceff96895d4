"""SIGKILL at every boundary of a checkpoint commit never costs the newest valid checkpoint.

A child process commits step 20 over a directory holding a committed step 10, and SIGKILLs
itself at one named boundary (store._fault_hook, set in the child only: the kill point is
chosen, not timed). Afterwards a fresh process must resume from step 10 (or from step 20
once its manifest was renamed into place: that is the commit point), clean the leftovers,
and be able to commit step 20 again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpu_audit_ckpt import store

REPO = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    from gpu_audit_ckpt import Checkpointer, store

    directory, point, step = sys.argv[1], sys.argv[2], int(sys.argv[3])

    def hook(where):
        if where == point:
            os.kill(os.getpid(), signal.SIGKILL)

    store._fault_hook = hook if point != "none" else None
    ckpt = Checkpointer(directory)
    ckpt.save(step, {"w": np.full(300_000, float(step))})  # 2.4 MB: several write calls
    """
)

POINTS = [
    ("after_file_write", 10),
    ("after_file_fsync", 10),
    ("before_rename", 10),
    ("after_rename", 10),
    ("mid_manifest", 10),
    ("after_manifest_write", 10),
    ("after_manifest_rename", 20),  # the manifest is in place: step 20 is committed
]


def _child(directory: Path, point: str, step: int) -> int:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(directory), point, str(step)],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode in (0, -signal.SIGKILL), proc.stderr
    return proc.returncode


def test_every_boundary_point_is_reached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook names match the commit code (a renamed boundary would make the test vacuous)."""
    seen: list[str] = []
    monkeypatch.setattr(store, "_fault_hook", seen.append)
    store.commit(tmp_path, 1, {"a.bin": lambda fh: fh.write(b"x")})
    assert [p for p, _ in POINTS] == seen


@pytest.mark.parametrize(("point", "expect"), POINTS, ids=[p for p, _ in POINTS])
def test_sigkill_mid_commit_keeps_newest_valid_checkpoint(
    tmp_path: Path, point: str, expect: int
) -> None:
    """Killed at `point` while committing step 20: resume finds `expect`, then 20 commits."""
    import numpy as np

    from gpu_audit_ckpt import Checkpointer

    d = tmp_path / "ck"
    assert _child(d, "none", 10) == 0
    assert _child(d, point, 20) == -signal.SIGKILL

    manifest, _ = store.latest(d)
    assert manifest is not None and manifest.step == expect

    resumed = Checkpointer(d).restore()
    assert resumed is not None and resumed.step == expect
    assert np.array_equal(resumed.state["w"], np.full(300_000, float(expect)))
    assert not [p.name for p in d.iterdir() if p.name.startswith(".tmp-")], "stale temp left"

    # The next save of the same step must succeed despite whatever the killed one left.
    assert _child(d, "none", 20) == 0
    manifest, skipped = store.latest(d)
    assert manifest is not None and manifest.step == 20 and not skipped
    again = Checkpointer(d).restore()
    assert again is not None and np.array_equal(again.state["w"], np.full(300_000, 20.0))
