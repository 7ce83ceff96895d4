"""One writer per spool, one shipper per cursors, archive and dead-letter directory: a
second instance of the real CLI refuses to start, names the holder's pid, exits 1 and
writes nothing; the lock dies with its process (SIGKILL), so a restart is never blocked."""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson
import yaml

from gpu_audit.spool import spool_stats
from tests.netutil import bound_port, http_get
from tests.polling import wait_for

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


_LOGS: dict[int, Path] = {}  # pid -> its stderr, in a file (a pipe nobody reads can fill)


def _cli(*args: str) -> subprocess.Popen[bytes]:
    with tempfile.NamedTemporaryFile(prefix="gpu-audit-", suffix=".log", delete=False) as err:
        proc = subprocess.Popen([sys.executable, "-m", "gpu_audit_app", *args], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=err, env=_env())
    _LOGS[proc.pid] = Path(err.name)
    return proc


def _config(path: Path, spool: Path, archive: Path, **shipper: object) -> Path:
    path.write_text(yaml.safe_dump({
        "exporter": {"backend": "sim", "scenario": "busy", "time_scale": 60,
                     "interval_seconds": 0.2},
        "spool": {"directory": str(spool), "min_free_bytes": 0},
        "shipper": {"batch_max_wait_s": 0.1, **shipper,
                    "sinks": [{"type": "archive", "directory": str(archive)}]},
    }))
    return path


def _serving(proc: subprocess.Popen[bytes]) -> None:
    """Wait until a process started with --listen 127.0.0.1:0 is ready."""
    port = bound_port(_LOGS[proc.pid], proc, 60)

    def ready() -> bool:
        assert proc.poll() is None, _err(proc)
        return http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200
    wait_for(ready, 60, "readyz")


def _err(proc: subprocess.Popen[bytes]) -> str:
    return _LOGS[proc.pid].read_text(errors="replace")


def _refused(proc: subprocess.Popen[bytes], holder: int) -> str:
    """Wait for a refused start: exit 1, the message names the holder's pid."""
    code = proc.wait(60)
    err = _err(proc)
    assert code == 1, err
    assert f"pid {holder}" in err, err
    assert "Traceback" not in err, err
    return err


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, _err(proc)


def _archived(archive: Path) -> list[dict[str, object]]:
    out = []
    for f in sorted(archive.iterdir()):
        if f.name.endswith(".jsonl"):
            data = f.read_bytes()
        elif f.name.endswith(".jsonl.gz"):
            data = gzip.decompress(f.read_bytes())
        else:
            continue
        out += [orjson.loads(line) for line in data.splitlines() if line.strip()]
    return out


def test_a_second_writer_on_one_spool_refuses_and_the_lock_dies_with_its_process(
    tmp_path: Path,
) -> None:
    """`run` holds the spool: a second `run` and an `exporter` on it exit 1 naming its pid
    and never serve; the archive then holds every record exactly once (one
    exporter_start). An `exporter` holding the spool refuses a `run` the same way, and
    once it is SIGKILLed a new `run` starts at once."""
    spool, archive = tmp_path / "spool", tmp_path / "archive"
    config = str(_config(tmp_path / "c.yaml", spool, archive))
    first = _cli("run", "--config", config, "--listen", "127.0.0.1:0")
    _serving(first)
    err = _refused(_cli("run", "--config", config, "--listen", "127.0.0.1:0"),
                   first.pid)
    assert f"spool {spool}" in err
    _refused(_cli("exporter", "--config", config, "--listen", "127.0.0.1:0"),
             first.pid)
    _stop(first)
    records = _archived(archive)
    assert len(records) == spool_stats(spool)["next_offset"]
    assert len({r["id"] for r in records}) == len(records)
    assert [r.get("event") for r in records].count("exporter_start") == 1

    exporter = _cli("exporter", "--config", config, "--listen", "127.0.0.1:0")
    _serving(exporter)
    _refused(_cli("run", "--config", config, "--listen", "127.0.0.1:0"),
             exporter.pid)
    exporter.send_signal(signal.SIGKILL)
    exporter.wait(30)
    again = _cli("run", "--config", config, "--listen", "127.0.0.1:0")
    _serving(again)
    _stop(again)


def _produce(spool: Path, n: int) -> None:
    subprocess.run([sys.executable, "-m", "tests.shipper.producer", str(spool), str(n),
                    "--batch", "500"], cwd=ROOT, env=_env(), check=True, capture_output=True)


def _wait_for_signal_handler(proc: subprocess.Popen[bytes]) -> None:
    """The shipper takes its locks before it installs its SIGTERM handler."""
    def caught() -> bool:
        assert proc.poll() is None, _err(proc)
        status = Path(f"/proc/{proc.pid}/status").read_text()
        line = next(x for x in status.splitlines() if x.startswith("SigCgt:"))
        return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    wait_for(caught, 60, "SIGTERM handler", step=0.05)


def test_a_second_shipper_on_the_same_cursors_or_archive_refuses(tmp_path: Path) -> None:
    """A standalone shipper holds its spool's cursors and its archive directory: a second
    `gpu-audit shipper` on the same spool, and one on another spool that names the same
    archive directory, exit 1 naming its pid, and the archive holds each record once."""
    n = 3000
    archive = tmp_path / "archive"
    spool_a, spool_b = tmp_path / "spool-a", tmp_path / "spool-b"
    _produce(spool_a, n)
    _produce(spool_b, 10)
    config_a = str(_config(tmp_path / "a.yaml", spool_a, archive))
    config_b = str(_config(tmp_path / "b.yaml", spool_b, archive))
    first = _cli("shipper", "--config", config_a)
    _wait_for_signal_handler(first)
    _refused(_cli("shipper", "--config", config_a), first.pid)
    err = _refused(_cli("shipper", "--config", config_b), first.pid)
    assert f"archive directory {archive}" in err
    wait_for(lambda: len(_archived(archive)) >= n, 60, "backlog archived")
    _stop(first)
    ids = [r["id"] for r in _archived(archive)]
    assert len(ids) == len(set(ids)) == n
