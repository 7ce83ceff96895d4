"""The whole gpu-audit configuration: one YAML file, one section per component.

Every key has a default, so the exporter runs with no file at all. Unknown keys are
errors. `load_config` raises ConfigError listing every problem with its line; it is
`gpu_audit.settings.load_settings` without the environment layer.
"""

from __future__ import annotations

import socket
from pathlib import Path

from pydantic import Field

from exporter.attribution.config import AttributionConfig
from exporter.config import ExporterConfig
from gpu_audit.audit.config import AuditConfig
from gpu_audit.model_base import Section
from gpu_audit.spool.config import SpoolConfig
from shipper.config import ShipperConfig


class Config(Section):
    host: str = Field(default_factory=socket.gethostname, description="Host name in records.")
    log_level: str = Field("info", pattern="^(debug|info|warning|error)$")
    exporter: ExporterConfig = ExporterConfig()
    attribution: AttributionConfig = AttributionConfig()
    audit: AuditConfig = AuditConfig()
    spool: SpoolConfig = SpoolConfig()
    shipper: ShipperConfig = ShipperConfig()


def load_config(path: Path | None) -> Config:
    """Load and validate the configuration file (no environment overrides); defaults
    when path is None."""
    from gpu_audit.settings import load_settings  # noqa: PLC0415 (settings imports this module)

    return load_settings(path, environ={})
