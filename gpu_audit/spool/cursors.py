"""Per-sink committed cursors: the next spool offset each sink must deliver.

One small JSON file per sink under ``<spool>/cursors/``, replaced atomically (temp file,
fsync, rename, directory fsync) and carrying a CRC-32 of its content, so a crash leaves
either the old or the new value. An unreadable cursor raises `CursorError`: it must never
be read as 0 (that would re-deliver everything) nor skipped.
"""

from __future__ import annotations

import json
import os
import re
import zlib
from collections.abc import Sequence
from pathlib import Path

from gpu_audit import atomicfile
from gpu_audit.spool.errors import CursorError

CURSOR_DIR = "cursors"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def cursor_checksum(name: str, offset: int) -> int:
    return zlib.crc32(f"{name}\n{offset}".encode())


class CursorStore:
    """Committed cursors of every sink of one spool directory."""

    def __init__(self, spool_dir: Path | str) -> None:
        self._dir = Path(spool_dir) / CURSOR_DIR
        self._cache: dict[str, int] = {}

    @property
    def directory(self) -> Path:
        return self._dir

    def path(self, name: str) -> Path:
        if not _NAME_RE.match(name):
            raise ValueError(
                f"invalid cursor name {name!r}: use letters, digits, '_', '.', '-' "
                "(starting with a letter or digit, at most 128 characters)"
            )
        return self._dir / f"{name}.json"

    def get(self, name: str) -> int:
        """The committed offset of `name`; 0 when the sink has never committed."""
        path = self.path(name)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise CursorError(path, f"cannot read: {exc.strerror or exc}") from exc
        offset = parse_cursor(path, name, raw)
        self._cache[name] = offset
        return offset

    def commit(self, name: str, offset: int) -> None:
        """Durably record that `name` has delivered every record below `offset`."""
        if offset < 0:
            raise ValueError(f"cursor offset must be >= 0, not {offset}")
        current = self._cache[name] if name in self._cache else self.get(name)
        if offset < current:
            raise ValueError(
                f"cursor {name!r} would move back from {current} to {offset}: that re-delivers "
                "records; remove() the cursor first to replay on purpose"
            )
        path = self.path(name)
        self._dir.mkdir(parents=True, exist_ok=True)
        body = json.dumps(
            {"sink": name, "offset": offset, "crc32": cursor_checksum(name, offset)},
            sort_keys=True,
        ).encode()
        atomicfile.replace_file(path, body, mode=0o640)
        self._cache[name] = offset

    def names(self) -> list[str]:
        """Every sink with a committed cursor, sorted."""
        if not self._dir.is_dir():
            return []
        return sorted(
            entry.name[: -len(".json")]
            for entry in os.scandir(self._dir)
            if entry.name.endswith(".json") and _NAME_RE.match(entry.name[: -len(".json")])
        )

    def remove(self, name: str) -> None:
        """Forget a sink's cursor (it is read as 0 afterwards)."""
        path = self.path(name)
        path.unlink(missing_ok=True)
        atomicfile.tmp_path(path).unlink(missing_ok=True)
        if self._dir.is_dir():
            atomicfile.fsync_dir(self._dir)
        self._cache.pop(name, None)


def parse_cursor(path: Path, name: str, raw: bytes) -> int:
    """The offset in a cursor file's bytes; CursorError naming the file otherwise."""
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CursorError(path, f"not JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise CursorError(path, "not a JSON object")
    offset, crc, sink = doc.get("offset"), doc.get("crc32"), doc.get("sink")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise CursorError(path, f"offset {offset!r} is not a non-negative integer")
    if sink != name:
        raise CursorError(path, f"belongs to sink {sink!r}, not {name!r}")
    if crc != cursor_checksum(name, offset):
        raise CursorError(path, "checksum mismatch (the file was modified or damaged)")
    return offset



def gc_floor(cursors: CursorStore, sink_names: Sequence[str]) -> int:
    """The lowest committed cursor of the configured sinks: segments wholly below it may go.

    Cursors of sinks that are no longer configured are ignored on purpose (a removed
    sink must not pin the spool forever); with no sinks configured nothing may be deleted.
    """
    if not sink_names:
        return 0
    return min(cursors.get(name) for name in sink_names)
