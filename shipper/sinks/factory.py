"""Build a configured sink: resolve its secrets and pick its class.

The only place where secrets are read (from the environment or files named in the
config). It must never log or return a secret except inside a SecretStr handed to the
sink, and it reports every missing secret of a sink at once as a ConfigError.

Client libraries of some sink families are optional extras; a configured sink whose
library is missing is a ConfigError naming the extra to install, not an ImportError.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from pydantic import SecretStr

from gpu_audit.errors import ConfigError
from gpu_audit.invocation import pip_install
from gpu_audit.spool.config import default_archive_dir
from shipper.sinks.archive import ArchiveSink
from shipper.sinks.base import Sink
from shipper.sinks.config import (
    ArchiveSinkConfig,
    ElasticsearchSinkConfig,
    FluentdSinkConfig,
    InfluxV1SinkConfig,
    InfluxV2SinkConfig,
    OpenSearchSinkConfig,
    SinkConfig,
    resolve_secret,
    sink_name,
)


class _Secrets:
    """Collects every missing secret of one sink before failing."""

    def __init__(self, name: str) -> None:
        self.source = f"sink {name}"
        self.problems: list[str] = []

    def get(self, what: str, env: str | None, file: Path | None) -> SecretStr | None:
        try:
            return resolve_secret(f"{self.source}: {what}", env, file)
        except ConfigError as exc:
            self.problems += [f"{what}: {p}" for p in exc.problems]
            return None

    def check(self) -> None:
        if self.problems:
            raise ConfigError(self.source, self.problems)


# Sink types whose client library is an optional extra of gpu-audit: the modules the sink
# imports, and the extra that installs them. The archive and InfluxDB sinks need only the
# default install (urllib3, orjson).
OPTIONAL_SDKS: dict[str, tuple[tuple[str, ...], str]] = {
    "elasticsearch": (("elasticsearch", "elastic_transport"), "elasticsearch"),
    "opensearch": (("opensearchpy",), "opensearch"),
    "fluentd": (("fluent.sender", "msgpack"), "fluentd"),
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
    name = sink_name(cfg)
    secrets = _Secrets(name)
    sdk = missing_sdk(cfg.type)
    if sdk is not None:
        secrets.problems.append(sdk)
    sink: Sink
    if isinstance(cfg, ElasticsearchSinkConfig):
        password = secrets.get("password", cfg.password_env, cfg.password_file)
        api_key = secrets.get("api_key", cfg.api_key_env, cfg.api_key_file)
        secrets.check()
        from shipper.sinks.elasticsearch import ElasticClient, SearchSink  # noqa: PLC0415 (lazy: see above)

        sink = SearchSink(cfg, name, ElasticClient(cfg, password=password, api_key=api_key))
    elif isinstance(cfg, OpenSearchSinkConfig):
        password = secrets.get("password", cfg.password_env, cfg.password_file)
        if cfg.api_key_env or cfg.api_key_file:
            secrets.problems.append(
                "api_key: OpenSearch has no Elasticsearch-style API keys; use username + "
                "password_env/password_file")
        secrets.check()
        from shipper.sinks.elasticsearch import SearchSink  # noqa: PLC0415 (lazy: see above)
        from shipper.sinks.opensearch import OpenSearchClient  # noqa: PLC0415 (lazy: see above)

        sink = SearchSink(cfg, name, OpenSearchClient(cfg, password=password))
    elif isinstance(cfg, InfluxV1SinkConfig):
        password = secrets.get("password", cfg.password_env, cfg.password_file)
        secrets.check()
        from shipper.sinks.influxdb import InfluxV1Sink  # noqa: PLC0415 (lazy: see above)

        sink = InfluxV1Sink(cfg, name, password=password)
    elif isinstance(cfg, InfluxV2SinkConfig):
        token = secrets.get("token", cfg.token_env, cfg.token_file)
        secrets.check()
        from shipper.sinks.influxdb import InfluxV2Sink  # noqa: PLC0415 (lazy: see above)

        sink = InfluxV2Sink(cfg, name, token=token)
    elif isinstance(cfg, FluentdSinkConfig):
        key = secrets.get("shared_key", cfg.shared_key_env, cfg.shared_key_file)
        password = secrets.get("password", cfg.password_env, cfg.password_file)
        secrets.check()
        from shipper.sinks.fluentd import FluentdSink  # noqa: PLC0415 (lazy: see above)

        sink = FluentdSink(cfg, name, shared_key=key, password=password)
    elif isinstance(cfg, ArchiveSinkConfig):
        sink = ArchiveSink(cfg, name, cfg.directory or default_archive_dir(spool_dir))
    else:  # pragma: no cover - the discriminated union is exhaustive
        raise ConfigError("sinks", [f"unknown sink type {cfg!r}"])
    return sink
