"""The helper as its own distribution: built from packaging/ckpt, installed alone, working.

Builds the `gpu-audit-ckpt` wheel from a copy of the repository's packaging/ckpt and
gpu_audit_ckpt/ (no network: the test venv's setuptools, no build isolation), installs it
with nothing else into a fresh venv, and runs the NumPy example there: preempted with a
real SIGUSR1, resumed, and bit-identical to an uninterrupted run. NumPy reaches the fresh
venv as a link to the test venv's copy (a training environment brings its own); nothing of
gpu-audit's service (launcher, exporter, ...) may be importable there.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
SERVICE_PACKAGES = ["gpu_audit", "gpu_audit_app", "launcher", "exporter", "shipper",
                    "alerts", "dashboards", "chargeback"]


def _build_wheel(tmp: Path) -> Path:
    src = tmp / "src"
    shutil.copytree(REPO / "packaging" / "ckpt", src / "packaging" / "ckpt")
    shutil.copytree(REPO / "gpu_audit_ckpt", src / "gpu_audit_ckpt",
                    ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "--no-index", "-w", str(tmp / "dist"), str(src / "packaging" / "ckpt")],
        check=True, capture_output=True, timeout=120,
    )
    (wheel,) = (tmp / "dist").glob("gpu_audit_ckpt-*.whl")
    return wheel


def _fresh_venv(tmp: Path, wheel: Path) -> Path:
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True, timeout=120)
    # NumPy, which the example needs, without a download: a link to the test venv's copy.
    site = Path(subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip())
    np_dir = Path(np.__file__).parent
    links = tmp / "numpy-only"
    links.mkdir()
    for p in [np_dir, *np_dir.parent.glob("numpy.libs")]:
        (links / p.name).symlink_to(p)
    (site / "numpy-link.pth").write_text(str(links) + "\n")
    return py


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONPATH" and not k.startswith("GPU_AUDIT_")}
    return env


def test_distribution_installs_alone_and_runs_the_numpy_example(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {
        "gpu_audit_ckpt"}
    assert "gpu_audit_ckpt/lightning.py" in names and "gpu_audit_ckpt/transformers.py" in names
    requires = [ln for ln in meta.splitlines() if ln.startswith("Requires-Dist:")]
    assert requires and all("extra ==" in ln for ln in requires), requires  # extras only

    py = _fresh_venv(tmp_path, wheel)
    probe = subprocess.run(
        [str(py), "-c", "import json, importlib.util, gpu_audit_ckpt; print(json.dumps("
         "{'file': gpu_audit_ckpt.__file__, 'found': [m for m in "
         f"{SERVICE_PACKAGES!r} if importlib.util.find_spec(m)]}}))"],
        check=True, capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=60)
    doc = json.loads(probe.stdout)
    assert doc["file"].startswith(str(tmp_path / "venv")), doc
    assert doc["found"] == []

    example = str(REPO / "examples" / "train_numpy.py")
    common = ["--steps", "600", "--checkpoint-dir", str(tmp_path / "ck"),
              "--out", str(tmp_path / "p.npz")]
    ref = subprocess.run([str(py), example, "--steps", "600", "--checkpoint-dir",
                          str(tmp_path / "ref"), "--out", str(tmp_path / "ref.npz")],
                         check=False, capture_output=True, text=True, cwd=tmp_path,
                         env=_env(), timeout=120)
    assert ref.returncode == 0, ref.stderr

    events = tmp_path / "events.jsonl"
    env = dict(_env(), GPU_AUDIT_EVENTS_FILE=str(events))
    proc = subprocess.Popen([str(py), example, *common, "--step-sleep", "0.002"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if events.exists() and b'"step":100,' in events.read_bytes():
                proc.send_signal(signal.SIGUSR1)
                break
            time.sleep(0.01)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 75, err
    last = subprocess.run([str(py), example, *common], check=False, capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=120)
    assert last.returncode == 0, last.stderr
    assert "resumed from step" in last.stdout

    def digest(text: str) -> str:
        return [ln for ln in text.splitlines() if ln.startswith("params sha256 ")][-1]

    assert digest(last.stdout) == digest(ref.stdout)
