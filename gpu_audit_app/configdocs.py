"""Generate docs/CONFIGURATION.md from the configuration models.

`python -m gpu_audit_app.configdocs` writes the file; `--check` exits 1 when the
committed file differs from what the models would generate. Every row comes from the
pydantic models the loader validates against (gpu_audit_app.config.Config and the
section models it composes): key, type, default, allowed values, description, the
environment variable and the command-line option that set it. This module must never
describe a key by hand; where a description is missing, the fix is a `description=` in
the model (tests/app/config/test_config_reference.py fails on a key without one).

It lives in the app layer because only the app layer sees every section.
"""

from __future__ import annotations

import argparse
import re
import socket
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types as at
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gpu_audit.config_layers import ENV_PREFIX
from gpu_audit.gendoc import write_or_check
from gpu_audit_app.config import Config
from gpu_audit_app.launcher.main import LauncherConfig, serve_options

DEFAULT_PATH = Path(__file__).resolve().parent.parent / "docs" / "CONFIGURATION.md"
REGENERATE = "python -m gpu_audit_app.configdocs"
LAUNCHER_TITLE = "Launcher daemon (`gpu-audit launcher serve --config FILE`)"

# Defaults computed at load time, described instead of evaluated (the host name of the
# machine that generated the docs is not the default).
_FACTORY_TEXT: dict[Callable[[], Any], str] = {
    socket.gethostname: "this machine's host name",
}

# A key naming where a secret is (never the secret): `<secret>_env` / `<secret>_file`.
_SECRET_KEY = re.compile(r"^(password|api_key|token|shared_key|hmac_key)_(env|file)$")


@dataclass(frozen=True)
class Row:
    path: tuple[str, ...]  # ("exporter", "listen"); list items as "sinks[]"
    type: str
    default: str
    allowed: str
    description: str
    env: str | None  # the GPU_AUDIT__... variable, None inside lists
    # where the secret this key names is kept: "variable" or "file"; None: not a secret
    kept_in: str | None


@dataclass(frozen=True)
class Table:
    title: str
    path: tuple[str, ...]
    doc: str
    rows: tuple[Row, ...]


def _strip_annotated(annotation: Any) -> Any:
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return annotation


