"""How far a job is and what it runs: progress fields, the environment event, imports."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpu_audit_ckpt import Checkpointer
from gpu_audit_ckpt.progress import Throughput

REPO = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _events(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_metrics_carry_total_steps_and_throughput(tmp_path: Path) -> None:
    clock = Clock()
    c = Checkpointer(tmp_path / "ck", events_file=tmp_path / "ev", clock=clock)
    for step in range(1, 6):
        c.report(step, loss=1.0 / step, total_steps=100, lr=0.1)
        clock.t += 0.5  # two steps a second
    ev = _events(tmp_path / "ev")
    assert [e["event"] for e in ev] == ["environment"] + ["metrics"] * 5
    first, last = ev[1], ev[-1]
    assert "steps_per_second" not in first  # one point is no rate
    assert last["total_steps"] == 100 and last["step"] == 5 and last["lr"] == 0.1
    assert isinstance(last["steps_per_second"], float)
    assert math.isclose(last["steps_per_second"], 2.0)
    assert ev[0]["python"] == ".".join(map(str, sys.version_info[:3]))


def test_throughput_window_restarts_when_steps_go_back() -> None:
    t = Throughput(window=4)
    assert t.observe(0.0, 10) is None
    assert t.observe(1.0, 20) == 10.0
    assert t.observe(2.0, 5) is None  # resumed from an earlier checkpoint
    assert t.observe(4.0, 9) == 2.0
    for i in range(10):  # the window slides: only the last 4 reports count
        rate = t.observe(5.0 + i, 100 + 50 * i)
    assert rate == 50.0


def _fresh(code: str) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
        timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)), check=True, cwd=REPO,
    )
    doc: dict[str, object] = json.loads(proc.stdout.splitlines()[-1])
    return doc


def test_environment_without_torch_names_python_only() -> None:
    doc = _fresh("""
        import json, sys
        from gpu_audit_ckpt.progress import environment
        print(json.dumps({"env": environment(), "torch": "torch" in sys.modules}))
    """)
    env = doc["env"]
    assert isinstance(env, dict)
    assert doc["torch"] is False and "torch" not in env and "cuda" not in env
    assert env["python"] == ".".join(map(str, sys.version_info[:3]))


def test_environment_with_torch_names_cuda_cudnn_nccl_guarded() -> None:
    pytest.importorskip("torch")
    doc = _fresh("""
        import json, torch
        from gpu_audit_ckpt.progress import environment
        print(json.dumps({"env": environment(), "torch": torch.__version__,
                          "cuda": torch.version.cuda,
                          "cudnn": torch.backends.cudnn.version(),
                          "init": torch.cuda.is_initialized()}))
    """)
    env = doc["env"]
    assert isinstance(env, dict)
    assert env["torch"] == doc["torch"]
    assert env["cuda"] == doc["cuda"] and env["cudnn"] == doc["cudnn"]
    assert set(env) >= {"python", "torch", "cuda", "cudnn", "nccl"}
    if doc["cuda"] is None:  # a CPU build: no NCCL, and asking must not raise
        assert env["nccl"] is None
    assert doc["init"] is False  # the fingerprint never created a CUDA context


@pytest.mark.parametrize(("framework", "module"), [
    ("import lightning.pytorch", "gpu_audit_ckpt.lightning"),
    # transformers imports lazily: what a script using the Trainer has loaded
    ("from transformers import Trainer, TrainerCallback", "gpu_audit_ckpt.transformers"),
])
def test_integration_imports_nothing_beyond_the_framework(framework: str, module: str) -> None:
    """`import gpu_audit_ckpt.lightning` after Lightning loads only our own modules."""
    pytest.importorskip(framework.split()[1].split(".", maxsplit=1)[0])
    doc = _fresh(f"""
        import json, sys
        {framework}
        before = set(sys.modules)
        import {module}
        print(json.dumps({{"new": sorted(set(sys.modules) - before)}}))
    """)
    new = doc["new"]
    assert isinstance(new, list) and module in new
    assert [m for m in new if not m.startswith("gpu_audit_ckpt")] == []
