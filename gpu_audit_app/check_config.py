"""`gpu-audit check-config`: everything that can be checked without starting anything,
in one pass.

Structure (the YAML against the models) and the machine (the web-config and scenario
files the configuration points to, the HMAC key, the shipper's secrets, URLs, TLS files
and directories) are checked together: a section that fails validation does not hide
the machine checks of the others, and within the shipper each sink that validates is
checked even when another does not. Every problem names its file and line, or the
environment variable or option that set the value, and they are reported sorted, in one
ConfigError.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from gpu_audit.config_layers import KeyPath, Layers, gather
from gpu_audit.errors import ConfigError, Problem
from gpu_audit.yamlload import Loc, validation_problems
from gpu_audit_app.config import Config


def check_config(
    path: Path | None,
    overrides: Mapping[KeyPath, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    labels: Mapping[KeyPath, str] | None = None,
) -> Config:
    """The validated configuration; ConfigError listing every problem otherwise."""
    layers = gather(path, overrides, environ, labels)
    problems = layers.load_problems()
    config: Config | None = None
    try:
        config = Config.model_validate(layers.data)
    except ValidationError as exc:
        problems += [layers.locate(loc, msg)
                     for loc, msg in validation_problems(exc, layers.data)]
    problems += _machine_problems(layers.data, layers)
    if problems or config is None:
        ordered: list[Problem] = sorted(set(problems), key=Problem.sort_key)
        raise ConfigError(layers.source, ordered)
    return config


_INVALID = object()


def _valid(annotation: Any, raw: Any) -> Any:
    try:
        return TypeAdapter(annotation).validate_python(raw)
    except ValidationError:
        return _INVALID


def _fields(model: type[BaseModel], raw: Any) -> dict[str, Any]:
    """Each setting of a section that failed validation, validated alone: what is valid
    can still be checked against the machine (the rest is left out)."""
    if not isinstance(raw, dict):
        return {}
    out: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        value = _valid(field.annotation, raw[name]) if name in raw else field.get_default(
            call_default_factory=True)
        if value is not _INVALID:
            out[name] = value
    return out


def _usable(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per section, the settings usable for machine checks."""
    out: dict[str, dict[str, Any]] = {}
    for name, field in Config.model_fields.items():
        section = field.annotation
        if not (isinstance(section, type) and issubclass(section, BaseModel)):
            continue  # host, log_level: nothing on the machine to check
        raw = data.get(name, {})
        whole = _valid(section, raw)
        if whole is not _INVALID:
            out[name] = {f: getattr(whole, f) for f in section.model_fields}
        else:
            out[name] = _fields(section, raw)
    return out


def _machine_problems(data: dict[str, Any], layers: Layers) -> list[Problem]:
    from gpu_audit.spool.config import SpoolConfig

    problems: list[Problem] = []
    sections = _usable(data)
    ex = sections["exporter"]
    if ex.get("web_config_file") is not None:
        problems += _web_config(("exporter", "web_config_file"), ex["web_config_file"], layers)
    if ex.get("backend") == "sim":
        problems += _scenario(ex.get("scenario"), layers)
    key_file = sections["audit"].get("hmac_key_file")
    if key_file is not None and not os.access(key_file, os.R_OK):
        problems.append(layers.locate(("audit", "hmac_key_file"),
                                      f"{key_file} is not a readable file"))
    spool_dir = sections["spool"].get("directory")
    if spool_dir is not None:
        from gpu_audit.paths import path_problems

        problems += [layers.locate(("spool", "directory"), message)
                     for message in path_problems(Path(spool_dir))]
    inventory_dir = ex.get("inventory_directory")
    if inventory_dir is not None:
        # at start a bad one is a warning (the exporter serves without it); say it here
        from gpu_audit.paths import path_problems

        problems += [layers.locate(("exporter", "inventory_directory"), message)
                     for message in path_problems(Path(inventory_dir))]
    spool_raw = data.get("spool", {})
    spool = _valid(SpoolConfig, spool_raw)
    if spool is _INVALID:
        # the default directories (dead letters, archive) live in the spool directory
        directory = sections["spool"].get("directory")
        spool = SpoolConfig(directory=directory) if directory is not None else None
    shipper = sections["shipper"]
    if shipper.get("web_config_file") is not None:
        problems += _web_config(("shipper", "web_config_file"), shipper["web_config_file"],
                                layers)
    if not shipper.get("enabled", True):
        return problems
    from shipper.config_check import check_shipper

    raw_sinks = data.get("shipper", {}).get("sinks") if isinstance(
        data.get("shipper"), dict) else None
    if "sinks" in shipper:
        sinks = list(enumerate(shipper["sinks"]))
    else:
        from shipper.sinks.config import SinkConfig

        sinks = [(i, s) for i, raw in enumerate(raw_sinks if isinstance(raw_sinks, list) else [])
                 if (s := _valid(SinkConfig, raw)) is not _INVALID]
    findings = check_shipper(sinks, spool, sinks_listed="sinks" in shipper,
                             deadletter_dir=shipper.get("deadletter_dir"),
                             deadletter_valid="deadletter_dir" in shipper)
    problems += [layers.locate(loc, msg) for loc, msg in findings]
    return problems


def _web_config(key: Loc, path: Path, layers: Layers) -> list[Problem]:
    from gpu_audit.http.webconfig import load_web_config

    if not path.is_file():
        return [layers.locate(key, f"{path} is not a readable file")]
    try:
        load_web_config(path)
    except ConfigError as exc:
        return exc.located()
    return []


def _scenario(scenario: str | None, layers: Layers) -> list[Problem]:
    from exporter.sim.scenario import SHIPPED, load_scenario

    if not scenario:
        return [layers.locate(("exporter", "backend"),
                              "the sim backend needs a scenario (exporter.scenario or "
                              "--scenario: a shipped name such as busy, or a file)")]
    if scenario not in SHIPPED and not Path(scenario).is_file():
        return [layers.locate(("exporter", "scenario"),
                              f"no scenario file {scenario}; shipped scenarios are: "
                              f"{', '.join(SHIPPED)}")]
    try:
        load_scenario(scenario)
    except ConfigError as exc:
        return exc.located()
    return []
