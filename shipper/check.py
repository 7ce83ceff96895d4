"""`check-config` for the shipper: what YAML validation alone cannot know.

Validation (pydantic) already rejected unknown keys, unknown sink types, bad values and
duplicate sink names. This adds the checks that look at the machine, all of them at
once: every secret's environment variable is set / file is readable, every URL parses
with a scheme and host, TLS files exist, and the dead-letter and archive directories can
be created. It never returns or logs a secret's value: problems name the variable or the
file only.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel

from gpu_audit.errors import ConfigError
from gpu_audit.paths import directory_problems
from gpu_audit.spool.config import SpoolConfig
from shipper.config import ShipperConfig
from shipper.sinks.config import ArchiveSinkConfig, TlsConfig, resolve_secret, sink_name
from shipper.sinks.factory import default_archive_dir, missing_sdk


def _secret_problems(where: str, model: BaseModel) -> list[str]:
    problems: list[str] = []
    fields = type(model).model_fields
    for field in fields:
        if not field.endswith("_env"):
            continue
        label = field[: -len("_env")]
        env = getattr(model, field)
        file = getattr(model, f"{label}_file", None)
        if env is None and file is None:
            continue
        try:
            resolve_secret(f"{where}.{label}", env, file)
        except ConfigError as exc:
            problems.extend(f"{where}: {p}" for p in exc.problems)
    return problems


def _url_problems(where: str, url: str) -> list[str]:
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a port that is not a number in range
    except ValueError as exc:
        return [f"{where}: {url!r} is not a valid URL ({exc})"]
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return [f"{where}: {url!r} must be an http:// or https:// URL with a host"]
    return []


def _tls_problems(where: str, tls: TlsConfig) -> list[str]:
    problems: list[str] = []
    for label in ("ca_file", "client_cert", "client_key"):
        path: Path | None = getattr(tls, label)
        if path is not None and not os.access(path, os.R_OK):
            problems.append(f"{where}.tls.{label}: cannot read {path}")
    return problems


def _dir_problem(where: str, directory: Path) -> list[str]:
    return directory_problems(where, directory)  # a file in the way, /proc, permissions


def archive_directory(cfg: ArchiveSinkConfig, spool: SpoolConfig) -> Path:
    """Where an archive sink writes: its directory, or 'archive' beside the spool."""
    return cfg.directory or default_archive_dir(Path(spool.directory))


def check_shipper(config: ShipperConfig, spool: SpoolConfig) -> list[str]:
    """Every problem the shipper would meet at start, as `shipper.sinks[i] (name): ...`."""
    problems: list[str] = []
    if config.enabled and not config.sinks:
        problems.append("shipper.sinks: empty; records would pile up in the spool unsent")
    deadletter = config.deadletter_dir or Path(spool.directory) / "deadletter"
    problems += _dir_problem("shipper.deadletter_dir", deadletter)
    for i, sink in enumerate(config.sinks):
        where = f"shipper.sinks[{i}] ({sink_name(sink)})"
        problems += _secret_problems(where, sink)
        sdk = missing_sdk(sink.type)
        if sdk is not None:
            problems.append(f"{where}: {sdk}")
        if isinstance(sink, ArchiveSinkConfig):
            problems += _dir_problem(f"{where}.directory", archive_directory(sink, spool))
            continue
        for url in getattr(sink, "hosts", None) or []:
            problems += _url_problems(f"{where}.hosts", url)
        url = getattr(sink, "url", None)
        if isinstance(url, str):
            problems += _url_problems(f"{where}.url", url)
        tls = getattr(sink, "tls", None)
        if isinstance(tls, TlsConfig):
            problems += _tls_problems(where, tls)
    return problems
