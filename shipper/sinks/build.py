"""What every sink's configuration declares so the registry can build its sink, as data.

Each sink folder's `config.py` is pure data: a pydantic model per `type:` value, derived
from `SinkSection`, that names its secrets (`secrets()`: an environment variable or a
file each, never the value), any problem only building can find (`refusals()`) and the
other constructor arguments of its sink (`sink_arguments()`). It never imports its
`sink.py`: shipper/sinks/registry.py resolves the secrets, checks the client library,
reports every problem at once and only then imports the sink class it lists for the
type. This module imports no sink and no client library.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpu_audit.config_section import Section

# A configured sink name: it names the sink's cursor, ledger and dead-letter files.
SINK_NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"
OPTIONAL_NAME_PATTERN = r"^$|" + SINK_NAME_PATTERN

SecretRef = tuple[str | None, Path | None]  # (environment variable, file); both None: none


class SinkSection(Section):
    """The base of every sink's configuration model."""

    def secrets(self) -> dict[str, SecretRef]:
        """Keyword argument of the sink -> where its secret is (read by the registry)."""
        return {}

    def refusals(self) -> list[str]:
        """Problems of this configuration that only building the sink reveals."""
        return []

    def sink_arguments(self, spool_dir: Path) -> dict[str, object]:
        """The sink's other keyword arguments, given the spool it ships from."""
        return {}


@dataclass(frozen=True)
class Sdk:
    """A client library that is an optional extra: the modules the sink imports, and the
    extra (`pip install 'gpu-audit[<extra>]'`) that installs them."""

    modules: tuple[str, ...]
    extra: str
