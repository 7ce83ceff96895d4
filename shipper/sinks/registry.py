"""The sink registry: every sink type, its configuration class and its optional client
library, and `create_sink`, which has the configuration build its sink.

Each sink folder declares its `SinkType` in its `config.py`; this module lists them, so
adding a sink is one folder and one line here (plus the union in config.py). There is no
dispatch on the configuration's class: each config builds its own sink
(`ArchiveSinkConfig.build`, ...), after its secrets are read and its client library is
known to be importable. Client libraries of some sink families are optional extras; a
configured sink whose library is missing is a ConfigError naming the extra to install,
not an ImportError.

This is the only place where sinks are built, and so where their secrets are read: it
must never log or return a secret except inside a SecretStr handed to the sink, and it
reports every problem of a sink at once.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from gpu_audit.invocation import pip_install
from gpu_audit.spool.config import default_archive_dir
from shipper.sinks.archive.config import SINK_TYPE as ARCHIVE
from shipper.sinks.base import Sink
from shipper.sinks.build import BuildContext, SinkType
from shipper.sinks.config import SinkConfig, sink_name
from shipper.sinks.elasticsearch.config import SINK_TYPE as ELASTICSEARCH
from shipper.sinks.fluentd.config import SINK_TYPE as FLUENTD
from shipper.sinks.influxdb.config import SINK_TYPES as INFLUXDB
from shipper.sinks.opensearch.config import SINK_TYPE as OPENSEARCH

__all__ = ["OPTIONAL_SDKS", "SINK_TYPES", "create_sink", "default_archive_dir", "missing_sdk"]

SINK_TYPES: dict[str, SinkType] = {
    t.type: t for t in (ARCHIVE, ELASTICSEARCH, OPENSEARCH, *INFLUXDB, FLUENTD)
}

# Sink types whose client library is an optional extra of gpu-audit: the modules the sink
# imports, and the extra that installs them. The archive and InfluxDB sinks need only the
# default install (urllib3, orjson).
OPTIONAL_SDKS: dict[str, tuple[tuple[str, ...], str]] = {
    t.type: (t.sdk.modules, t.sdk.extra) for t in SINK_TYPES.values() if t.sdk is not None
}


def missing_sdk(sink_type: str) -> str | None:
    """What to install when the client library of `sink_type` cannot be imported."""
    modules, extra = OPTIONAL_SDKS.get(sink_type, ((), ""))
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            return (f"the {sink_type} sink's client library is not installed (cannot import "
                    f"{module}); install the extra: {pip_install(extra)}")
    return None


def create_sink(cfg: SinkConfig, *, spool_dir: Path) -> Sink:
    """A ready-to-start sink for one configuration entry."""
    ctx = BuildContext(name=sink_name(cfg), spool_dir=spool_dir)
    sdk = missing_sdk(cfg.type)
    if sdk is not None:
        ctx.problems.append(sdk)
    return cfg.build(ctx)
