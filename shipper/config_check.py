"""`check-config` for the shipper: what YAML validation alone cannot know.

Validation (pydantic) already rejected unknown keys, unknown sink types, bad values and
duplicate sink names. This adds the checks that look at the machine, all of them at
once: every secret's environment variable is set / file is readable, every URL parses
with a scheme and host, TLS files exist, and the dead-letter and archive directories can
be created. Each problem is (key path, message), the key path in the file's own terms
(`shipper.sinks.2.hosts.0`), so the caller can add the file and line. It never returns
or logs a secret's value: problems name the variable or the file only.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel

from gpu_audit.credentials import resolve_secret
from gpu_audit.errors import ConfigError
from gpu_audit.paths import path_problems
from gpu_audit.spool.config import SpoolConfig, default_deadletter_dir
from gpu_audit.tls import TlsConfig
from gpu_audit.yamlload import Loc
from shipper.config import ShipperConfig
from shipper.sinks.archive.config import ArchiveSinkConfig
from shipper.sinks.config import SinkConfig
from shipper.sinks.registry import missing_sdk

Finding = tuple[Loc, str]
_SINKS: Loc = ("shipper", "sinks")


def _secret_problems(where: Loc, model: BaseModel) -> list[Finding]:
    problems: list[Finding] = []
    for field in type(model).model_fields:
        if not field.endswith("_env"):
            continue
        label = field[: -len("_env")]
        env = getattr(model, field)
        file = getattr(model, f"{label}_file", None)
        if env is None and file is None:
            continue
        try:
            resolve_secret(label, env, file)
        except ConfigError as exc:
            key = field if env is not None else f"{label}_file"
            problems.extend(((*where, key), p) for p in exc.problems)
    return problems


def _url_problems(where: Loc, url: str) -> list[Finding]:
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a port that is not a number in range
    except ValueError as exc:
        return [(where, f"{url!r} is not a valid URL ({exc})")]
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return [(where, f"{url!r} must be an http:// or https:// URL with a host")]
    return []


def _tls_problems(where: Loc, tls: TlsConfig) -> list[Finding]:
    problems: list[Finding] = []
    for label in ("ca_file", "client_cert", "client_key"):
        path: Path | None = getattr(tls, label)
        if path is not None and not os.access(path, os.R_OK):
            problems.append(((*where, "tls", label), f"cannot read {path}"))
    return problems


def _dir_problem(where: Loc, directory: Path) -> list[Finding]:
    # a file in the way, a kernel filesystem (/proc, /sys), permissions
    return [(where, message) for message in path_problems(directory)]


def check_sink(i: int, sink: SinkConfig, spool: SpoolConfig | None) -> list[Finding]:
    """Every problem sink number i would meet at start. Without a usable spool section
    (it failed validation) the default archive directory cannot be known and is skipped."""
    where: Loc = (*_SINKS, i)
    problems = _secret_problems(where, sink)
    sdk = missing_sdk(sink.type)
    if sdk is not None:
        problems.append(((*where, "type"), sdk))
    if isinstance(sink, ArchiveSinkConfig):
        directory = sink.directory
        if spool is not None:
            directory = sink.directory_for(Path(spool.directory))
        if directory is not None:
            problems += _dir_problem((*where, "directory"), directory)
        return problems
    for j, url in enumerate(getattr(sink, "hosts", None) or []):
        problems += _url_problems((*where, "hosts", j), url)
    url = getattr(sink, "url", None)
    if isinstance(url, str):
        problems += _url_problems((*where, "url"), url)
    tls = getattr(sink, "tls", None)
    if isinstance(tls, TlsConfig):
        problems += _tls_problems(where, tls)
    return problems


def check_engine(deadletter_dir: Path | None, spool: SpoolConfig | None) -> list[Finding]:
    """The dead-letter directory can be created (skipped when it defaults into a spool
    section that failed validation)."""
    directory = deadletter_dir
    if directory is None and spool is not None:
        directory = default_deadletter_dir(Path(spool.directory))
    return [] if directory is None else _dir_problem(("shipper", "deadletter_dir"), directory)


def check_shipper(
    sinks: Sequence[tuple[int, SinkConfig]],
    spool: SpoolConfig | None,
    *,
    deadletter_dir: Path | None = None,
    deadletter_valid: bool = True,
    sinks_listed: bool = True,
) -> list[Finding]:
    """Every problem the shipper would meet at start, as (key path, message): the one
    path both `check-config` and its tests take.

    `sinks`: each sink that validated, with its index in the file (check-config still
    checks the valid sinks of a list whose other entries failed). `sinks_listed`: the
    list itself validated, so an empty one is a problem. `deadletter_valid`: that setting
    validated (else there is nothing of it to check on the machine)."""
    problems: list[Finding] = []
    if sinks_listed and not sinks:
        problems.append((_SINKS, "empty; records would pile up in the spool unsent"))
    if deadletter_valid:
        problems += check_engine(deadletter_dir, spool)
    for i, sink in sinks:
        problems += check_sink(i, sink, spool)
    return problems


def check_shipper_config(config: ShipperConfig, spool: SpoolConfig) -> list[Finding]:
    """check_shipper for a section that validated whole."""
    if not config.enabled:
        return []
    return check_shipper(list(enumerate(config.sinks)), spool,
                         deadletter_dir=config.deadletter_dir)
