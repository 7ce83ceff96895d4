"""YAML loading that remembers where each key was, and pydantic validation that reports
every problem with that location.

Used for the main config and for simulator scenario files, so both give the same kind of
error: `file:line: key.path: what is wrong`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from gpu_audit.errors import ConfigError

M = TypeVar("M", bound=BaseModel)
Loc = tuple[str | int, ...]


def _walk(node: yaml.Node, path: Loc, marks: dict[Loc, int]) -> None:
    marks[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node)
            marks[(*path, key)] = key_node.start_mark.line + 1
            _walk(value_node, (*path, key), marks)
            marks[(*path, key)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, (*path, i), marks)


def load_yaml(text: str, source: str) -> tuple[Any, dict[Loc, int]]:
    """Parse YAML text; return the data and a map from key path to line number."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(source, [f"{where}not valid YAML: {problem}"]) from None
    marks: dict[Loc, int] = {}
    if node is not None:
        _walk(node, (), marks)
    return data, marks


def _line_for(loc: Loc, marks: dict[Loc, int]) -> int | None:
    path = tuple(loc)
    while path:
        if path in marks:
            return marks[path]
        path = path[:-1]
    return marks.get(())


def format_validation_error(exc: ValidationError, marks: dict[Loc, int]) -> list[str]:
    problems = []
    for err in exc.errors(include_url=False):
        # pydantic puts union tags / model names into loc; keep the user-visible keys
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        dotted = ".".join(str(p) for p in loc) or "(top level)"
        line = _line_for(loc, marks)
        where = f"line {line}: " if line else ""
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key (not a setting; check the spelling)"
        problems.append(f"{where}{dotted}: {msg}")
    return problems


def validate(model: type[M], data: Any, source: str, marks: dict[Loc, int] | None = None) -> M:
    """Validate data against a model, raising ConfigError listing every problem."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, [f"top level must be a mapping, not {type(data).__name__}"])
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, format_validation_error(exc, marks or {})) from None


def read_text(path: Path) -> str:
    """A configuration or scenario file's text; ConfigError when unreadable or not UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), [f"not UTF-8 text: {exc.reason}"]) from None


def load_file(model: type[M], path: Path) -> M:
    data, marks = load_yaml(read_text(path), str(path))
    return validate(model, data, str(path), marks)
