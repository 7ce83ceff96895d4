"""The one YAML loader of every file gpu-audit reads (configuration, simulator scenarios,
web-config files): it remembers where each key was, and refuses what YAML would accept
silently or dangerously.

Refused at load, each with its line:
- a key given twice in one mapping (YAML keeps the last one without a word);
- aliases that expand to more than MAX_NODES nodes (a "billion laughs" alias bomb is a few
  hundred bytes and expands to 10^9 nodes: every later step, locating keys and pydantic
  validation, walks the expansion), and an alias inside its own anchor (a cycle);
- nesting deeper than the parser can follow.
Anchors and aliases themselves are allowed: sharing one TLS block between sinks is
common and harmless, and the expansion bound is what actually protects memory and time.

Validation errors are rendered `line N: key.path: what is wrong`, with the key path in one
style everywhere (dots, list indexes as numbers, no pydantic union tags). This module
must never execute YAML tags (SafeLoader only).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from gpu_audit.errors import ConfigError

M = TypeVar("M", bound=BaseModel)
Loc = tuple[str | int, ...]

# Far above any real file (the largest shipped scenario expands to under 1,000 nodes; a
# configuration with a hundred sinks to a few thousand), far below what hurts: 10^5 nodes
# walk in well under a second and a few tens of MB.
MAX_NODES = 100_000
_MERGE_TAG = "tag:yaml.org,2002:merge"


class YamlSyntaxError(ConfigError):
    """The text is not YAML at all (as opposed to YAML that is refused)."""


@dataclass
class Document:
    """A parsed YAML file: the data, the line of each key path, and load problems."""

    data: Any
    marks: dict[Loc, int] = field(default_factory=dict)
    # (key path, line, message): found while loading, reported with validation problems
    problems: list[tuple[Loc, int, str]] = field(default_factory=list)


def _expanded_size(root: yaml.Node, source: str) -> None:
    """Raise ConfigError when the document expands past MAX_NODES or has an alias cycle.

    Counts each node once per place it appears (what a walk of the data would visit),
    memoised per node so the count itself is linear in the file's size.
    """
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # on the current path from the root: a cycle if met again
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]  # (node, children counted?)
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            open_nodes.discard(key)
            total = 1 + sum(sizes[id(c)] for c in _children(node))
            if total > MAX_NODES:
                raise ConfigError(source, [
                    f"line {node.start_mark.line + 1}: this document holds more than "
                    f"{MAX_NODES:,} values, counting each use of an alias (an alias "
                    "bomb?); write the values out or use fewer aliases"])
            sizes[key] = total
            continue
        if key in sizes:
            continue
        open_nodes.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in open_nodes:
                raise ConfigError(source, [
                    f"line {child.start_mark.line + 1}: an alias refers to a node that "
                    "contains it (a cycle); aliases must not be recursive"])
            if id(child) not in sizes:
                stack.append((child, False))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _walk(node: yaml.Node, path: Loc, doc: Document, reported: set[int]) -> None:
    doc.marks[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        seen: dict[object, int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == _MERGE_TAG:
                # merged keys belong to this mapping; an override of one is no duplicate
                merged = value_node.value if isinstance(value_node, yaml.SequenceNode) \
                    else [value_node]
                for source in merged:
                    _walk(source, path, doc, reported)
                doc.marks[path] = node.start_mark.line + 1
                continue
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node)
            first = seen.get(key)
            if first is not None and line not in reported:
                # an aliased mapping is walked once per use; report its duplicate once
                reported.add(line)
                doc.problems.append(((*path, key), line,
                                     f"duplicate key (also at line {first}); "
                                     "YAML would silently keep the last one"))
            seen.setdefault(key, line)
            doc.marks[(*path, key)] = line
            _walk(value_node, (*path, key), doc, reported)
            doc.marks[(*path, key)] = line
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, (*path, i), doc, reported)


def parse_yaml(text: str, source: str) -> Document:
    """Parse YAML text into a Document; ConfigError when it cannot be used at all."""
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
            problem = getattr(exc, "problem", None) or str(exc)
            raise YamlSyntaxError(source, [f"{where}not valid YAML: {problem}"]) from None
        except RecursionError:
            raise ConfigError(source, ["nested too deeply to read"]) from None
        if node is None:
            return Document(None)
        _expanded_size(node, source)
        doc = Document(None)
        try:
            _walk(node, (), doc, set())
            # after the walk: construction flattens merge keys into the nodes in place
            doc.data = loader.construct_document(node)
        except RecursionError:
            raise ConfigError(source, ["nested too deeply to read"]) from None
        except yaml.YAMLError as exc:  # e.g. a merge of something that is not a mapping
            mark = getattr(exc, "problem_mark", None)
            where = f"line {mark.line + 1}: " if mark else ""
            problem = getattr(exc, "problem", None) or str(exc)
            raise ConfigError(source, [f"{where}not valid YAML: {problem}"]) from None
        return doc
    finally:
        loader.dispose()


def load_yaml(text: str, source: str) -> tuple[Any, dict[Loc, int]]:
    """Parse YAML text; return the data and a map from key path to line number.

    Load problems (duplicate keys) raise ConfigError; callers that report them together
    with validation problems use parse_yaml.
    """
    doc = parse_yaml(text, source)
    if doc.problems:
        raise ConfigError(source, [f"line {line}: {dotted(loc)}: {msg}"
                                   for loc, line, msg in sorted(doc.problems,
                                                                key=lambda p: p[1])])
    return doc.data, doc.marks


def line_for(loc: Loc, marks: dict[Loc, int]) -> int | None:
    """The line of the nearest key path in marks (the key itself, else its parent)."""
    path = tuple(loc)
    while path:
        if path in marks:
            return marks[path]
        path = path[:-1]
    return marks.get(())


def dotted(loc: Loc) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def user_loc(loc: tuple[Any, ...], data: Any) -> Loc:
    """A pydantic error location as the user's key path: union tags pydantic inserts
    (`sinks.2.fluentd.port`, `gpu.list[int]`, `function-after[...]`) are dropped by
    following the data, so every path reads the way the file is written."""
    out: list[str | int] = []
    node = data
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(node, dict):
            if part in node:
                out.append(part)
                node = node[part]
            elif last and isinstance(part, str) and not part.startswith("function-"):
                out.append(part)  # a missing required key
            continue  # a union tag: not in the data
        if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            out.append(part)
            node = node[part]
            continue
        # a scalar, or a tag below one: nothing more in the data to follow
    return tuple(out)


def validation_problems(exc: ValidationError, data: Any) -> list[tuple[Loc, str]]:
    """Each pydantic error as (user key path, message)."""
    problems = []
    for err in exc.errors(include_url=False):
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key (not a setting; check the spelling)"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]  # our own validators' message, as written
        problems.append((user_loc(err["loc"], data), msg))
    return problems


def format_validation_error(exc: ValidationError, marks: dict[Loc, int],
                            data: Any = None) -> list[str]:
    problems = []
    for loc, msg in validation_problems(exc, data):
        line = line_for(loc, marks)
        where = f"line {line}: " if line else ""
        problems.append(f"{where}{dotted(loc)}: {msg}")
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
        raise ConfigError(source, format_validation_error(exc, marks or {}, data)) from None


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
