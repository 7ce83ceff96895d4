"""Behaviour of the HTTP endpoint and the web-config (TLS, basic auth)."""

from __future__ import annotations

import base64
import datetime
import http.client
import ipaddress
import json
import ssl
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from exporter.endpoint import exporter_server
from exporter.exposition.render import RenderOptions, render_snapshot
from gpu_audit.errors import ConfigError
from gpu_audit.http.server import MetricsServer
from gpu_audit.http.state import LatestState
from gpu_audit.http.webconfig import WebConfig, load_web_config
from tests.exporter.exposition.snapshots import UUID0, UUID1, small_snapshot


def get(port: int, path: str, method: str = "GET", headers: dict[str, str] | None = None,
        ctx: ssl.SSLContext | None = None) -> tuple[int, dict[str, str], bytes]:
    conn: http.client.HTTPConnection
    if ctx is not None:
        conn = http.client.HTTPSConnection("localhost", port, context=ctx, timeout=10)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


@pytest.fixture
def state() -> LatestState:
    return LatestState(stale_after_seconds=15.0)


@pytest.fixture
def server(state: LatestState) -> Iterator[MetricsServer]:
    srv = exporter_server("127.0.0.1", 0, state)
    srv.start()
    yield srv
    srv.stop()


def publish(state: LatestState, generated_at: float | None = None) -> None:
    snap = small_snapshot()
    state.set_backend(True)
    state.publish(snap, render_snapshot(snap, RenderOptions(max_process_series_per_gpu=1),
                                        now=generated_at))


def test_readyz_503_before_first_snapshot_then_200(server: MetricsServer,
                                                   state: LatestState) -> None:
    """/readyz says 503 with the reason until the backend is up and a snapshot exists."""
    code, _, body = get(server.port, "/readyz")
    assert code == 503 and b"backend not ready" in body
    state.set_backend(True)
    code, _, body = get(server.port, "/readyz")
    assert code == 503 and b"no snapshot yet" in body
    publish(state)
    assert get(server.port, "/readyz")[0] == 200
    assert get(server.port, "/healthz")[:3:2] == (200, b"ok\n")


def test_readyz_503_when_stale(server: MetricsServer, state: LatestState) -> None:
    """A snapshot older than stale_after makes /readyz 503 and says how old it is."""
    publish(state, generated_at=time.time() - 60)
    code, _, body = get(server.port, "/readyz")
    assert code == 503 and b"stale" in body


def test_metrics_serves_cached_body_plus_live_metrics(server: MetricsServer,
                                                      state: LatestState) -> None:
    """/metrics is the rendered snapshot followed by the scrape-time families."""
    publish(state)
    code, headers, body = get(server.port, "/metrics")
    assert code == 200
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    text = body.decode()
    assert f'gpu_up{{gpu="1",uuid="{UUID1}",simulated="true"}} 0' in text
    assert "gpu_audit_snapshot_age_seconds " in text
    assert "gpu_audit_scrapes_total 1.0" in text
    assert f'gpu_audit_process_series_dropped_total{{gpu="0",uuid="{UUID0}"}} 2.0' in text
    assert "gpu_audit_scrapes_total 2.0" in get(server.port, "/metrics")[2].decode()


def test_metrics_gzip_when_accepted(server: MetricsServer, state: LatestState) -> None:
    """With Accept-Encoding: gzip the body is gzip and decompresses to the plain body."""
    publish(state)
    _, _, plain = get(server.port, "/metrics")
    code, headers, body = get(server.port, "/metrics", headers={"Accept-Encoding": "gzip"})
    assert code == 200 and headers["content-encoding"] == "gzip"
    d = zlib.decompressobj(31)
    unzipped = d.decompress(body).decode()
    assert d.eof and d.unused_data == b""  # one gzip member, readable by any client
    cached = plain.decode().split("# HELP gpu_audit_snapshot_age_seconds")[0]
    assert unzipped.startswith(cached)
    assert "gpu_audit_scrapes_total 2.0" in unzipped


def test_gzip_reuses_the_compressed_body_across_scrapes(
    server: MetricsServer, state: LatestState
) -> None:
    """Several gzip scrapes of one snapshot each decompress, CRC and length checked by
    zlib, to the same cached body followed by that scrape's own live tail."""
    publish(state)
    bodies = []
    for _ in range(3):
        _, _, body = get(server.port, "/metrics", headers={"Accept-Encoding": "gzip"})
        d = zlib.decompressobj(31)
        bodies.append(d.decompress(body).decode())
        assert d.eof and d.unused_data == b""
    heads = {b.split("# HELP gpu_audit_snapshot_age_seconds")[0] for b in bodies}
    assert len(heads) == 1
    assert all("gpu_audit_scrapes_total" in b for b in bodies)
    assert bodies[0] != bodies[2]  # the live tail (scrape count) is fresh each time


