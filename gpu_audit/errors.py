"""Errors that end a command with a meaningful exit code."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2  # bad configuration, scenario or arguments: nothing was started


class ConfigError(Exception):
    """Bad configuration or input file. Carries every problem found, not just the first."""

    def __init__(self, source: str, problems: Sequence[str]) -> None:
        self.source = source
        self.problems = list(problems)
        super().__init__(self.render())

    def render(self) -> str:
        head = f"{self.source}: {len(self.problems)} problem(s)"
        return "\n".join([head, *(f"  - {p}" for p in self.problems)])


class LockHeld(Exception):
    """Another live process holds a lock this one needs: a spool, an archive or a
    dead-letter directory has one owner at a time. `holder` is what the owner wrote in
    the lock file ("pid N", or "pid unknown")."""

    def __init__(self, path: Path, holder: str, message: str) -> None:
        self.path = path
        self.holder = holder
        super().__init__(message)
