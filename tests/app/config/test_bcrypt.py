"""Web-config bcrypt hashes are checked when the file is loaded (format and a cost bound),
start-up does no bcrypt work (so SIGTERM is honoured at once), and a login against a
hash bcrypt cannot use is a 401, never a 500."""

from __future__ import annotations

import base64
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest
import yaml

from gpu_audit.errors import ConfigError
from gpu_audit.http.server import MetricsServer
from gpu_audit.http.state import LatestState
from gpu_audit.http.webconfig import BasicAuth, WebConfig, load_web_config
from tests.polling import wait_for

ROOT = Path(__file__).resolve().parents[3]
GOOD = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()


def _with_cost(hashed: str, cost: int) -> str:
    return f"{hashed[:4]}{cost:02d}{hashed[6:]}"


def _web(tmp_path: Path, users: dict[str, str]) -> Path:
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump({"basic_auth_users": users}))
    return path


@pytest.mark.parametrize(("hashed", "why"), [
    (_with_cost(GOOD, 31), "cost 31"),
    (_with_cost(GOOD, 17), "cost 17"),
    (_with_cost(GOOD, 3), "cost 3"),
    (GOOD[:-5], "not a complete bcrypt hash"),
    (GOOD[:20], "not a complete bcrypt hash"),
    (GOOD[:7] + "!" + GOOD[8:], "not a complete bcrypt hash"),
    ("$2x$" + GOOD[4:], "not a bcrypt hash"),
    ("plain-text-password", "not a bcrypt hash"),
])
def test_bad_hashes_are_refused_at_load(tmp_path: Path, hashed: str, why: str) -> None:
    """A hash with a cost outside 4..16, truncated, with a bad character or of another
    scheme is a configuration error naming the user (never the hash)."""
    with pytest.raises(ConfigError) as info:
        load_web_config(_web(tmp_path, {"prom": GOOD, "eve": hashed}))
    text = info.value.render()
    assert "eve" in text and why in text
    assert "prom" not in text
    assert hashed not in text


def test_allowed_hashes_load(tmp_path: Path) -> None:
    """$2a$, $2b$ and $2y$ hashes at costs 4..16 are accepted."""
    users = {"a": "$2a$" + GOOD[4:], "b": GOOD, "y": "$2y$" + GOOD[4:],
             "slow": _with_cost(GOOD, 16)}
    assert load_web_config(_web(tmp_path, users)).basic_auth_users == users


def test_check_config_refuses_a_truncated_hash(tmp_path: Path) -> None:
    """`gpu-audit check-config` exits 2 for a web-config whose hash is truncated."""
    web = _web(tmp_path, {"prom": GOOD[:-10]})
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"exporter:\n  web_config_file: {web}\nshipper:\n  enabled: false\n")
    res = subprocess.run([sys.executable, "-m", "gpu_audit_app", "check-config", "--config",
                          str(cfg)], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         check=False)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"{web}:2: basic_auth_users.prom: not a complete bcrypt hash" in res.stderr


def test_start_up_does_no_bcrypt_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building the checker computes no hash: a slow (high-cost) hash cannot delay
    start-up; unknown users are checked against a configured hash instead."""
    def forbidden(*_a: object, **_k: object) -> bytes:
        raise AssertionError("bcrypt work at start-up")

    monkeypatch.setattr(bcrypt, "hashpw", forbidden)
    monkeypatch.setattr(bcrypt, "gensalt", forbidden)
    auth = BasicAuth({"prom": GOOD})
    assert auth.enabled


def _hdr(raw: str) -> str:
    return "Basic " + base64.b64encode(raw.encode()).decode()


def test_unknown_users_pay_bcrypt_and_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unknown user is refused after a bcrypt check against a configured hash, even
    with that user's password (so timing does not reveal which names exist)."""
    calls: list[bytes] = []
    real = bcrypt.checkpw

    def counting(pw: bytes, h: bytes) -> bool:
        calls.append(h)
        return real(pw, h)

    monkeypatch.setattr(bcrypt, "checkpw", counting)
    auth = BasicAuth({"prom": GOOD})
    assert not auth.check(_hdr("mallory:s3cret"))
    assert calls == [GOOD.encode()]
    assert auth.check(_hdr("prom:s3cret"))


def test_a_hash_bcrypt_rejects_is_a_401_not_a_500() -> None:
    """Should a hash bcrypt cannot use reach the endpoint (validation bypassed), a login
    is answered 401, without a traceback (bcrypt raises on a hash cut inside its salt)."""
    bad = GOOD[:20]
    web = WebConfig.model_construct(basic_auth_users={"prom": bad})
    assert not BasicAuth({"prom": bad}).check(_hdr("prom:s3cret"))
    state = LatestState(60.0)
    srv = MetricsServer("127.0.0.1", 0, state, web)
    srv.start()
    try:
        req = urllib.request.Request(f"http://127.0.0.1:{srv.port}/metrics")
        req.add_header("Authorization", _hdr("prom:s3cret"))
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=10)
        assert info.value.code == 401
    finally:
        srv.stop()


def _handler_installed(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


def test_sigterm_during_start_up_with_the_slowest_allowed_hash_exits_promptly(
    tmp_path: Path,
) -> None:
    """With a cost-16 hash (about 4 s of bcrypt per check here) the exporter, sent SIGTERM
    as soon as its handler is installed, exits 0 well before one such hash could be
    computed: start-up does no bcrypt work."""
    web = _web(tmp_path, {"prom": _with_cost(GOOD, 16)})
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({
        "exporter": {"backend": "sim", "scenario": "idle", "web_config_file": str(web),
                     "listen": "127.0.0.1:0"},
        "audit": {"enabled": False},
        "spool": {"directory": str(tmp_path / "spool")},
    }))
    t0 = time.monotonic()
    hashed = bcrypt.hashpw(b"x", bcrypt.gensalt(rounds=14))  # a quarter of a cost-16 hash
    quarter = time.monotonic() - t0
    assert hashed
    proc = subprocess.Popen([sys.executable, "-m", "gpu_audit_app", "exporter", "--config",
                             str(cfg)], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: _handler_installed(proc.pid), 60, "SIGTERM handler installed")
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        # a cost-16 hash takes four times `quarter`; exiting within two of them proves no
        # hash was computed between the signal and the exit
        rc = proc.wait(timeout=max(2 * quarter, 1.5) + 60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate(timeout=30)
    assert rc == 0, err[-2000:]
    assert took < max(2 * quarter, 1.5), f"exit took {took:.1f}s; a cost-14 hash {quarter:.1f}s"
