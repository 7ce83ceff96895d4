"""Screenshot capacity reports with headless Chromium: docs/CAPACITY.md's pictures.

    .venv/bin/python -m tests.capacity.screenshot docs/img

writes capacity-report.png (the six-month sample of tests/capacity/sample.py) and
capacity-report-crafted.png (`gpu-audit capacity` on the crafted trail and launcher
store of tests/capacity/crafted.py, replayed with +2 GPUs).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from chargeback.capacity.outputs import write_outputs
from gpu_audit_app.cli import main as cli
from tests import chromium
from tests.capacity.crafted import DAY, END, write_store, write_trail
from tests.capacity.sample import sample


def main() -> int:
    dest = Path(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_outputs(sample(), root / "sample", png=False)
        chromium.screenshot(root / "sample" / "capacity.html", dest / "capacity-report.png",
                            width=1000, height=1500)
        config = write_trail(root)
        store = write_store(root / "state.db")
        cli(["capacity", "--config", str(config), "--from", DAY.isoformat(), "--to",
             END.isoformat(), "--launcher-state", str(store), "--whatif-gpus", "2",
             "--node-gpus", "4", "--bin", "hour", "--out", str(root / "crafted"), "--no-png"])
        chromium.screenshot(root / "crafted" / "capacity.html",
                            dest / "capacity-report-crafted.png", width=1000, height=1400)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
