"""Running Slurm's own clients (sacct, squeue, scontrol, sacctmgr) and reading their
parsable output. Shared by chargeback (sacct) and the app layer's `gpu-audit slurm`
commands; the commands themselves are Slurm's, found on PATH (or named by
`GPU_AUDIT_SLURM_BIN_DIR`), talking to the cluster of `SLURM_CONF` as usual.

This module must never pass user-controlled text through a shell (arguments go to
exec as a list) and never hang: every call has a timeout, and a failure is a
`SlurmCommandError` naming the command, its exit status and its own message.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from datetime import UTC, datetime

from gpu_audit.errors import GpuAuditError

DEFAULT_TIMEOUT_S = 60.0


class SlurmCommandError(GpuAuditError, RuntimeError):
    """A Slurm client could not be run, or said no."""


def _binary(name: str) -> str:
    where = os.environ.get("GPU_AUDIT_SLURM_BIN_DIR")
    if where:
        return os.path.join(where, name)
    found = shutil.which(name)
    if found is None:
        raise SlurmCommandError(f"{name} not found on PATH: is slurm-client installed on "
                                "this machine?")
    return found


def run(name: str, args: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT_S) -> str:
    """stdout of `name args...`; SlurmCommandError when it fails or times out."""
    argv = [_binary(name), *args]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        raise SlurmCommandError(f"{name} did not answer within {timeout:g} s") from None
    except OSError as exc:
        raise SlurmCommandError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise SlurmCommandError(f"{name} {' '.join(args[:3])}... exited with "
                                f"{done.returncode}: {said[-1] if said else 'no message'}")
    return done.stdout


def parsable(text: str, fields: Sequence[str]) -> list[dict[str, str]]:
    """Rows of `-P -n` output ("|"-separated, no header) as dicts keyed by `fields`; a
    row with a different number of columns is an error (a "|" inside a value)."""
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        values = line.split("|")
        if len(values) != len(fields):
            raise SlurmCommandError(f"line {n}: {len(values)} columns, expected "
                                    f"{len(fields)} ({', '.join(fields)})")
        rows.append(dict(zip(fields, values, strict=True)))
    return rows


def key_values(text: str) -> dict[str, str]:
    """`scontrol -o show ...` output (one line of Key=Value words) as a dict. Values
    with spaces (Reason=, Comment=) are kept whole up to the next Key=."""
    out: dict[str, str] = {}
    key = None
    for word in text.strip().split(" "):
        k, sep, v = word.partition("=")
        if sep and k and k.replace("_", "").replace(":", "").isalnum() and k[0].isupper():
            key = k
            out.setdefault(key, v)
        elif key is not None:
            out[key] += " " + word
    return out


def parse_time(text: str) -> float | None:
    """A Slurm timestamp (`2026-12-02T04:16:30`, the local time zone, as sacct and
    scontrol print it) as Unix seconds; None for Unknown/None/empty."""
    text = text.strip()
    if not text or text in ("Unknown", "None", "N/A"):
        return None
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.astimezone()  # local time, as Slurm prints it
    return stamp.astimezone(UTC).timestamp()


def slurm_time(seconds: float) -> str:
    """Unix seconds as Slurm reads them (local time, whole seconds), for -S/-E."""
    return datetime.fromtimestamp(int(seconds)).strftime("%Y-%m-%dT%H:%M:%S")
