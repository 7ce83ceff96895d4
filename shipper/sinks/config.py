"""The `shipper.sinks` list: one pydantic model per sink type, chosen by `type`.

Each sink's own model lives in its folder (`shipper/sinks/<name>/config.py`); this module
only joins them into the discriminated union the YAML is validated against. The union is
spelled out (not built from the registry) so type checkers see every member;
tests/shipper/sinks/test_registry.py proves it and shipper/sinks/registry.py list the same types.
Secrets are never written in the YAML (gpu_audit/credentials.py).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from shipper.sinks.archive.config import ArchiveSinkConfig
from shipper.sinks.elasticsearch.config import ElasticsearchSinkConfig
from shipper.sinks.fluentd.config import FluentdSinkConfig
from shipper.sinks.influxdb.config import InfluxV1SinkConfig, InfluxV2SinkConfig
from shipper.sinks.opensearch.config import OpenSearchSinkConfig

SinkConfig = Annotated[
    ElasticsearchSinkConfig
    | OpenSearchSinkConfig
    | InfluxV1SinkConfig
    | InfluxV2SinkConfig
    | FluentdSinkConfig
    | ArchiveSinkConfig,
    Field(discriminator="type"),
]


def sink_name(cfg: SinkConfig) -> str:
    """The configured name, or the kind when no name was given."""
    return cfg.name or cfg.type
