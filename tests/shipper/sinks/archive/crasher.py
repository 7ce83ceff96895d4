"""Run the real standalone shipper, SIGKILLing itself at one archive boundary.

    python -m tests.shipper.sinks.archive.crasher CONFIG LABEL N

The archive sink's `os` is wrapped so that the Nth disk-changing call labelled LABEL
("write:part", "replace:state", "replace:gz", "unlink:part", "ftruncate:part", ...; see
FaultyOs in test_archive_crash) kills the process with SIGKILL before the call runs.
Everything else is the ordinary `gpu-audit shipper --config CONFIG`.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import shipper.sinks.archive.sink as archive_mod
from gpu_audit_app.cli import main
from tests.shipper.sinks.archive.test_crash import FaultyOs


class KillingOs(FaultyOs):
    def __init__(self, label: str, nth: int) -> None:
        super().__init__(None)
        self._label = label
        self._nth = nth
        self._seen = 0

    def _point(self, label: str) -> None:
        if label == self._label:
            self._seen += 1
            if self._seen == self._nth:
                os.kill(os.getpid(), signal.SIGKILL)

    def fsync(self, fd: int) -> None:
        super().fsync(fd)  # counts (and kills) only
        os.fsync(fd)  # this process really syncs


if __name__ == "__main__":
    config, label, nth = sys.argv[1], sys.argv[2], int(sys.argv[3])
    archive_mod.os = KillingOs(label, nth)  # type: ignore[assignment]
    sys.exit(main(["shipper", "--config", str(Path(config))]))
