"""Secrets of the sinks: named in the YAML by an environment variable or a file, read only
when a sink is built (or when chargeback's search source connects to that sink's
backend). In core for that reason.

What it is for: the one place that reads a secret (`resolve_secret`) and the validator
rule that a secret is named one way only (`only_one_of`). A value read here is registered
with the log redaction at once and handed on only inside a pydantic SecretStr, so it never
shows in a repr, a log line or an error. This module must never read a secret at
validation time (check-config runs where secrets are absent) and never put a secret's
value into an error message: errors name the variable or the file.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import SecretStr

from gpu_audit.errors import ConfigError
from gpu_audit.logredact import register_secret


def resolve_secret(what: str, env: str | None, file: Path | None) -> SecretStr | None:
    """Read a secret from the named environment variable or file (one of them, or none).

    Raises ConfigError naming the variable or file (never the value) when it is missing.
    A trailing newline in a file is removed, as every secret file written by `echo` has one.
    """
    if env is not None:
        value = os.environ.get(env)
        if value is None or value == "":
            raise ConfigError(what, [f"environment variable {env} is not set or empty"])
        register_secret(value)  # masked in every log line from now on
        return SecretStr(value)
    if file is not None:
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(what, [f"cannot read secret file {file}: {exc.strerror}"]) from None
        text = text.rstrip("\r\n")
        if not text:
            raise ConfigError(what, [f"secret file {file} is empty"])
        register_secret(text)
        return SecretStr(text)
    return None


def only_one_of(pairs: list[tuple[str, object, object]]) -> None:
    """Validation: each secret (label, its `_env`, its `_file`) is named one way at most."""
    for label, env, file in pairs:
        if env is not None and file is not None:
            raise ValueError(f"set only one of {label}_env and {label}_file")
