"""What a sink type declares to the registry, and what its configuration gets to build
its sink.

Each sink folder's `config.py` declares one `SinkType` per `type:` value: its pydantic
config class and, where its client library is an optional extra of gpu-audit, that `Sdk`.
The config class builds the sink itself (`build(ctx)`): it resolves its secrets through
the `BuildContext`, which collects every problem of the sink (missing secrets, a missing
client library) and raises them all at once in `check()`, and only then imports the
sink's module, so a missing library is a ConfigError naming the extra, never an
ImportError. This module imports no sink and no client library.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, SecretStr

from gpu_audit.errors import ConfigError
from shipper.sinks.credentials import resolve_secret

# A configured sink name: it names the sink's cursor, ledger and dead-letter files.
SINK_NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"
OPTIONAL_NAME_PATTERN = r"^$|" + SINK_NAME_PATTERN


@dataclass(frozen=True)
class Sdk:
    """A client library that is an optional extra: the modules the sink imports, and the
    extra (`pip install 'gpu-audit[<extra>]'`) that installs them."""

    modules: tuple[str, ...]
    extra: str


@dataclass
class BuildContext:
    """One sink being built: its name, the spool it ships from, and its problems so far."""

    name: str
    spool_dir: Path
    problems: list[str] = field(default_factory=list)

    def secret(self, what: str, env: str | None, file: Path | None) -> SecretStr | None:
        """The secret, or None with the problem noted (reported by check())."""
        try:
            return resolve_secret(f"sink {self.name}: {what}", env, file)
        except ConfigError as exc:
            self.problems += [f"{what}: {p}" for p in exc.problems]
            return None

    def check(self) -> None:
        """Raise every problem of this sink at once, before its module is imported."""
        if self.problems:
            raise ConfigError(f"sink {self.name}", self.problems)


@dataclass(frozen=True)
class SinkType:
    """One `type:` value of a sink: its configuration class and its optional library."""

    type: str
    config: builtins.type[BaseModel]
    sdk: Sdk | None = None
