"""The launcher's audit trail: job lifecycle records in their own hash-chained stream.

`LauncherAudit` owns a spool directory (exclusive, like every spool writer) and an
AuditProducer whose stream is `launcher`; `emit()` builds a record with
gpu_audit.audit.jobevents and commits it. The shipper ships that spool like the
exporter's. `fingerprint_from()` says what a job attempt runs on (Python, PyTorch, CUDA
and driver versions where present, the container image if any) for the `job_started`
record, from what the job's own interpreter reports to `PROBE` (the executor runs it as
the job's user).

This module must never raise out of `emit()` for a spool problem (scheduling goes on;
the producer counts the failure), and never import torch (versions come from package
metadata).
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpu_audit import __version__
from gpu_audit.audit.config import AuditConfig
from gpu_audit.audit.jobevents import job_event
from gpu_audit.audit.producer import AuditProducer
from gpu_audit.spool.config import SpoolConfig
from gpu_audit.spool.writer import SpoolWriter

log = logging.getLogger(__name__)

STREAM = "launcher"
_BATCH = 256  # records committed together at most (a round's worth)


def _driver_version() -> str | None:
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    for word in text.split():
        parts = word.split(".")
        if len(parts) >= 2 and all(p.isdigit() for p in parts):
            return word
    return None


def _container_image(environ: Mapping[str, str]) -> str | None:
    for key in ("CONTAINER_IMAGE", "SINGULARITY_NAME", "APPTAINER_NAME"):
        if environ.get(key):
            return environ[key]
    return None


# Run by the job's own interpreter (as the job's user): versions from package metadata,
# never by importing torch (seconds, and GPU initialisation).
PROBE = (
    "import json, platform, importlib.metadata as m\n"
    "def v(n):\n"
    "    try:\n"
    "        return m.version(n)\n"
    "    except Exception:\n"
    "        return None\n"
    "out = {'python': platform.python_version(), 'torch': v('torch')}\n"
    "for n in ('nvidia-cuda-runtime-cu12', 'nvidia-cuda-runtime-cu11'):\n"
    "    if v(n):\n"
    "        out['cuda'] = v(n)\n"
    "        break\n"
    "print(json.dumps(out))\n"
)


def fingerprint_from(
    probe: Mapping[str, Any] | None,
    environ: Mapping[str, str],
) -> dict[str, str]:
    """The fingerprint record field: what the job's interpreter reported (`probe`, None when
    the job is not a Python we could ask), the CUDA version of its environment or torch
    build, the driver version and the container image; unknown is absent."""
    out: dict[str, str] = {}
    for key in ("python", "torch", "cuda"):
        value = (probe or {}).get(key)
        if isinstance(value, str) and value and len(value) <= 64:  # a user's program said it
            out[key] = value
    torch_version = out.get("torch", "")
    if "cuda" not in out and "+cu" in torch_version:
        digits = torch_version.split("+cu", 1)[1]
        if digits.isdigit() and len(digits) >= 3:
            out["cuda"] = f"{digits[:-1]}.{digits[-1]}"
    if environ.get("CUDA_VERSION"):
        out["cuda"] = environ["CUDA_VERSION"]
    driver = _driver_version()
    if driver:
        out["driver"] = driver
    image = _container_image(environ)
    if image:
        out["container_image"] = image
    return out


class LauncherAudit:
    """Job lifecycle events -> the launcher's spool (stream `launcher`)."""

    def __init__(
        self,
        spool_dir: Path,
        *,
        host: str | None = None,
        simulated: bool = False,
        clock: Callable[[], float] = time.time,
        hmac_key_file: Path | None = None,
    ) -> None:
        self._host = host or socket.gethostname()
        self._simulated = simulated
        self._clock = clock
        self._spool = SpoolWriter(SpoolConfig(directory=spool_dir, fsync_window_ms=0))
        self._producer = AuditProducer(
            AuditConfig(stream=STREAM, hmac_key_file=hmac_key_file),
            self._spool,
            host=self._host,
            exporter_version=__version__,
            simulated=simulated,
            clock=clock,
            lifecycle_events=("launcher_start", "launcher_stop"),
        )
        self._producer.start()
        self.emitted = 0
        self._pending: list[Any] = []

    def emit(self, event: str, job: Mapping[str, Any], *, at: float | None = None) -> None:
        record = job_event(
            event,
            timestamp=self._clock() if at is None else at,
            host=self._host,
            stream=STREAM,
            version=__version__,
            job=job,
            simulated=self._simulated,
        )
        self._pending.append(record)
        self.emitted += 1
        if len(self._pending) >= _BATCH:
            self.flush()

    def flush(self) -> None:
        """Commit the records emitted since the last flush together (one spool write and
        fsync for a whole round, not one per record)."""
        if self._pending:
            records, self._pending = self._pending, []
            self._producer.commit_records(records)

    def stats(self) -> Mapping[str, int]:
        return self._producer.stats()

    def close(self) -> None:
        self.flush()
        self._producer.stop()
        self._spool.close()
