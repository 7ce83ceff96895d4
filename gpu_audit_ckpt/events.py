"""The job's report channel to its launcher: JSON lines appended to one file.

Each line is one object with "event", "time" (Unix seconds) and "pid", plus the event's
fields (docs/CHECKPOINT.md). Non-finite numbers are written as the strings "nan", "inf",
"-inf" so every line stays strict JSON. Each line goes out in one write(2) on an O_APPEND
descriptor, so a reader never sees two events interleaved. A failing write warns once and
is otherwise ignored: telemetry must never stop training.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    if isinstance(value, bool | str | int) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    try:
        return _clean(float(value))  # numpy scalars, 0-d tensors
    except (TypeError, ValueError):
        return str(value)


class EventLog:
    """Appends events to `path`; with no path, does nothing (a script run by hand)."""

    def __init__(self, path: str | Path | None, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path) if path else None
        self._clock = clock
        self._fd: int | None = None
        self._warned = False

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        doc: dict[str, Any] = {"event": event, "time": self._clock(), "pid": os.getpid()}
        doc.update(_clean(fields))
        if self.path is None:
            return doc
        line = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode() + b"\n"
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(self._fd, line)
        except OSError as exc:
            if not self._warned:
                warnings.warn(f"gpu_audit_ckpt: events file {self.path}: {exc}", stacklevel=2)
                self._warned = True
        return doc

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
