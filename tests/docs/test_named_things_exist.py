"""What README.md and docs/*.md name exists: every repository path they put in
backticks, every `gpu-audit` command they show and every option they give it. A renamed
file, a removed command or option fails here until the docs follow."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from gpu_audit_app.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = {"exporter", "shipper", "alerts", "dashboards", "chargeback", "launcher", "gpu_audit",
       "gpu_audit_app", "gpu_audit_ckpt", "tests", "bench", "docs", "deploy", "compose",
       "examples", "scripts", ".ci"}
# `folder/file.ext`, `folder/`, `folder/sub/name`
PATH = re.compile(r"`((?:[\w.-]+/)+[\w.-]*)`")
COMMAND = re.compile(r"gpu-audit ([a-z][^`\n|]*)")
OPTION = re.compile(r"--[a-z][\w-]*")


def _named_paths() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        for m in PATH.finditer(doc.read_text()):
            if m.group(1).split("/")[0] in TOP:
                found.append((doc.name, m.group(1)))
    return found


def _subparsers(p: argparse.ArgumentParser) -> argparse._SubParsersAction | None:  # type: ignore[type-arg]
    return next((a for a in p._actions if isinstance(a, argparse._SubParsersAction)), None)


def _problems_of(words: list[str], root: argparse.ArgumentParser) -> tuple[int, list[str]]:
    """How many command words matched, and what of the command line does not exist."""
    parser, path = root, []
    for word in words:
        sub = _subparsers(parser)
        if sub is None or not re.fullmatch(r"[a-z][\w-]*", word):
            break
        if word not in sub.choices:
            return len(path), ([] if not path else
                               [f"no command `gpu-audit {' '.join([*path, word])}`"])
        parser, path = sub.choices[word], [*path, word]
    if not path:
        return 0, []
    options = {o for a in parser._actions for o in a.option_strings}
    rest = words[len(path):]
    missing = [f"`gpu-audit {' '.join(path)}` has no option {o}"
               for w in rest if (o := w.split("=")[0].rstrip(".,;:)")) and
               OPTION.fullmatch(o) and o not in options]
    return len(path), missing


def _code(doc: Path) -> list[tuple[int, str]]:
    """(line number, code) of a Markdown file: fenced blocks' lines and inline `spans`
    (prose such as "the gpu-audit launcher" is not a command)."""
    out: list[tuple[int, str]] = []
    fenced = False
    for n, line in enumerate(doc.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            out.append((n, line))
        else:
            out += [(n, span) for span in re.findall(r"`([^`]+)`", line)]
    return out


def test_every_path_the_docs_name_exists() -> None:
    named = _named_paths()
    assert len(named) > 50, "too few paths found for the check to mean anything"
    missing = [f"{doc}: {path}" for doc, path in named if not (ROOT / path).exists()]
    assert missing == []


def test_every_command_and_option_the_docs_show_exists() -> None:
    root = build_parser()
    seen = 0
    problems: list[str] = []
    for doc in DOCS:
        for n, code in _code(doc):
            for m in COMMAND.finditer(code):
                matched, found = _problems_of(m.group(1).split(), root)
                seen += matched > 0
                problems += [f"{doc.name}:{n}: {p}" for p in found]
    assert seen > 80, "too few commands found for the check to mean anything"
    assert problems == []


@pytest.mark.parametrize(("line", "expected"), [
    ("spool verify --bogus DIR", ["`gpu-audit spool verify` has no option --bogus"]),
    ("launcher frob 3", ["no command `gpu-audit launcher frob`"]),
    ("spool verify --json DIR", []),
    ("is the command", []),
])
def test_the_check_catches_what_it_must(line: str, expected: list[str]) -> None:
    """The scanner itself: an unknown option or action is reported, prose is not."""
    assert _problems_of(line.split(), build_parser())[1] == expected


def _actions(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[str]:
    """Every command and action of the parser tree, as `gpu-audit a b` paths' last words
    under their group: ['run', 'audit verify', ..., 'launcher replay', ...]."""
    sub = _subparsers(parser)
    if sub is None:
        return [" ".join(path)] if path else []
    out: list[str] = []
    for name, child in sub.choices.items():
        out += _actions(child, (*path, name))
    return out


def test_the_readme_command_table_names_every_command_and_action() -> None:
    """A newcomer finds every command from the README: each top-level command and each
    action of a group appears in its Commands table."""
    text = (ROOT / "README.md").read_text()
    table = text.split("## Commands", 1)[1].split("\n## ", 1)[0]
    missing = []
    for action in _actions(build_parser()):
        group, _, verb = action.rpartition(" ")
        rows = [r for r in table.splitlines() if f"`gpu-audit {group or verb}" in r]
        if not any(not group or re.search(rf"`(?:gpu-audit )?(?:{group} )?{re.escape(verb)}\b", r)
                   for r in rows):
            missing.append(action)
    assert missing == []
