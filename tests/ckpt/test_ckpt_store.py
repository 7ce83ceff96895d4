"""The checkpoint store: damaged checkpoints are skipped, retention, reuse, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_audit_ckpt import store


def _commit(d: Path, step: int, payload: bytes | None = None) -> store.Manifest:
    data = payload if payload is not None else f"state of step {step}".encode() * 100
    return store.commit(d, step, {"state.bin": lambda fh: fh.write(data)}, cursor={"batch": step})


def _flip_byte(path: Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x01
    path.write_bytes(bytes(raw))


def test_manifest_records_size_sha256_cursor(tmp_path: Path) -> None:
    m = _commit(tmp_path, 7)
    doc = json.loads((tmp_path / "step-7" / "MANIFEST.json").read_text())
    assert doc["step"] == 7 and doc["cursor"] == {"batch": 7} and doc["version"] == 1
    assert doc["files"]["state.bin"]["size"] == len(b"state of step 7") * 100
    assert store.verify(tmp_path / "step-7") == m


@pytest.mark.parametrize("where", ["state file", "manifest"])
def test_flipped_byte_skips_to_previous_checkpoint(tmp_path: Path, where: str) -> None:
    """One flipped bit in the newest checkpoint: resume uses the one before, saying why."""
    _commit(tmp_path, 10)
    _commit(tmp_path, 20)
    target = tmp_path / "step-20" / ("state.bin" if where == "state file" else "MANIFEST.json")
    # In the manifest, flip a digit of the step's cursor: still JSON, still parses.
    offset = target.read_bytes().index(b'"batch": 20') + 10 if where == "manifest" else 50
    _flip_byte(target, offset)
    manifest, skipped = store.latest(tmp_path)
    assert manifest is not None and manifest.step == 10
    assert len(skipped) == 1 and "step-20" in skipped[0]
    assert "sha256" in skipped[0]


def test_truncated_and_missing_files_are_skipped(tmp_path: Path) -> None:
    _commit(tmp_path, 1)
    _commit(tmp_path, 2)
    _commit(tmp_path, 3)
    (tmp_path / "step-3" / "state.bin").write_bytes(b"short")
    (tmp_path / "step-2" / "state.bin").unlink()
    manifest, skipped = store.latest(tmp_path)
    assert manifest is not None and manifest.step == 1
    assert "bytes, manifest says" in skipped[0] and "unreadable" in skipped[1]


def test_no_valid_checkpoint_gives_none(tmp_path: Path) -> None:
    assert store.latest(tmp_path / "absent") == (None, [])
    (tmp_path / "step-5").mkdir()
    manifest, skipped = store.latest(tmp_path)
    assert manifest is None and "never committed" in skipped[0]


def test_manifest_in_wrong_directory_is_rejected(tmp_path: Path) -> None:
    """A step-9 directory holding step 5's files (a bad copy) is not step 9."""
    _commit(tmp_path, 5)
    (tmp_path / "step-5").rename(tmp_path / "step-9")
    manifest, skipped = store.latest(tmp_path)
    assert manifest is None and "does not match the directory name" in skipped[0]


def test_retention_keeps_newest_k_and_removes_dead_writes(tmp_path: Path) -> None:
    for s in (1, 2, 3, 4, 5):
        _commit(tmp_path, s)
    (tmp_path / "step-0").mkdir()  # a killed write older than the newest commit
    (tmp_path / "step-9").mkdir()  # newer than every commit: left for the writer of step 9
    removed = store.retain(tmp_path, 2)
    assert sorted(p.name for p in removed) == ["step-0", "step-1", "step-2", "step-3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-4", "step-5", "step-9"]


def test_recommitting_a_valid_step_keeps_it_and_a_broken_one_is_replaced(tmp_path: Path) -> None:
    first = _commit(tmp_path, 4, b"original")
    again = _commit(tmp_path, 4, b"different")
    assert again.files == first.files
    assert (tmp_path / "step-4" / "state.bin").read_bytes() == b"original"
    (tmp_path / "step-4" / "MANIFEST.json").unlink()
    _commit(tmp_path, 4, b"rewritten")
    assert store.verify(tmp_path / "step-4").step == 4
    assert (tmp_path / "step-4" / "state.bin").read_bytes() == b"rewritten"


def test_clean_stale_removes_temp_directories_only(tmp_path: Path) -> None:
    _commit(tmp_path, 1)
    (tmp_path / ".tmp-step-2-123-abcd").mkdir()
    (tmp_path / ".tmp-step-2-123-abcd" / "state.bin").write_bytes(b"half")
    assert store.clean_stale(tmp_path) == [".tmp-step-2-123-abcd"]
    assert [p.name for p in tmp_path.iterdir()] == ["step-1"]


def test_bad_commit_arguments_are_all_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as exc:
        store.commit(
            tmp_path, 1, {"../evil": lambda fh: None, "MANIFEST.json": lambda fh: None},
            cursor=float("nan"),
        )
    msg = str(exc.value)
    assert "'../evil'" in msg and "helper's own file" in msg and "JSON" in msg
    assert not list(tmp_path.iterdir())
