"""Where chargeback reads its audit records, from the same configuration file as
`gpu-audit run` (`--config FILE`): the archive sink's directory and the audit HMAC key,
or a search sink's connection. Sink configuration is the shipper's, and chargeback may
not import shipper, so the app layer reads it here and hands chargeback plain values.

The configuration is read with every layer (file, GPU_AUDIT__* variables), and the sink
is chosen as `audit verify --sink` chooses it (gpu_audit_app.config.pick_sink). Raises
ConfigError naming every problem (no such sink, two candidates and no name, a secret
that cannot be read).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from chargeback.sources.search_query import SearchSettings
from gpu_audit.audit.canonical import load_hmac_key
from gpu_audit.credentials import resolve_secret
from gpu_audit.errors import ConfigError
from gpu_audit_app.config import load_settings, pick_sink
from shipper.sinks.archive.config import ArchiveSinkConfig
from shipper.sinks.elasticsearch.config import ElasticsearchSinkConfig, SearchSinkConfigBase
from shipper.sinks.opensearch.config import OpenSearchSinkConfig


def _where(path: Path | None) -> str:
    return str(path) if path else "(default configuration)"


def archive_source(path: Path | None, name: str | None = None) -> tuple[Path, bytes | None]:
    """(the archive directory, the audit HMAC key or None) of the configuration."""
    cfg = load_settings(path)
    sink = pick_sink(cfg, ArchiveSinkConfig, "archive", name, _where(path))
    key_file = cfg.audit.hmac_key_file
    try:
        key = load_hmac_key(key_file) if key_file is not None else None
    except (OSError, ValueError) as exc:
        raise ConfigError(str(path), [f"audit.hmac_key_file: {exc}"]) from None
    return sink.directory_for(cfg.spool.directory), key


def search_settings(path: Path | None, kind: str, name: str | None = None) -> SearchSettings:
    """The connection to the configuration's Elasticsearch or OpenSearch sink."""
    cfg = load_settings(path)
    model: type[SearchSinkConfigBase] = (
        ElasticsearchSinkConfig if kind == "elasticsearch" else OpenSearchSinkConfig)
    sink = pick_sink(cfg, model, kind, name, _where(path))
    what = f"sink {sink.name or sink.type}"
    password = resolve_secret(f"{what}: password", sink.password_env, sink.password_file)
    api_key = resolve_secret(f"{what}: api_key", sink.api_key_env, sink.api_key_file)
    index = sink.data_stream if sink.index_mode == "data_stream" else f"{sink.index_prefix}-*"
    return SearchSettings(
        kind=kind,
        hosts=tuple(sink.hosts),
        index=index,
        cloud_id=getattr(sink, "cloud_id", None),
        username=sink.username,
        password=password.get_secret_value() if password is not None else None,
        api_key=api_key.get_secret_value() if api_key is not None else None,
        tls=sink.tls,
        timeout_s=sink.timeout_s,
    )


def trail_dirs(args: argparse.Namespace) -> tuple[list[Path], bytes | None]:
    """The audit trail a `--group-by slurm|software` bill reads: the `--trail` directories,
    else the archive of `--config` (and `--sink`), with the audit HMAC key of `--config`
    when there is one. ConfigError naming every `--trail` that is not a directory."""
    key = None
    trails = [Path(t) for t in args.trail]
    if not trails:
        archive, key = archive_source(Path(args.config) if args.config else None, args.sink)
        trails = [archive]
    elif args.config:
        _, key = archive_source(Path(args.config), args.sink)
    missing = [str(t) for t in trails if not t.is_dir()]
    if missing:
        raise ConfigError("arguments", [f"--trail {t}: no such directory" for t in missing])
    return trails, key
