"""The helper runs inside a user's training environment: stdlib only, nothing of ours."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = [
    "pydantic", "grpc", "elasticsearch", "opensearchpy", "influxdb_client", "fluent",
    "msgpack", "prometheus_client", "yaml", "orjson", "gpu_audit", "gpu_audit_app",
    "exporter", "shipper", "launcher", "alerts", "dashboards", "chargeback",
]


def _loaded_after(code: str, tmp: Path) -> list[str]:
    script = textwrap.dedent(code) + textwrap.dedent(
        """
        import json, sys
        print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp, capture_output=True, text=True, timeout=60,
        env=dict(os.environ, PYTHONPATH=str(REPO)), check=True,
    )
    loaded: list[str] = json.loads(proc.stdout.splitlines()[-1])
    return loaded


def test_import_loads_no_third_party_or_project_module(tmp_path: Path) -> None:
    """`import gpu_audit_ckpt` in a fresh interpreter: not even numpy or torch."""
    loaded = _loaded_after("import gpu_audit_ckpt", tmp_path)
    assert "gpu_audit_ckpt" in loaded
    bad = [m for m in loaded if m in [*FORBIDDEN, "numpy", "torch"]]
    assert bad == []


def test_a_full_save_and_restore_loads_only_numpy_besides_stdlib(tmp_path: Path) -> None:
    code = f"""
        import numpy as np
        from gpu_audit_ckpt import Checkpointer
        c = Checkpointer({str(tmp_path / "ck")!r}, events_file={str(tmp_path / "ev")!r})
        c.install(["USR1"])
        c.report(1, loss=0.5)
        c.save(1, {{"w": np.zeros(3)}})
        assert c.restore().step == 1
    """
    loaded = _loaded_after(code, tmp_path)
    assert [m for m in loaded if m in FORBIDDEN] == []
    assert "torch" not in loaded
