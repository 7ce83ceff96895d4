"""Where configuration values come from, in order: defaults < YAML file < environment
(`GPU_AUDIT__SECTION__KEY=value`) < command-line options.

All layers are merged as plain data first and validated once, so a bad value from any
layer is reported with every other problem, each blamed on where it came from: the
file and line, the environment variable, or the command-line option. Every command that
reads the configuration (`gpu-audit run/exporter/shipper/check-config`) goes through
`load_layered` with the root model the app layer assembles (gpu_audit_app.config), so
they all see the same values. This module knows no section: it merges and locates, the
model validates.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gpu_audit.errors import ConfigError, Problem
from gpu_audit.yamlload import (
    Document,
    Loc,
    YamlSyntaxError,
    dotted,
    load_yaml,
    parse_yaml,
    read_text,
    validation_problems,
)

ENV_PREFIX = "GPU_AUDIT__"

M = TypeVar("M", bound=BaseModel)

KeyPath = tuple[str, ...]


def _set(data: dict[str, Any], path: KeyPath, value: Any) -> None:
    node = data
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[path[-1]] = value


def _env_path(name: str) -> KeyPath:
    return tuple(p.lower() for p in name[len(ENV_PREFIX):].split("__") if p)


def _env_values(environ: Mapping[str, str]) -> tuple[dict[KeyPath, Any], list[Problem]]:
    values: dict[KeyPath, Any] = {}
    problems: list[Problem] = []
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        path = _env_path(name)
        if not path:
            continue
        try:
            values[path] = load_yaml(raw, name)[0] if raw else raw
        except YamlSyntaxError:
            values[path] = raw  # not YAML: the text itself
        except ConfigError as exc:  # YAML, but refused (an alias bomb, a duplicate key)
            problems += [Problem(p.message, dotted(path), origin=name) for p in exc.located()]
    return values, problems


def env_overrides(environ: Mapping[str, str]) -> dict[KeyPath, Any]:
    """GPU_AUDIT__EXPORTER__LISTEN=127.0.0.1:9945 -> {("exporter", "listen"): "..."}.

    Values are parsed as YAML scalars/lists so numbers and booleans work, with the same
    loader as files (an alias bomb in a variable is refused too, and left out here); a
    value that is not valid YAML is taken as a string.
    """
    return _env_values(environ)[0]


@dataclass
class Layers:
    """The merged configuration data and, for each value, where it came from."""

    path: Path | None
    doc: Document
    data: dict[str, Any]
    origins: dict[KeyPath, str] = field(default_factory=dict)
    env_problems: list[Problem] = field(default_factory=list)

    @property
    def source(self) -> str:
        return str(self.path) if self.path is not None else "configuration (no file)"

    def locate(self, loc: Loc, message: str) -> Problem:
        """A problem at key path `loc`, blamed on the layer that set it."""
        path = tuple(str(p) for p in loc)
        for n in range(len(path), 0, -1):
            origin = self.origins.get(path[:n])
            if origin is not None:
                return Problem(message, dotted(loc), origin=origin)
        if self.path is None:
            return Problem(message, dotted(loc))
        line = None
        for n in range(len(loc), 0, -1):
            if loc[:n] in self.doc.marks:
                line = self.doc.marks[loc[:n]]
                break
        return Problem(message, dotted(loc), file=str(self.path), line=line)

    def load_problems(self) -> list[Problem]:
        """What the loader refused in the file and in the variables."""
        return [Problem(msg, dotted(loc), file=self.source, line=line)
                for loc, line, msg in self.doc.problems] + self.env_problems


def gather(
    path: Path | None,
    overrides: Mapping[KeyPath, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    labels: Mapping[KeyPath, str] | None = None,
) -> Layers:
    """Read the file and merge every layer; ConfigError when the file cannot be used.

    `labels` names each override (`--listen`) for problems found in its value.
    """
    doc = Document({})
    if path is not None:
        doc = parse_yaml(read_text(path), str(path))
        if doc.data is None:
            doc.data = {}
        if not isinstance(doc.data, dict):
            raise ConfigError(str(path), [
                f"top level must be a mapping, not {type(doc.data).__name__}"])
    layers = Layers(path, doc, doc.data)
    env = os.environ if environ is None else environ
    for name in sorted(env):
        if name.startswith(ENV_PREFIX) and _env_path(name):
            layers.origins[_env_path(name)] = name
    layered, layers.env_problems = _env_values(env)
    for key_path, value in (overrides or {}).items():
        layered[key_path] = value
        layers.origins[key_path] = (labels or {}).get(key_path, "command line")
    for key_path, value in layered.items():
        if value is not None:
            _set(layers.data, key_path, value)
        else:
            layers.origins.pop(key_path, None)
    return layers


def load_layered(
    model: type[M],
    path: Path | None,
    overrides: Mapping[KeyPath, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    labels: Mapping[KeyPath, str] | None = None,
) -> M:
    """Load `model` with every layer applied; raises ConfigError naming every problem
    with its file and line, or its variable or option."""
    layers = gather(path, overrides, environ, labels)
    problems = layers.load_problems()
    config: M | None = None
    try:
        config = model.model_validate(layers.data)
    except ValidationError as exc:
        problems += [layers.locate(loc, msg)
                     for loc, msg in validation_problems(exc, layers.data)]
    if problems or config is None:
        ordered: list[Problem] = sorted(problems, key=Problem.sort_key)
        raise ConfigError(layers.source, ordered)
    return config
