"""The whole `gpu-audit` parser tree, walked: every command group exits 2 with its usage
when its action is missing (README and docs/RUNNING.md promise exit 2 for bad arguments),
and every group's help still exits 0."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from gpu_audit.errors import EXIT_USAGE
from gpu_audit_app.cli import build_parser, main


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:  # type: ignore[type-arg]
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)),
                None)


def _groups(parser: argparse.ArgumentParser,
            path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The path of every parser that has subcommands of its own, below the top level."""
    sub = _subparsers(parser)
    if sub is None:
        return
    if path:
        yield path
    for name, child in sub.choices.items():
        yield from _groups(child, (*path, name))


GROUPS = sorted(_groups(build_parser()))


def test_the_walk_finds_every_command_group() -> None:
    """The walk reaches the groups the README names, so the tests below cover them."""
    assert {("audit",), ("spool",), ("rules",), ("dashboards",), ("launcher",),
            ("slurm",), ("chargeback",)} <= set(GROUPS)


@pytest.mark.parametrize("group", GROUPS, ids=" ".join)
def test_a_group_without_its_action_exits_2_with_its_usage(
        group: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    """`gpu-audit GROUP` with no action is a usage error: exit 2, usage on stderr naming
    the group, nothing on stdout (a script that forgot the action must not pass)."""
    with pytest.raises(SystemExit) as exc:
        main(list(group))
    assert exc.value.code == EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == ""
    assert f"usage: gpu-audit {' '.join(group)}" in err
    assert "required" in err


@pytest.mark.parametrize("group", GROUPS, ids=" ".join)
def test_a_group_help_exits_0(group: tuple[str, ...],
                              capsys: pytest.CaptureFixture[str]) -> None:
    """`gpu-audit GROUP --help` is a request, not an error: exit 0, help on stdout."""
    with pytest.raises(SystemExit) as exc:
        main([*group, "--help"])
    assert exc.value.code == 0
    assert f"usage: gpu-audit {' '.join(group)}" in capsys.readouterr().out


def _arguments(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
               ) -> Iterator[tuple[str, argparse.Action]]:
    """Every argument of every command, with the command's words."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _arguments(child, (*path, name))
        elif not isinstance(action, argparse._HelpAction | argparse._VersionAction):
            yield " ".join(path), action


ARGUMENTS = list(_arguments(build_parser()))
FLAGS = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._CountAction,
         argparse._StoreConstAction, argparse._AppendConstAction)
# upper case, saying what the value is: FILE, DIR, URL, HOST:PORT, NAME|FILE, SOURCE[,SOURCE],
# SECTION.KEY=VALUE
METAVAR = re.compile(r"[A-Z][A-Z0-9_]*(?:[:|,.=-][A-Z0-9_]+|\[[^\]]+\])*")


def _name(command: str, action: argparse.Action) -> str:
    return f"{command} {action.option_strings[-1] if action.option_strings else action.dest}"


def test_every_option_and_argument_has_help() -> None:
    """`--help` explains every option and positional argument of every command."""
    assert len(ARGUMENTS) > 150
    missing = [_name(c, a) for c, a in ARGUMENTS if not a.help or a.help == argparse.SUPPRESS]
    assert missing == []


def test_every_value_has_an_upper_case_metavar_that_says_what_it_is() -> None:
    """A value's placeholder is written one way everywhere (FILE, DIR, URL, JOBID, ...),
    never argparse's default (the lower-case dest, or the option's name upper-cased)."""
    wrong = []
    for command, action in ARGUMENTS:
        if isinstance(action, FLAGS) or action.nargs == 0:
            continue
        metavar = action.metavar
        if metavar is None and action.choices is not None:
            continue  # {a,b,c}: the choices are the placeholder
        if not isinstance(metavar, str) or not METAVAR.fullmatch(metavar):
            wrong.append(f"{_name(command, action)}: {metavar!r}")
    assert wrong == []
