"""`gpu-audit slurm`'s arguments cost the command line nothing: building the parser loads
none of the Slurm machinery (the launcher's clients parse after dropping privileges,
when the interpreter's own library may no longer be readable)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import gpu_audit_app.cli as cli
cli.build_parser()
loaded = [m for m in ("subprocess", "urllib.request", "gpu_audit.slurmcmd",
                      "chargeback.slurm.report", "gpu_audit_app.slurm.epilog",
                      "gpu_audit_app.slurm.health", "gpu_audit_app.slurm.idle")
          if m in sys.modules]
print(",".join(loaded))
"""


def test_building_the_parser_loads_no_slurm_module() -> None:
    """A fresh interpreter builds `gpu-audit`'s whole parser without importing them."""
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == ""
