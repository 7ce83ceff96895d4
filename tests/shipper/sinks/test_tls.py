"""One TLS setup for every sink (gpu_audit/tls.py), proved against a real TLS server
on loopback: the InfluxDB sinks' urllib3 pool, the Elasticsearch and OpenSearch clients
and the Fluentd forward connection each verify the server with the configured CA,
refuse a server the CA does not vouch for, connect with `verify: false`, and present the
client certificate a server demands. A TLS file that cannot be read is a configuration
error naming it when the sink is built."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpu_audit.errors import ConfigError
from shipper.sinks.base import SinkError
from shipper.sinks.config import SinkConfig
from shipper.sinks.registry import create_sink
from tests.shipper.sinks.test_registry import parse


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _ca(name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return cert, key


def _leaf(ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, name: str,
          *, server: bool) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
               .issuer_name(ca.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(days=1))
               .not_valid_after(now + dt.timedelta(days=1)))
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    tmp = tmp_path_factory.mktemp("pki")
    ca, ca_key = _ca("test ca")
    other, _ = _ca("other ca")
    srv, srv_key = _leaf(ca, ca_key, "127.0.0.1", server=True)
    cli, cli_key = _leaf(ca, ca_key, "gpu-audit", server=False)
    files = {
        "ca": ca.public_bytes(serialization.Encoding.PEM),
        "other_ca": other.public_bytes(serialization.Encoding.PEM),
        "server_cert": srv.public_bytes(serialization.Encoding.PEM),
        "server_key": _key_pem(srv_key),
        "client_cert": cli.public_bytes(serialization.Encoding.PEM),
        "client_key": _key_pem(cli_key),
    }
    for name, data in files.items():
        (tmp / f"{name}.pem").write_bytes(data)
    return Pki(**{name: tmp / f"{name}.pem" for name in files})


class _Handler(BaseHTTPRequestHandler):
    """Enough of InfluxDB (204 on /write) and Elasticsearch/OpenSearch (200 `{}` with
    the Elastic product header) for a sink's start() or a client call to succeed."""

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        if self.path.startswith("/write"):
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = json.dumps({"acknowledged": True}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Elastic-Product", "Elasticsearch")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class TlsServer:
    port: int
    handshakes: list[str]  # per accepted connection: the client certificate's CN or ""
    mutual: bool

    def wait_for_handshake(self, timeout: float = 10.0) -> list[str]:
        """The handshakes so far, once there is one (the server thread records it)."""
        deadline = time.monotonic() + timeout
        while not self.handshakes and time.monotonic() < deadline:
            time.sleep(0.01)
        return list(self.handshakes)


@pytest.fixture(params=[False, True], ids=["server-auth", "mutual-tls"])
def tls_server(request: pytest.FixtureRequest, pki: Pki) -> Iterator[TlsServer]:
    require_client = bool(request.param)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(pki.server_cert), str(pki.server_key))
    if require_client:
        ctx.load_verify_locations(str(pki.ca))
        ctx.verify_mode = ssl.CERT_REQUIRED
    handshakes: list[str] = []

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def get_request(self) -> tuple[socket.socket, Any]:
            sock, addr = super().get_request()
            conn = ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            try:
                conn.settimeout(5)
                conn.do_handshake()
            except (OSError, ssl.SSLError):
                conn.close()
                raise
            peer = conn.getpeercert() or {}
            cn = [v for rdn in peer.get("subject", ()) for k, v in rdn if k == "commonName"]
            handshakes.append(cn[0] if cn else "")
            return conn, addr

        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # a refused handshake is what some tests want

    srv = Server(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield TlsServer(srv.server_address[1], handshakes, require_client)
    finally:
        srv.shutdown()
        srv.server_close()


def _config(kind: str, port: int, tls: dict[str, Any]) -> SinkConfig:
    url = f"https://127.0.0.1:{port}"
    data: dict[str, Any] = {
        "influxdb_v1": {"type": "influxdb_v1", "url": url, "database": "d", "timeout_s": 5},
        "influxdb_v2": {"type": "influxdb_v2", "url": url, "bucket": "b", "timeout_s": 5},
        "elasticsearch": {"type": "elasticsearch", "hosts": [url], "timeout_s": 5},
        "opensearch": {"type": "opensearch", "hosts": [url], "timeout_s": 5},
        "fluentd": {"type": "fluentd", "host": "127.0.0.1", "port": port, "timeout_s": 5},
    }[kind]
    if kind == "fluentd":
        tls = {**tls, "enabled": True}
    return parse({**data, "tls": tls})  # type: ignore[no-any-return]


def _connect(kind: str, cfg: SinkConfig, spool: Path) -> None:
    """One request (or, for Fluentd, one connection) through the sink's own client."""
    sink: Any = create_sink(cfg, spool_dir=spool)
    try:
        if kind in ("elasticsearch", "opensearch"):
            # start() installs the template: one PUT through the client
            sink.start()
        elif kind == "influxdb_v2":
            status, _body, _headers = sink._post(b"")  # an empty write, as v1's start()
            assert 200 <= status < 300
        else:
            sink.start()
    finally:
        sink.close()


KINDS = ["influxdb_v1", "influxdb_v2", "elasticsearch", "opensearch", "fluentd"]


def _client_files(pki: Pki) -> dict[str, str]:
    return {"client_cert": str(pki.client_cert), "client_key": str(pki.client_key)}


@pytest.mark.parametrize("kind", KINDS)
def test_the_configured_ca_verifies_the_server(
    kind: str, pki: Pki, tls_server: TlsServer, tmp_path: Path
) -> None:
    """With `ca_file` (and the client certificate, which the mutual-TLS server demands)
    every sink's client completes the handshake and its request; the server saw the
    client certificate whenever it asked for one."""
    _connect(kind, _config(kind, tls_server.port, {"ca_file": str(pki.ca), **_client_files(pki)}),
             tmp_path / "spool")
    seen = tls_server.wait_for_handshake()
    assert seen
    assert set(seen) == ({"gpu-audit"} if tls_server.mutual else {""})


@pytest.mark.parametrize("kind", KINDS)
def test_a_server_the_ca_does_not_vouch_for_is_refused(
    kind: str, pki: Pki, tls_server: TlsServer, tmp_path: Path
) -> None:
    """A CA that did not sign the server's certificate: no sink delivers to it (a RETRY,
    the server never answers a request)."""
    cfg = _config(kind, tls_server.port, {"ca_file": str(pki.other_ca), **_client_files(pki)})
    with pytest.raises(SinkError):
        _connect(kind, cfg, tmp_path / "spool")


@pytest.mark.parametrize("kind", KINDS)
def test_verify_false_connects_without_a_ca(
    kind: str, pki: Pki, tls_server: TlsServer, tmp_path: Path
) -> None:
    """`verify: false` skips verification (and the host name check) for every sink."""
    _connect(kind, _config(kind, tls_server.port, {"verify": False, **_client_files(pki)}),
             tmp_path / "spool")


@pytest.mark.parametrize("kind", ["influxdb_v1", "influxdb_v2", "opensearch", "fluentd"])
def test_an_unreadable_tls_file_is_a_config_error_at_build(
    kind: str, tmp_path: Path, pki: Pki
) -> None:
    """A CA bundle that does not exist, or a client key that is not a key, is a
    ConfigError naming the file when the sink is built: not a connection failure
    retried for ever."""
    missing = tmp_path / "nope.pem"
    with pytest.raises(ConfigError, match=r"nope\.pem"):
        create_sink(_config(kind, 1, {"ca_file": str(missing)}), spool_dir=tmp_path)
    with pytest.raises(ConfigError, match="client_cert"):
        create_sink(_config(kind, 1, {"client_cert": str(pki.client_cert),
                                      "client_key": str(pki.ca)}), spool_dir=tmp_path)

