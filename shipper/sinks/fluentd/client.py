"""The forward-protocol connection of the Fluentd sink: TCP (or a unix socket), TLS, the
shared_key handshake, and a chunk's send-and-wait-for-ack.

Why our own connection and not fluent-logger's: its public API (FluentSender.emit)
sends Message mode only, without the `chunk` option, so it never waits for an
acknowledgement (at-most-once), and it writes whole-second times unless told otherwise.
An audit trail needs at-least-once with a chunk id the receiver can de-duplicate, which
fluent-logger could give only through its private methods (`_reconnect`, `_close`,
its `socket`), which may change in any release. The protocol part we need is small:
a socket, an optional TLS wrap, the HELO/PING/PONG handshake and reading msgpack
answers; msgpack is the only library used.

The handshake is in_forward's: SHA-512 digests of the shared key (and of the user's
password when one is configured); the server's PONG digest is checked too, so we never
deliver to a server that does not know the key. TLS comes from gpu_audit/tls.py
like every sink's. This module must never log or put into an error the shared key or
the password.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from typing import Any

import msgpack
from pydantic import SecretStr

from gpu_audit.errors import GpuAuditError
from gpu_audit.tls import ssl_context
from shipper.sinks.fluentd.config import FluentdSinkConfig
from shipper.sinks.fluentd.encode import as_bytes

_UNIX = "unix://"


class HandshakeError(GpuAuditError):
    """The shared_key handshake failed (wrong key, wrong user, unexpected server)."""


def _sha512_hex(*parts: bytes) -> str:
    digest = hashlib.sha512()
    for part in parts:
        digest.update(part)
    return digest.hexdigest()


class ForwardConnection:
    """One connection to a forward server, opened on demand and closed on any failure."""

    def __init__(
        self,
        cfg: FluentdSinkConfig,
        shared_key: SecretStr | None,
        password: SecretStr | None,
    ) -> None:
        self._cfg = cfg
        self._shared_key = shared_key
        self._password = password
        self._tls = (ssl_context(cfg.tls, f"sink {cfg.name or cfg.type}: tls")
                     if cfg.tls.enabled else None)
        self._sock: socket.socket | None = None
        self._unpacker = msgpack.Unpacker(raw=True)

    def connect(self) -> None:
        """Connect, wrap in TLS and authenticate, unless connected already."""
        if self._sock is not None:
            return
        sock = self._open_socket()
        self._sock = sock
        self._unpacker = msgpack.Unpacker(raw=True)
        try:
            if self._tls is not None:
                self._sock = self._tls.wrap_socket(sock, server_hostname=self._cfg.host)
            if self._shared_key is not None:
                self._handshake()
        except BaseException:
            self.close()
            raise

    def _open_socket(self) -> socket.socket:
        cfg = self._cfg
        if cfg.host.startswith(_UNIX):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            address: Any = cfg.host[len(_UNIX):]
        else:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            # a dead peer behind a silent network shows up instead of hanging for ever
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            address = (cfg.host, cfg.port)
        try:
            sock.settimeout(cfg.timeout_s)
            sock.connect(address)
        except BaseException:
            sock.close()
            raise
        return sock

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already reset by the peer: closing is all that is left
        finally:
            sock.close()

    def send_chunk(self, packet: bytes, cid: str) -> None:
        """Send one chunk and wait for `{"ack": cid}`; raise on any failure (the caller
        closes the connection so a resend starts clean)."""
        self.connect()
        sock = self._socket()
        sock.settimeout(self._cfg.timeout_s)
        sock.sendall(packet)
        deadline = time.monotonic() + self._cfg.ack_timeout_s
        while True:
            answer = self.read_message(deadline)
            if isinstance(answer, dict):
                ack = {as_bytes(k): v for k, v in answer.items()}.get(b"ack")
                if ack is not None and as_bytes(ack).decode() == cid:
                    return

    def _socket(self) -> socket.socket:
        if self._sock is None:
            raise ConnectionError("not connected to the forward server")
        return self._sock

    def read_message(self, deadline: float) -> Any:
        """The next msgpack object from the server, or TimeoutError at the deadline."""
        sock = self._socket()
        while True:
            for obj in self._unpacker:
                return obj
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer from the forward server")
            sock.settimeout(left)
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("forward server closed the connection")
            self._unpacker.feed(data)

    def _handshake(self) -> None:
        assert self._shared_key is not None
        deadline = time.monotonic() + self._cfg.timeout_s
        helo = self.read_message(deadline)
        if not (isinstance(helo, list) and helo and as_bytes(helo[0]) == b"HELO"):
            raise HandshakeError("server did not start with HELO (is shared_key set there?)")
        opts = {as_bytes(k).decode(): v for k, v in (helo[1] if len(helo) > 1 else {}).items()}
        nonce = as_bytes(opts.get("nonce", b""))
        auth_salt = as_bytes(opts.get("auth", b""))
        key = self._shared_key.get_secret_value().encode()
        salt = os.urandom(16)
        hostname = self._cfg.self_hostname.encode()
        user = (self._cfg.username or "").encode()
        password = self._password.get_secret_value().encode() if self._password else b""
        user_digest = _sha512_hex(auth_salt, user, password) if auth_salt else ""
        ping = ["PING", self._cfg.self_hostname, salt, _sha512_hex(salt, hostname, nonce, key),
                user.decode(), user_digest]
        self._socket().sendall(msgpack.packb(ping, use_bin_type=True))
        pong = self.read_message(deadline)
        if not (isinstance(pong, list) and len(pong) >= 5 and as_bytes(pong[0]) == b"PONG"):
            raise HandshakeError("server did not answer PING with PONG")
        if not pong[1]:
            raise HandshakeError(f"server refused authentication: {as_bytes(pong[2]).decode()}")
        expected = _sha512_hex(salt, as_bytes(pong[3]), nonce, key)
        if as_bytes(pong[4]).decode() != expected:
            raise HandshakeError("server's PONG digest is wrong: it does not know the key")



