"""The sink registry: every sink type, its configuration class, the sink class that
serves it (`module:Class`) and its optional client library; and `create_sink`.

Adding a sink is one folder (shipper/sinks/<name>/: config, encode, sink, client), one
line in `SINK_TYPES` below and one member of the `sinks:` union (shipper/sinks/config.py);
docs/CONTRIBUTING.md has the recipe. There is no dispatch on the configuration's class.

`create_sink` reads the secrets the configuration names and checks that the client
library can be imported, reports every problem of the sink at once (ConfigError), and
only then imports the sink's module and builds it as
`Class(config, name, **config.sink_arguments(spool_dir), **secrets)`: a missing library
is a ConfigError naming the extra to install, not an ImportError, and a sink type that
is not configured is never imported.

This is the only place where sinks are built, and so where their secrets are read: it
must never log or return a secret except inside a SecretStr handed to the sink.
"""

from __future__ import annotations

import builtins
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from gpu_audit.credentials import resolve_secret
from gpu_audit.errors import ConfigError
from gpu_audit.invocation import pip_install
from shipper.sinks.archive.config import ArchiveSinkConfig
from shipper.sinks.base import Sink
from shipper.sinks.build import Sdk
from shipper.sinks.config import SinkConfig, sink_name
from shipper.sinks.elasticsearch.config import ElasticsearchSinkConfig
from shipper.sinks.fluentd.config import FluentdSinkConfig
from shipper.sinks.influxdb.config import InfluxV1SinkConfig, InfluxV2SinkConfig
from shipper.sinks.opensearch.config import OpenSearchSinkConfig

__all__ = ["OPTIONAL_SDKS", "SINK_TYPES", "SinkType", "create_sink", "missing_sdk"]


@dataclass(frozen=True)
class SinkType:
    """One `type:` value: its configuration class, the sink class that serves it
    (`"package.module:Class"`, imported only when such a sink is built) and, where its
    client library is an optional extra, that `Sdk`."""

    type: str
    config: builtins.type[BaseModel]
    sink: str
    sdk: Sdk | None = None


SINK_TYPES: dict[str, SinkType] = {t.type: t for t in (
    SinkType("archive", ArchiveSinkConfig, "shipper.sinks.archive.sink:ArchiveSink"),
    SinkType("elasticsearch", ElasticsearchSinkConfig,
             "shipper.sinks.elasticsearch.sink:ElasticsearchSink",
             Sdk(("elasticsearch", "elastic_transport"), "elasticsearch")),
    SinkType("opensearch", OpenSearchSinkConfig, "shipper.sinks.opensearch.sink:OpenSearchSink",
             Sdk(("opensearchpy",), "opensearch")),
    SinkType("influxdb_v1", InfluxV1SinkConfig, "shipper.sinks.influxdb.sink:InfluxV1Sink"),
    SinkType("influxdb_v2", InfluxV2SinkConfig, "shipper.sinks.influxdb.sink:InfluxV2Sink"),
    SinkType("fluentd", FluentdSinkConfig, "shipper.sinks.fluentd.sink:FluentdSink",
             Sdk(("msgpack",), "fluentd")),
)}

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


def sink_class(sink_type: str) -> Callable[..., Sink]:
    """The sink class registered for `sink_type`, imported now."""
    module, _, name = SINK_TYPES[sink_type].sink.partition(":")
    cls: Callable[..., Sink] = getattr(importlib.import_module(module), name)
    return cls


def create_sink(cfg: SinkConfig, *, spool_dir: Path, seal_key: bytes | None = None) -> Sink:
    """A ready-to-start sink for one configuration entry (ConfigError naming every
    problem of it first). `seal_key`: the trail's HMAC key, for the archive sink's seals."""
    name = sink_name(cfg)
    problems: list[str] = []
    sdk = missing_sdk(cfg.type)
    if sdk is not None:
        problems.append(sdk)
    secrets = {}
    for what, (env, file) in cfg.secrets().items():
        try:
            secrets[what] = resolve_secret(f"sink {name}: {what}", env, file)
        except ConfigError as exc:
            problems += [f"{what}: {p}" for p in exc.problems]
    problems += cfg.refusals()
    if problems:
        raise ConfigError(f"sink {name}", problems)
    extra: dict[str, object] = {"seal_key": seal_key} if cfg.type == "archive" else {}
    return sink_class(cfg.type)(cfg, name, **cfg.sink_arguments(spool_dir), **secrets,
                                **extra)
