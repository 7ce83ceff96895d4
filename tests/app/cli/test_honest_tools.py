"""The verify and stats tools never say OK about the wrong thing, and never end in a
traceback: not a spool or no records is exit 2 saying what was expected, a closed pipe
ends quietly, `spool stats` is a readable table (and JSON with --json)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_audit.spool import CursorStore, SpoolConfig, SpoolWriter
from gpu_audit_app.cli import main


def _spool(path: Path, records: int) -> Path:
    writer = SpoolWriter(SpoolConfig(directory=path, min_free_bytes=0))
    if records:
        writer.commit([b'{"n": %d}' % i for i in range(records)])
    writer.close()
    return path


def _not_a_spool(tmp_path: Path) -> Path:
    other = tmp_path / "not-a-spool"
    other.mkdir()
    (other / "notes.txt").write_text("hello\n")
    (other / "sub").mkdir()
    return other


@pytest.mark.parametrize("action", [["spool", "verify"], ["spool", "stats"],
                                    ["spool", "stats", "--json"]])
def test_spool_tools_refuse_what_is_not_a_spool(
    action: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`spool verify|stats` on a folder that is not a spool, a missing path or a file is
    exit 2 with what is wrong and what was expected, never OK, never a traceback."""
    cases = {
        _not_a_spool(tmp_path): "is not a spool directory",
        tmp_path / "missing": "does not exist",
        tmp_path / "not-a-spool" / "notes.txt": "is not a directory",
    }
    for path, why in cases.items():
        argv = [*action[:2], str(path), *action[2:]]
        assert main(argv) == 2, path
        out, err = capsys.readouterr()
        assert out == "" and "OK" not in err
        assert f"{path} {why}" in err
        assert "spool.directory" in err  # what a spool is: the exporter's spool.directory


def test_spool_verify_of_an_empty_spool_is_ok(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A spool the writer opened but that holds no record yet is still a spool."""
    spool = _spool(tmp_path / "spool", 0)
    assert main(["spool", "verify", str(spool)]) == 0
    assert "OK" in capsys.readouterr().out


def test_audit_verify_with_no_records_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`audit verify` on a folder without records, an empty JSON Lines file or a spool
    holding no record proves nothing: exit 2 naming what it looked for, never OK."""
    empty_file = tmp_path / "empty.jsonl"
    empty_file.write_text("\n")
    for path in (_not_a_spool(tmp_path), empty_file, _spool(tmp_path / "spool", 0)):
        assert main(["audit", "verify", str(path)]) == 2, path
        out, err = capsys.readouterr()
        assert "OK" not in out + err
        assert f"no audit records in {path}" in err
        assert "expected" in err


def test_spool_stats_is_a_readable_table_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`spool stats` prints aligned lines and one row per sink cursor with its lag (no
    Python dict reprs); `--json` gives the same numbers to a program."""
    spool = _spool(tmp_path / "spool", 10)
    store = CursorStore(spool)
    store.commit("archive", 10)
    store.commit("elasticsearch", 4)
    assert main(["spool", "stats", str(spool)]) == 0
    text = capsys.readouterr().out
    assert "{" not in text
    lines = text.splitlines()
    assert lines[0] == f"spool {spool} (no writer running)"
    assert any(line.split() == ["records", "10", "(offsets", "0..9)"] for line in lines)
    header = next(i for i, line in enumerate(lines)
                  if line.split()[:3] == ["sink", "cursor", "lag"])
    rows = [line.split() for line in lines[header + 1:header + 3]]
    assert rows == [["archive", "10", "0"], ["elasticsearch", "4", "6"]]
    assert main(["spool", "stats", str(spool), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["records"] == 10
    assert stats["cursors"]["elasticsearch"] == {"offset": 4, "lag_records": 6}


@pytest.mark.parametrize("argv", [["audit", "verify"], ["spool", "verify"], ["spool", "stats"]])
def test_a_closed_pipe_ends_quietly(argv: list[str], tmp_path: Path) -> None:
    """`gpu-audit ... | head` where head has gone: no traceback and no "Exception
    ignored" on stderr; the exit status is the shell's for a process ended by SIGPIPE."""
    spool = _spool(tmp_path / "spool", 50)
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first byte is written
    try:
        res = subprocess.run([sys.executable, "-m", "gpu_audit_app", *argv, str(spool)],
                             stdout=write_end, stderr=subprocess.PIPE, text=True,
                             timeout=60, check=False)
    finally:
        os.close(write_end)
    assert res.stderr == ""
    assert res.returncode == 128 + 13
