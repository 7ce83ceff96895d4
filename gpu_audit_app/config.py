"""The whole gpu-audit configuration: one YAML file, one section per component.

The app layer assembles it: each component owns its section's model (exporter,
attribution, shipper) and core owns the shared ones (audit, spool) and the loading
(gpu_audit.config_layers: defaults < file < environment < options). Every key has a
default, so the exporter runs with no file at all. Unknown keys are errors.
`load_settings` raises ConfigError listing every problem with where it came from;
`load_config` is the same without the environment layer.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar, overload

from pydantic import Field, PrivateAttr, model_validator

from exporter.attribution.config import AttributionConfig
from exporter.config import ExporterConfig
from gpu_audit.audit.config import AuditConfig
from gpu_audit.config_layers import KeyPath, load_layered
from gpu_audit.config_section import Section
from gpu_audit.errors import ConfigError
from gpu_audit.spool.config import SpoolConfig
from shipper.config import ShipperConfig
from shipper.sinks.config import SinkConfig


class Config(Section):
    host: str = Field(default_factory=socket.gethostname, description="Host name in records.")
    log_level: str = Field("info", pattern="^(debug|info|warning|error)$",
                           description="Least severe log level written to stderr.")
    exporter: ExporterConfig = ExporterConfig()
    attribution: AttributionConfig = AttributionConfig()
    audit: AuditConfig = AuditConfig()
    spool: SpoolConfig = SpoolConfig()
    shipper: ShipperConfig = ShipperConfig()

    _audit_interval_note: str | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _audit_interval(self) -> Config:
        # The audit interval adds up whole samples: a multiple of the sampling interval
        # (equal: the per-cycle trail). Checked here, where both sections are known.
        # Left unset, it follows the sampling interval, so that every valid sampling
        # interval starts: only a contradiction the user wrote is an error.
        sample = self.exporter.interval_seconds
        if "interval_seconds" not in self.audit.model_fields_set:
            derived = default_audit_interval(sample)
            # Frozen model: the derived default replaces the section's before anyone
            # reads it, the one place a setting is filled in from another.
            object.__setattr__(self, "audit", self.audit.model_copy(
                update={"interval_seconds": derived}))
            self._audit_interval_note = (
                f"audit.interval_seconds not set: {derived:g} s (60 s rounded to a "
                f"multiple of exporter.interval_seconds {sample:g}, or that interval "
                f"when longer)")
            return self
        audit = self.audit.interval_seconds
        ratio = audit / sample
        if ratio < 1 - 1e-9 or abs(ratio - round(ratio)) > 1e-6 * ratio:
            raise ValueError(
                f"audit.interval_seconds {audit:g} must be a multiple of "
                f"exporter.interval_seconds {sample:g} (equal to it: one record per sample)")
        return self

    @property
    def audit_interval_note(self) -> str | None:
        """The one line to log when the audit interval was derived, else None."""
        return self._audit_interval_note


def default_audit_interval(sample_seconds: float) -> float:
    """The audit interval when none is set: 60 s rounded to the nearest multiple of the
    sampling interval (at least one sample), or the sampling interval when it is longer."""
    if sample_seconds >= 60:
        return sample_seconds
    return round(max(1, round(60 / sample_seconds)) * sample_seconds, 9)


S = TypeVar("S")


@overload
def pick_sink(config: Config, kind: type[S], what: str, name: str | None, where: str) -> S: ...
@overload
def pick_sink(config: Config, kind: None, what: str, name: str | None,
              where: str) -> SinkConfig: ...
def pick_sink(config: Config, kind: type[S] | None, what: str, name: str | None,
              where: str) -> S | SinkConfig:
    """The configured sink a command reads from (chargeback, audit verify, the Slurm bill):
    the one of `kind` (None: any kind) named `name` (a sink's name is its type unless set,
    as `spool stats` and the cursors show it), or the only one of `kind` when no name is
    given. ConfigError names the candidates and `--sink NAME` when the choice is unclear."""
    names = config.shipper.sink_names()
    found = [(n, s) for n, s in zip(names, config.shipper.sinks, strict=True)
             if (kind is None or isinstance(s, kind)) and (name is None or n == name)]
    if not found:
        listed = ", ".join(names) or "none"
        named = f" named {name!r}" if name is not None else ""
        raise ConfigError(where, [f"shipper.sinks: no {what} sink{named} (configured: "
                                  f"{listed})"])
    if len(found) > 1:
        listed = ", ".join(repr(n) for n, _ in found)
        raise ConfigError(where, [f"shipper.sinks: {len(found)} {what} sinks ({listed}); "
                                  "name the one to read with --sink NAME"])
    return found[0][1]


def load_settings(
    path: Path | None,
    overrides: Mapping[KeyPath, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    labels: Mapping[KeyPath, str] | None = None,
) -> Config:
    """The configuration with every layer applied (environ: os.environ when None)."""
    return load_layered(Config, path, overrides, environ, labels)


def load_config(path: Path | None) -> Config:
    """Load and validate the configuration file (no environment overrides); defaults
    when path is None."""
    return load_settings(path, environ={})


def config_seal_key(config: Config) -> bytes | None:
    """The key the archive's seals carry a MAC under: the records' (audit.hmac_key_file),
    so a seal's sums are as hard to forge as the chain (docs/AUDIT.md)."""
    from gpu_audit.audit.canonical import load_hmac_key  # noqa: PLC0415

    key_file = config.audit.hmac_key_file
    return load_hmac_key(key_file) if key_file is not None else None
