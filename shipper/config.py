"""Configuration of the shipper engine (batching, retries, shutdown) and its sinks.

The per-sink models live with the sinks (shipper/sinks/config.py); this module composes
them into the `sinks:` list and checks what only the whole list can know (unique names).
It never reads secrets itself; the sink models resolve and validate them.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator, model_validator

from gpu_audit.config_section import Section
from shipper.sinks.archive.config import ArchiveSinkConfig
from shipper.sinks.config import SinkConfig, sink_name


def _default_sinks() -> list[SinkConfig]:
    # the embedded default: a local archive beside the spool, so `gpu-audit run` keeps a
    # complete audit trail with nothing else installed
    return [ArchiveSinkConfig(type="archive")]


class ShipperConfig(Section):
    enabled: bool = Field(True, description="Run the shipper beside the exporter in `run`.")
    batch_max_records: int = Field(
        2000, ge=1, description="Send a batch once it holds this many records."
    )
    batch_max_bytes: int = Field(
        4 * 1024 * 1024, ge=1024, description="Send a batch once its records hold this many bytes."
    )
    batch_max_wait_s: float = Field(
        1.0, ge=0, description="Send a batch that is not full once its first record waited so long."
    )
    poll_interval_s: float = Field(
        0.1, gt=0, le=10, description="How often an idle worker looks for new records."
    )
    backoff_base_s: float = Field(
        0.5, gt=0, description="First retry delay ceiling; doubles per attempt (full jitter)."
    )
    backoff_cap_s: float = Field(60.0, gt=0, description="Largest retry delay ceiling.")
    retry_after_max_s: float = Field(
        600.0, gt=0, description="Longest a server's Retry-After is honoured for."
    )
    commit_interval_s: float = Field(
        0.2,
        ge=0,
        description="Commit a sink's cursor at most this often (0: after every batch). "
        "A crash re-sends at most this much, which idempotent sinks absorb.",
    )
    gc_interval_s: float = Field(
        5.0, gt=0, description="How often spool segments every cursor has passed are deleted."
    )
    shutdown_grace_s: float = Field(
        10.0,
        ge=0,
        description="On SIGTERM, how long in-flight batches may keep retrying before they "
        "are abandoned (their records stay in the spool and are sent after restart).",
    )
    metrics_listen: str | None = Field(
        None,
        pattern=r"^[^:]*:\d{1,5}$",
        description="Standalone `gpu-audit shipper` only: serve its metrics on HOST:PORT, "
        "with the TLS and basic auth of shipper.web_config_file (the embedded shipper's "
        "metrics are on the exporter's /metrics).",
    )
    web_config_file: Path | None = Field(
        None,
        description="Standalone `gpu-audit shipper` only: TLS and basic auth of its "
        "metrics endpoint, in the Prometheus exporter-toolkit format (the exporter's "
        "exporter.web_config_file is not used: the shipper may run on another host, "
        "with other certificates).",
    )
    log_summary_interval_seconds: float = Field(
        300.0,
        ge=0,
        description="Standalone `gpu-audit shipper` only: one INFO line this often with "
        "each sink's delivered records and lag and the spool's size (0: off). The embedded "
        "shipper's sinks are in the exporter's summary line "
        "(exporter.log_summary_interval_seconds).",
    )
    deadletter_dir: Path | None = Field(
        None, description="Dead-letter files; default: <spool directory>/deadletter."
    )

    sinks: list[SinkConfig] = Field(
        default_factory=_default_sinks,
        description="Where records go. Each sink has its own cursor; the name (default: "
        "the type) must be unique. Default: one archive sink beside the spool.",
    )

    @field_validator("sinks")
    @classmethod
    def _unique_names(cls, sinks: list[SinkConfig]) -> list[SinkConfig]:
        # a field validator (not a model one) so it is reported together with problems
        # in other keys, as check-config lists every problem at once
        problems = []
        seen: dict[str, int] = {}
        for i, sink in enumerate(sinks):
            name = sink_name(sink)
            if name in seen:
                problems.append(
                    f"sinks.{i} and sinks.{seen[name]} are both named {name!r}: each sink "
                    "needs its own name (it names the sink's cursor)"
                )
            else:
                seen[name] = i
        if problems:
            raise ValueError("; ".join(problems))
        return sinks

    @model_validator(mode="after")
    def _check_backoff(self) -> ShipperConfig:
        if self.backoff_base_s > self.backoff_cap_s:
            raise ValueError("backoff_base_s must not exceed backoff_cap_s")
        return self

    def sink_names(self) -> list[str]:
        return [sink_name(s) for s in self.sinks]