def _alternatives(annotation: Any) -> list[Any]:
    annotation = _strip_annotated(annotation)
    if get_origin(annotation) in (Union, types.UnionType):
        return [a for arg in get_args(annotation) for a in _alternatives(arg)]
    return [annotation]


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models a field holds: itself, or the items of a list of models (the sinks)."""
    out: list[type[BaseModel]] = []
    for alt in _alternatives(annotation):
        if _is_model(alt):
            out.append(alt)
        elif get_origin(alt) in (list, tuple):
            out += [m for arg in get_args(alt) for m in _models_in(arg)]
    return out


def _dict_values(annotation: Any) -> type[BaseModel] | None:
    """The model a mapping of sections holds (dict[str, Model]), else None."""
    for alt in _alternatives(annotation):
        if get_origin(alt) is dict:
            value = _strip_annotated(get_args(alt)[1])
            if _is_model(value):
                return value  # type: ignore[no-any-return]
    return None


def _type_name(annotation: Any) -> str:
    alts = _alternatives(annotation)
    optional = type(None) in alts
    names = [_one_type(a) for a in alts if a is not type(None)]
    text = " or ".join(dict.fromkeys(names))
    return f"{text} or null" if optional else text


def _one_type(tp: Any) -> str:
    tp = _strip_annotated(tp)
    origin = get_origin(tp)
    if origin is Literal:
        values = get_args(tp)
        if len(values) == 1:
            return f"`{values[0]}`"
        return "one of " + ", ".join(f"`{v}`" for v in values)
    if origin in (list, tuple, set, frozenset):
        args = [a for a in get_args(tp) if a is not Ellipsis]
        return f"list of {_one_type(args[0])}" if args else "list"
    if origin is dict:
        key, value = get_args(tp)
        return f"mapping {_one_type(key)} -> {_one_type(value)}"
    if _is_model(tp):
        return "section"
    simple = {bool: "boolean", int: "integer", float: "number", str: "string",
              Path: "path", SecretStr: "string"}
    if tp in simple:
        return simple[tp]
    if isinstance(tp, type) and issubclass(tp, Enum):
        return "one of " + ", ".join(f"`{m.value}`" for m in tp)
    return getattr(tp, "__name__", str(tp))


def _yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return _yaml_scalar(value.value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_yaml_scalar(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml_scalar(v)}" for k, v in value.items()) + "}"
    if isinstance(value, BaseModel):
        fields = value.model_dump(exclude_defaults=True)
        return "{" + ", ".join(f"{k}: {_yaml_scalar(v)}" for k, v in fields.items()) + "}"
    if isinstance(value, str):
        return '""' if value == "" else value
    return repr(value) if isinstance(value, float) else str(value)


def _size(n: int) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return ""


def _default(name: str, field: FieldInfo) -> str:
    if field.default_factory is not None:
        factory = field.default_factory
        if factory in _FACTORY_TEXT:
            return _FACTORY_TEXT[factory]
        value = factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "**required**"
    else:
        value = field.default
    text = f"`{_yaml_scalar(value)}`"
    if isinstance(value, int) and not isinstance(value, bool) and "bytes" in name:
        size = _size(value)
        if size:
            text += f" ({size})"
    if isinstance(value, int) and not isinstance(value, bool) and name.endswith("_mode"):
        text += f" (octal {value:o})"  # permission bits
    return text


def _constraints(field: FieldInfo) -> str:
    parts: list[str] = []
    for meta in field.metadata:
        if isinstance(meta, at.Gt):
            parts.append(f"> {meta.gt}")
        elif isinstance(meta, at.Ge):
            parts.append(f">= {meta.ge}")
        elif isinstance(meta, at.Lt):
            parts.append(f"< {meta.lt}")
        elif isinstance(meta, at.Le):
            parts.append(f"<= {meta.le}")
        elif isinstance(meta, at.MinLen):
            parts.append(f"length >= {meta.min_length}")
        elif isinstance(meta, at.MaxLen):
            parts.append(f"length <= {meta.max_length}")
        else:
            pattern = getattr(meta, "pattern", None)
            if pattern is not None:
                parts.append(f"matches `{pattern}`")
    return ", ".join(parts)


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def _walk(model: type[BaseModel], path: tuple[str, ...], in_list: bool, title: str,
          seen: dict[type[BaseModel], str], *, env_layer: bool = True) -> Iterator[Table]:
    rows: list[Row] = []
    subs: list[tuple[type[BaseModel], tuple[str, ...], bool, str]] = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        key_path = (*path, key)
        models = _models_in(field.annotation)
        env = (None if in_list or not env_layer
               else ENV_PREFIX + "__".join(k.upper() for k in key_path))
        match = _SECRET_KEY.match(key)
        kept_in = None if match is None else ("variable" if match.group(2) == "env" else "file")
        description = field.description or ""
        if in_list and key == "type" and _literal_of(model, "type") and not description:
            description = "Selects this kind of sink."
        if models and get_origin(_strip_annotated(field.annotation)) is list:
            kinds = []
            for m in models:
                kind = _literal_of(m, "type")
                kinds.append(f"`{kind}`" if kind else m.__name__)
                sub_title = f"`{'.'.join(key_path)}[]` with `type: {kind}`"
                subs.append((m, (*key_path[:-1], f"{key}[]"), True, sub_title))
            rows.append(Row(key_path, "list of sections", _default(key, field), "",
                            f"{description} Types: {', '.join(kinds)} (below).", env, None))
            continue
        values = _dict_values(field.annotation)
        if values is not None and values not in seen:
            # a mapping of sections (urgency levels, per-user quotas): its row keeps the
            # default; the keys of one entry get their own table
            sub_path = (*key_path, "<name>")
            subs.append((values, sub_path, in_list, f"`{'.'.join(sub_path)}`"))
        if models:
            model_type = models[0]
            sub_path_text = ".".join(key_path)
            if model_type in seen:
                rows.append(Row(key_path, "section", "(section)", "",
                                f"{description} The keys of `{seen[model_type]}`.".strip(),
                                env, None))
            else:
                rows.append(Row(key_path, "section", "(section)", "",
                                description or _first_line(model_type.__doc__) or
                                f"See `{sub_path_text}` below.", env, None))
                subs.append((model_type, key_path, in_list, f"`{sub_path_text}`"))
            continue
        allowed = _constraints(field)
        rows.append(Row(key_path, _type_name(field.annotation), _default(key, field), allowed,
                        description, env, kept_in))
    doc = _first_line(model.__doc__) if path else ""  # the root is introduced by hand
    yield Table(title, path, doc, tuple(rows))
    for sub_model, sub_path, sub_in_list, sub_title in subs:
        if sub_model in seen and sub_model is not Config:
            continue
        seen.setdefault(sub_model, ".".join(sub_path))
        yield from _walk(sub_model, sub_path, sub_in_list, sub_title, seen,
                         env_layer=env_layer)


def _literal_of(model: type[BaseModel], name: str) -> str | None:
    field = model.model_fields.get(name)
    if field is None:
        return None
    tp = _strip_annotated(field.annotation)
    if get_origin(tp) is Literal:
        return str(get_args(tp)[0])
    return None


def _first_line(doc: str | None) -> str:
    # a model's own docstring (first paragraph) only: an inherited BaseModel docstring
    # says nothing about the section
    if not doc or doc is BaseModel.__doc__:
        return ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def tables() -> list[Table]:
    """Every section of the configuration file, root first, in the order of the models."""
    seen: dict[type[BaseModel], str] = {}
    return list(_walk(Config, (), False, "Top level", seen))


def rows() -> list[Row]:
    return [row for table in tables() for row in table.rows]


def launcher_tables() -> list[Table]:
    """Every section of the launcher daemon's file (gpu_audit_app.launcher.main's
    LauncherConfig and the core models it composes). It has no environment layer."""
    seen: dict[type[BaseModel], str] = {}
    return list(_walk(LauncherConfig, (), False, "Launcher top level", seen, env_layer=False))


def launcher_rows() -> list[Row]:
    return [row for table in launcher_tables() for row in table.rows]


def _options() -> dict[tuple[str, ...], str]:
    # the command-line options that set a key (gpu_audit_app.cli's table, read not copied)
    from gpu_audit_app import cli  # noqa: PLC0415 - the CLI module imports every command

    return cli._labels()


def _launcher_options() -> dict[tuple[str, ...], str]:
    # the `launcher serve` options that set a key (read from its parser, as serve applies)
    return {(key,): option for key, option in serve_options().items()}


def _render(tables_: list[Table], options: dict[tuple[str, ...], str],
            depth: int) -> list[str]:
    out: list[str] = []
    for table in tables_:
        level = "#" * (depth + (len(table.path) > 1))
        out += [f"{level} {table.title}", ""]
        if table.doc:
            out += [table.doc, ""]
        out += ["| Key | Type | Default | Allowed | Description | Set from |",
                "|---|---|---|---|---|---|"]
        for row in table.rows:
            setters = []
            if row.env is not None and row.type != "section":
                setters.append(f"`{row.env}`")
            if row.path in options:
                setters.append(f"`{options[row.path]}`")
            description = row.description
            if row.kept_in == "variable":
                description = f"**secret** (names the variable). {description}"
            elif row.kept_in == "file":
                description = f"**secret** (a file). {description}"
            out.append("| " + " | ".join(_cell(c) for c in (
                f"`{row.path[-1]}`", row.type, row.default, row.allowed, description,
                ", ".join(setters))) + " |")
        out.append("")
    return out


def generate() -> str:
    options = _options()
    out = [
        "# Configuration reference",
        "",
        f"Generated by `{REGENERATE}` from the configuration models",
        "(`gpu_audit_app/config.py` and the section models it composes); do not edit by hand:",
        "a test fails when this file and the models disagree. An annotated example:",
        "[config-example.yaml](config-example.yaml).",
        "",
        "One YAML file (`--config FILE`) holds every section. Every key has a default, so",
        "the exporter runs with no file at all; unknown keys are errors. Check a file with",
        "`gpu-audit check-config --config FILE` (exit 2 lists every problem at once).",
        "",
        "Where a value comes from, later wins: default < file < environment variable <",
        "command-line option. Every key outside a list has a variable:",
        f"`{ENV_PREFIX}` + the key path in upper case joined by `__`",
        f"(`{ENV_PREFIX}EXPORTER__LISTEN=127.0.0.1:9945`). Its value is read as YAML, so",
        "numbers, booleans and lists work (`GPU_AUDIT__ATTRIBUTION__SOURCES='[jobmap, cgroup]'`);",
        "a variable for a list of sections (`GPU_AUDIT__SHIPPER__SINKS`) replaces the whole",
        "list.",
        "",
        "**Secrets are never written in the file.** A key ending in `_env` names the",
        "environment variable that holds the secret, one ending in `_file` a file whose",
        "content is the secret (a trailing newline is dropped); set one of the two. A",
        "sink's secrets are read when the sink is built, so `check-config` runs where they",
        "are absent, and a missing one is an error naming the variable or file, never the",
        "value. The secret keys are marked **secret** below.",
        "",
        "Defaults in bytes are shown with their size; sizes in the file are plain integers.",
        "",
    ]
    out += _render(tables(), options, 2)
    out += [
        f"## {LAUNCHER_TITLE}",
        "",
        "The job launcher's daemon reads its own YAML file, separate from the one above",
        "(`gpu_audit_app/launcher/main.py` `LauncherConfig`, whose `core` is",
        "`launcher/config.py` `LauncherCoreConfig`, the model replay also uses). Every key",
        "has a default, so `serve` runs with no file; unknown keys are errors (exit 2, every",
        "problem listed). Later wins: default < file < the `serve` option shown. This file",
        "has **no environment-variable layer**: no `GPU_AUDIT__...` variable sets a key",
        "(`GPU_AUDIT_LAUNCHER_SOCKET` is read by the client commands' `--socket` only).",
        "The scheduling keys are explained in [LAUNCHER.md](LAUNCHER.md).",
        "",
    ]
    out += _render(launcher_tables(), _launcher_options(), 3)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=REGENERATE, description=__doc__)
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when the file differs from what the models generate")
    parser.add_argument("--output", type=Path, default=DEFAULT_PATH)
    args = parser.parse_args(argv)
    return write_or_check(args.output, generate(), REGENERATE, check=args.check)


if __name__ == "__main__":
    raise SystemExit(main())
