"""The launcher's audit trail: job lifecycle records in their own hash-chained stream.

`LauncherAudit` owns a spool directory (exclusive, like every spool writer) and an
AuditProducer whose stream is `launcher`; `emit()` builds a record with
gpu_audit.audit.jobevents and commits it. The shipper ships that spool like the
exporter's. `environment_fingerprint()` says what a job attempt runs on (Python, PyTorch,
CUDA and driver versions where present, the container image if any), for the
`job_started` record.

This module must never raise out of `emit()` for a spool problem (scheduling goes on;
the producer counts the failure), and never import torch into the daemon (versions are
read from package metadata, not by importing).
"""

from __future__ import annotations

import logging
import os
import platform
import socket
import time
from collections.abc import Callable, Mapping
from importlib import metadata
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


def environment_fingerprint(
    environ: Mapping[str, str] | None = None,
    *,
    python: str | None = None,
) -> dict[str, str]:
    """Versions of what a job runs on, only the ones known (unknown is absent)."""
    env = os.environ if environ is None else environ
    out: dict[str, str] = {"python": python or platform.python_version()}
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    if torch_version:
        out["torch"] = torch_version
        if "+cu" in torch_version:
            out["cuda"] = torch_version.split("+cu", 1)[1]
    cuda = env.get("CUDA_VERSION")
    if cuda:
        out["cuda"] = cuda
    driver = _driver_version()
    if driver:
        out["driver"] = driver
    image = _container_image(env)
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
        self._producer.commit_records([record])
        self.emitted += 1

    def stats(self) -> Mapping[str, int]:
        return self._producer.stats()

    def close(self) -> None:
        self._producer.stop()
        self._spool.close()
