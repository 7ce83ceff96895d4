"""`gpu-audit run`, optionally SIGKILLing itself at one archive boundary.

    python -m tests.integration.soak_runner CONFIG [LABEL N]

With LABEL and N, the archive sink's `os` is wrapped so that the Nth disk-changing call
labelled LABEL ("open:part" opens a new part: rotation; "open:gz" / "replace:gz" /
"unlink:part" are steps of a compression; see FaultyOs in tests/shipper/sinks/archive/test_crash)
kills the whole process with SIGKILL before the call runs. Everything else is the
ordinary `gpu-audit run --config CONFIG`.
"""

from __future__ import annotations

import sys

import shipper.sinks.archive.sink as archive_mod
from gpu_audit_app.cli import main
from tests.shipper.sinks.archive.crasher import KillingOs

if __name__ == "__main__":
    if len(sys.argv) == 4:
        archive_mod.os = KillingOs(sys.argv[2], int(sys.argv[3]))  # type: ignore[assignment]
    sys.exit(main(["run", "--config", sys.argv[1]]))