def test_head_404_and_landing(server: MetricsServer, state: LatestState) -> None:
    """HEAD has headers and no body; unknown paths 404; / warns about simulated data."""
    publish(state)
    code, headers, body = get(server.port, "/metrics", method="HEAD")
    assert code == 200 and body == b"" and int(headers["content-length"]) > 1000
    assert get(server.port, "/nope")[0] == 404
    code, headers, body = get(server.port, "/")
    assert code == 200 and b"SIMULATED DATA" in body and b'href="/metrics"' in body


def test_status_json(server: MetricsServer, state: LatestState) -> None:
    """/status lists backend, per-GPU up/error and supported/unsupported fields."""
    before = json.loads(get(server.port, "/status")[2])
    assert before["ready"] is False and before["gpus"] == []
    publish(state)
    doc = json.loads(get(server.port, "/status")[2])
    assert doc["ready"] is True and doc["backend"]["simulated"] is True
    g0, g1 = doc["gpus"]
    assert g0["up"] is True and "gpu_fan_speed_ratio" in g0["unsupported_fields"]
    assert "gpu_utilization_ratio" in g0["supported_fields"]
    assert (g1["up"], g1["error"]) == (False, "gpu_lost")
    assert doc["recent_cycle_seconds"] == [0.0125]


def test_handler_error_is_500_without_traceback(server: MetricsServer,
                                                state: LatestState) -> None:
    """A failing state provider yields a plain 500, never a traceback, and the server
    keeps serving."""
    def boom() -> None:
        raise RuntimeError("secret internals")
    server.provider = type("P", (), {"state": staticmethod(boom)})()  # type: ignore[assignment]
    code, _, body = get(server.port, "/readyz")
    assert code == 500 and b"secret" not in body and b"Traceback" not in body
    assert get(server.port, "/healthz")[0] == 200


# --- web-config ------------------------------------------------------------------------

