"""Wrong spool paths are configuration errors that say what is wrong with the path
(exit 2, before anything starts), in `check-config` and at start; never "cannot listen"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpu_audit.paths import directory_problems, filesystem_type

PROC_IS_PROCFS = filesystem_type(Path("/proc")) == "proc"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpu_audit_app", *args], capture_output=True,
                          text=True, timeout=60, check=False)


def _wrong_paths(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a spool\n")
    cases = {
        "file": (a_file, f"spool.directory: {a_file} is a file, not a directory"),
        "under a file": (a_file / "spool", f"spool.directory: cannot create {a_file / 'spool'}:"
                                           f" {a_file} is a file, not a directory"),
    }
    if PROC_IS_PROCFS:
        inside = Path("/proc/gpu-audit-test/spool")
        cases["in /proc"] = (inside, f"spool.directory: {inside} is inside /proc, a proc "
                                     "filesystem (made by the kernel, not a disk)")
    return cases


@pytest.mark.parametrize("command", ["run", "exporter", "shipper", "check-config"])
def test_a_wrong_spool_path_is_exit_2_naming_what_is_wrong(command: str, tmp_path: Path) -> None:
    """A spool directory inside /proc or one that is a file: every command that uses the
    spool (and check-config) exits 2 with what is wrong. One under a file: check-config,
    and `run` and `shipper`, which cannot start without it, exit 2 the same way."""
    sim = ["--backend", "sim", "--scenario", "busy", "--listen", "127.0.0.1:0"]
    for what, (path, message) in _wrong_paths(tmp_path).items():
        if command == "exporter" and what == "under a file":
            continue  # the exporter serves on and retries: test_spool_unwritable.py
        args = [command, "--spool-dir", str(path)]
        res = _run(*args, *([] if command == "shipper" else sim))
        assert res.returncode == 2, (what, res.stderr)
        assert message in res.stderr, (what, res.stderr)
        assert "cannot listen" not in res.stderr
        assert "Traceback" not in res.stderr


def test_directory_problems_accepts_a_good_path_and_names_an_unwritable_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory that exists or can be created is fine; one whose nearest existing
    parent cannot be written names that parent (check-config only: at start the spool
    keeps retrying, as a disk may be remounted)."""
    assert directory_problems("x", tmp_path / "new" / "spool") == []
    assert directory_problems("x", tmp_path) == []
    monkeypatch.setattr("gpu_audit.paths.os.access", lambda _p, _m: False)
    assert directory_problems("x", tmp_path / "new") == [
        f"x: cannot create {tmp_path / 'new'}: {tmp_path} is not writable by this user"]
    assert directory_problems("x", tmp_path / "new", writable=False) == []
    (tmp_path / "f").write_text("")
    assert directory_problems("x", tmp_path / "f" / "s", parents=False) == []
    assert directory_problems("x", tmp_path / "f", parents=False) == [
        f"x: {tmp_path / 'f'} is a file, not a directory"]


def test_mountinfo_is_parsed_with_escaped_mount_points(tmp_path: Path) -> None:
    """The file system of a path is the longest mount point above it; mount points with
    spaces (\\040 in mountinfo) are matched."""
    info = tmp_path / "mountinfo"
    info.write_text(
        "22 1 0:21 / / rw - ext4 /dev/sda1 rw\n"
        "23 22 0:5 / /proc rw,nosuid - proc proc rw\n"
        "24 22 0:6 / /my\\040disk rw - xfs /dev/sdb1 rw\n"
    )
    assert filesystem_type(Path("/proc/1/x"), mountinfo=info) == "proc"
    assert filesystem_type(Path("/processes"), mountinfo=info) == "ext4"
    assert filesystem_type(Path("/my disk/spool"), mountinfo=info) == "xfs"
    assert filesystem_type(Path("/x"), mountinfo=tmp_path / "missing") is None


def test_a_file_error_at_start_is_not_blamed_on_the_listen_address(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An OSError about a file at start (say a full disk under the spool) names the file,
    not "cannot listen on HOST:PORT"."""
    import errno

    from exporter import app
    from gpu_audit_app.config import load_settings
    from gpu_audit_app.run import run

    config = load_settings(None, environ={})
    errors = [OSError(errno.ENOSPC, "No space left on device", "/data/spool/cursors"),
              OSError(errno.EADDRINUSE, "Address already in use")]

    def start(_self: object) -> None:
        raise errors.pop(0)

    monkeypatch.setattr(app.ExporterApp, "start", start)
    monkeypatch.setattr(app.signal, "signal", lambda *_a: None)  # keep pytest's handlers
    assert run(config, with_shipper=True) == 1
    err = capsys.readouterr().err
    assert "cannot start: /data/spool/cursors: No space left on device" in err
    assert "cannot listen" not in err
    # a bind failure is a ListenError naming the address (tests/integration/
    # test_failed_start.py); any other OSError without a file is "cannot start", never
    # blamed on the listen address
    assert run(config, with_shipper=True) == 1
    err = capsys.readouterr().err
    assert "cannot start: [Errno 98] Address already in use" in err
    assert "cannot listen" not in err
