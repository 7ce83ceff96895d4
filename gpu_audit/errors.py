"""Errors that end a command with a meaningful exit code."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2  # bad configuration, scenario or arguments: nothing was started

_LINE_PREFIX = re.compile(r"^line (\d+)(?:, column \d+)?: ")


@dataclass(frozen=True)
class Problem:
    """One configuration problem and where it comes from: a file and line, or the
    environment variable / command-line option that set the value."""

    message: str
    path: str = ""  # the key path, dotted: shipper.sinks.2.port
    file: str | None = None
    line: int | None = None
    origin: str | None = None  # GPU_AUDIT__EXPORTER__BACKEND, --backend

    @classmethod
    def in_file(cls, file: str, text: str) -> Problem:
        """A problem a file loader reported as text (`line N: key.path: message`)."""
        match = _LINE_PREFIX.match(text)
        if match is None:
            return cls(text, file=file)
        return cls(text[match.end():], file=file, line=int(match.group(1)))

    def where(self) -> str:
        if self.origin is not None:
            return self.origin
        if self.file is not None:
            return f"{self.file}:{self.line}" if self.line else self.file
        return "(defaults)"

    def sort_key(self) -> tuple[int, str, int, str, str]:
        # the layers in order: files, environment, command line, defaults
        if self.origin is not None:
            group = 2 if self.origin.startswith("-") else 1
        else:
            group = 0 if self.file is not None else 3
        return (group, self.where() if self.line is None else self.file or "",
                self.line or 0, self.path, self.message)

    def __str__(self) -> str:
        head = f"{self.where()}: "
        return f"{head}{self.path}: {self.message}" if self.path else head + self.message


class GpuAuditError(Exception):
    """The base of every error gpu-audit raises on purpose (one hierarchy: `except
    GpuAuditError` catches all of ours and nothing of Python's or a library's).
    `exit_code`: what the command line ends with when one reaches it."""

    exit_code: ClassVar[int] = EXIT_FAILURE


class ConfigError(GpuAuditError):
    """Bad configuration or input file. Carries every problem found, not just the first."""

    exit_code: ClassVar[int] = EXIT_USAGE

    def __init__(self, source: str, problems: Sequence[str | Problem]) -> None:
        self.source = source
        self.items = list(problems)
        self.problems = [str(p) for p in self.items]
        super().__init__(self.render())

    def located(self) -> list[Problem]:
        """Every problem as a Problem; text ones (`line N: ...`) placed in self.source."""
        return [p if isinstance(p, Problem) else Problem.in_file(self.source, p)
                for p in self.items]

    def render(self) -> str:
        head = f"{self.source}: {len(self.problems)} problem(s)"
        return "\n".join([head, *(f"  - {p}" for p in self.problems)])


class LockHeld(GpuAuditError):
    """Another live process holds a lock this one needs: a spool, an archive or a
    dead-letter directory has one owner at a time. `holder` is what the owner wrote in
    the lock file ("pid N", or "pid unknown")."""

    def __init__(self, path: Path, holder: str, message: str) -> None:
        self.path = path
        self.holder = holder
        super().__init__(message)