def _self_signed(tmp: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp / "server.crt", tmp / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_tls_and_basic_auth(tmp_path: Path, state: LatestState) -> None:
    """Over TLS with a self-signed cert the client verifies the server; basic auth accepts
    the right password (also on repeat, from cache), rejects a wrong one with 401 and
    WWW-Authenticate; extra headers from http_server_config are sent."""
    cert, key = _self_signed(tmp_path)
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    cfg_path = tmp_path / "web.yml"
    cfg_path.write_text(
        f"tls_server_config:\n  cert_file: {cert.name}\n  key_file: {key.name}\n"
        f"http_server_config:\n  headers:\n    X-Frame-Options: deny\n"
        f"basic_auth_users:\n  alice: '{hashed}'\n", encoding="utf-8")
    web = load_web_config(cfg_path)
    publish(state)
    srv = exporter_server("127.0.0.1", 0, state, web)
    srv.start()
    try:
        ctx = ssl.create_default_context(cafile=str(cert))
        good = "Basic " + base64.b64encode(b"alice:s3cret").decode()
        bad = "Basic " + base64.b64encode(b"alice:wrong").decode()
        for _ in range(2):
            code, headers, body = get(srv.port, "/metrics", headers={"Authorization": good},
                                      ctx=ctx)
            assert code == 200 and b"gpu_up" in body
            assert headers["x-frame-options"] == "deny"
        code, headers, _ = get(srv.port, "/metrics", headers={"Authorization": bad}, ctx=ctx)
        assert code == 401 and headers["www-authenticate"].startswith("Basic")
        assert get(srv.port, "/metrics", ctx=ctx)[0] == 401
        with pytest.raises(ssl.SSLError):
            get(srv.port, "/healthz", ctx=ssl.create_default_context())  # untrusted CA
    finally:
        srv.stop()


def test_web_config_lists_every_problem(tmp_path: Path) -> None:
    """A web-config with several mistakes gives one ConfigError naming each of them."""
    p = tmp_path / "web.yml"
    p.write_text(
        "tls_server_config:\n  cert_file: a.crt\n  client_auth_type: Sometimes\n"
        "  min_version: TLS9\n  cipher_suites: [TLS_FAKE]\n"
        "basic_auth_users:\n  bob: plaintext\n"
        "http_server_config:\n  headers:\n    X-Evil: 1\n"
        "unknown_key: 1\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_web_config(p)
    text = str(err.value)
    for expected in ("client_auth_type", "min_version", "cipher_suites", "basic_auth_users",
                     "X-Evil", "unknown_key"):
        assert expected in text, expected
    assert len(err.value.problems) >= 6
    assert "plaintext" not in text or "bcrypt" in text


def test_web_config_rejects_unverifiable_client_auth(tmp_path: Path) -> None:
    """RequireAnyClientCert is refused with a reason (Python verifies any client cert)."""
    cert, key = _self_signed(tmp_path)
    p = tmp_path / "web.yml"
    p.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
                 f"  client_auth_type: RequireAnyClientCert\n  client_ca_file: {cert}\n",
                 encoding="utf-8")
    with pytest.raises(ConfigError, match="verifies every client"):
        load_web_config(p)


def test_mtls_requires_client_certificate(tmp_path: Path, state: LatestState) -> None:
    """RequireAndVerifyClientCert refuses a client without a certificate signed by the CA
    and serves one with it."""
    cert, key = _self_signed(tmp_path)
    web = WebConfig.model_validate({"tls_server_config": {
        "cert_file": str(cert), "key_file": str(key), "client_ca_file": str(cert),
        "client_auth_type": "RequireAndVerifyClientCert"}})
    srv = exporter_server("127.0.0.1", 0, state, web)
    srv.start()
    try:
        ctx = ssl.create_default_context(cafile=str(cert))
        with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
            get(srv.port, "/healthz", ctx=ctx)
        ctx.load_cert_chain(str(cert), str(key))
        assert get(srv.port, "/healthz", ctx=ctx)[0] == 200
    finally:
        srv.stop()


def test_rate_limit_answers_429(state: LatestState) -> None:
    """rate_limit (interval, burst) from the web-config turns excess requests into 429."""
    web = WebConfig.model_validate({"rate_limit": {"interval": "10s", "burst": 2}})
    srv = exporter_server("127.0.0.1", 0, state, web)
    srv.start()
    try:
        codes = [get(srv.port, "/healthz")[0] for _ in range(3)]
        assert codes == [200, 200, 429]
    finally:
        srv.stop()


def test_client_allowed_sans(tmp_path: Path, state: LatestState) -> None:
    """client_allowed_sans refuses a verified client whose certificate lacks the SAN."""
    cert, key = _self_signed(tmp_path)
    results = []
    for sans in (["localhost"], ["someone-else"]):
        web = WebConfig.model_validate({"tls_server_config": {
            "cert_file": str(cert), "key_file": str(key), "client_ca_file": str(cert),
            "client_auth_type": "RequireAndVerifyClientCert", "client_allowed_sans": sans}})
        srv = exporter_server("127.0.0.1", 0, state, web)
        srv.start()
        try:
            ctx = ssl.create_default_context(cafile=str(cert))
            ctx.load_cert_chain(str(cert), str(key))
            results.append(get(srv.port, "/healthz", ctx=ctx)[0])
        finally:
            srv.stop()
    assert results == [200, 403]


def test_basic_auth_caches_success_not_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    """A verified (user, password) is not re-checked with bcrypt; a wrong one always is,
    and a user that does not exist still pays a bcrypt check."""
    from gpu_audit.http import webconfig

    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    auth = webconfig.BasicAuth({"alice": hashed})
    calls = []
    real = bcrypt.checkpw

    def counting(pw: bytes, h: bytes) -> bool:
        calls.append(pw)
        return bool(real(pw, h))

    monkeypatch.setattr(bcrypt, "checkpw", counting)

    def hdr(raw: bytes) -> str:
        return "Basic " + base64.b64encode(raw).decode()

    assert auth.check(hdr(b"alice:pw")) and auth.check(hdr(b"alice:pw"))
    assert len(calls) == 1
    assert not auth.check(hdr(b"alice:nope")) and not auth.check(hdr(b"alice:nope"))
    assert not auth.check(hdr(b"mallory:pw"))
    assert len(calls) == 4
    assert not auth.check("Basic !!!notbase64") and not auth.check(None)


def _raw(port: int, request: bytes) -> bytes:
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request)
        chunks = []
        while True:
            data = s.recv(65536)
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks)


def test_request_parsing_limits_and_errors(server: MetricsServer, state: LatestState) -> None:
    """The direct header parser answers malformed request lines with 400, a header line
    without a colon with 400, too many headers with 431, reads header names without
    regard to case, and closes HTTP/1.0 and `Connection: close` requests."""
    publish(state)
    assert _raw(server.port, b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400")
    assert _raw(server.port, b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n").startswith(
        b"HTTP/1.1 400")
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(101))
    assert _raw(server.port, b"GET /healthz HTTP/1.1\r\n" + many + b"\r\n").startswith(
        b"HTTP/1.1 431")
    resp = _raw(server.port, b"GET /metrics HTTP/1.0\r\naccept-ENCODING: gzip\r\n\r\n")
    assert resp.startswith(b"HTTP/1.1 200") and b"Content-Encoding: gzip" in resp
    resp = _raw(server.port, b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert resp.endswith(b"ok\n")  # the server closed the connection after answering
