"""Where configuration values come from, in order: defaults < YAML file < environment
(`GPU_AUDIT__SECTION__KEY=value`) < command-line options.

All layers are merged as plain data first and validated once, so a bad value from any
layer is reported with every other problem, with the layer it came from.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gpu_audit.config import Config
from gpu_audit.errors import ConfigError
from gpu_audit.yamlload import Loc, load_yaml, read_text, validate

ENV_PREFIX = "GPU_AUDIT__"


def _set(data: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = data
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[path[-1]] = value


def env_overrides(environ: Mapping[str, str]) -> dict[tuple[str, ...], Any]:
    """GPU_AUDIT__EXPORTER__LISTEN=127.0.0.1:9945 -> {("exporter", "listen"): "..."}.

    Values are parsed as YAML scalars/lists so numbers and booleans work.
    """
    out: dict[tuple[str, ...], Any] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        path = tuple(p.lower() for p in name[len(ENV_PREFIX):].split("__") if p)
        if not path:
            continue
        try:
            out[path] = yaml.safe_load(raw) if raw else raw
        except yaml.YAMLError:
            out[path] = raw
    return out


def load_settings(
    path: Path | None,
    overrides: Mapping[tuple[str, ...], Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Load the configuration with every layer applied; raises ConfigError."""
    source = str(path) if path else "(defaults)"
    data: Any = {}
    marks: dict[Loc, int] = {}
    if path is not None:
        data, marks = load_yaml(read_text(path), source)
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(source, [f"top level must be a mapping, not {type(data).__name__}"])
    layered = dict(env_overrides(os.environ if environ is None else environ))
    layered.update(overrides or {})
    for key_path, value in layered.items():
        if value is not None:
            _set(data, key_path, value)
    return validate(Config, data, source, marks)
