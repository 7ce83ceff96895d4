"""Per-sink cursors: atomic, checksummed, never silently read as 0."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpu_audit.spool import CursorError, CursorStore


def test_commit_get_names_remove(tmp_path: Path) -> None:
    """Committed cursors read back per sink; unknown sinks read 0; remove forgets."""
    store = CursorStore(tmp_path)
    assert store.get("es") == 0 and store.names() == []
    store.commit("es", 10)
    store.commit("influx.v1", 3)
    assert CursorStore(tmp_path).get("es") == 10
    assert store.names() == ["es", "influx.v1"]
    store.remove("es")
    assert store.get("es") == 0 and store.names() == ["influx.v1"]


def test_crash_between_temp_write_and_rename_keeps_old_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash after the temp file is written but before the rename leaves the old value,
    and the next commit succeeds over the leftover temp file."""
    store = CursorStore(tmp_path)
    store.commit("es", 5)

    def crash(src: Path, dst: Path) -> None:
        raise KeyboardInterrupt("simulated crash before rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        CursorStore(tmp_path).commit("es", 9)
    monkeypatch.undo()
    assert (tmp_path / "cursors" / "es.json.tmp").exists()
    assert CursorStore(tmp_path).get("es") == 5
    CursorStore(tmp_path).commit("es", 9)
    assert CursorStore(tmp_path).get("es") == 9


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{not json",
        b"[1]",
        b'{"sink": "es", "offset": 7, "crc32": 1}',
        b'{"sink": "other", "offset": 7, "crc32": 0}',
        b'{"sink": "es", "offset": -1}',
        b"\xff\xfe",
    ],
)
def test_corrupt_cursor_raises_naming_the_file(tmp_path: Path, content: bytes) -> None:
    """Any damaged cursor file raises CursorError naming it; it is never read as 0."""
    store = CursorStore(tmp_path)
    store.commit("es", 7)
    path = tmp_path / "cursors" / "es.json"
    path.write_bytes(content)
    with pytest.raises(CursorError, match=r"es\.json"):
        CursorStore(tmp_path).get("es")


def test_cursor_never_moves_back_and_names_are_checked(tmp_path: Path) -> None:
    """Moving a cursor backwards (re-delivery) and path-like names are refused."""
    store = CursorStore(tmp_path)
    store.commit("es", 7)
    with pytest.raises(ValueError, match="move back"):
        store.commit("es", 6)
    for bad in ("../x", "", ".hidden", "a/b"):
        with pytest.raises(ValueError, match="invalid cursor name"):
            store.commit(bad, 1)
    assert os.listdir(tmp_path / "cursors") == ["es.json"]
