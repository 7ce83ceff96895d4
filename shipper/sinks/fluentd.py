"""Fluentd / Fluent Bit sink: the forward protocol with `chunk` / `ack` (at-least-once)
and nanosecond EventTime, through fluent-logger's FluentSender for the connection.

fluent-logger sends Message mode with no acknowledgement and second precision by
default; this sink keeps its connection handling (`_reconnect`, `_close`) and its
`EventTime`, and adds what an audit trail needs:
- Forward mode `[tag, [[EventTime(ns), record], ...], {"chunk": id, "size": n}]`, one
  chunk per tag (`<tag_prefix>.<kind>`) in the batch, then waits for `{"ack": id}`.
- The chunk id is base64(sha256(the chunk's record ids)[:16]): resending the same records
  gives the same id, so a receiver can de-duplicate a retried chunk.
- No ack within `ack_timeout_s`, or a broken connection: the chunk and every later chunk
  of the batch are RETRY (earlier, acknowledged chunks are DELIVERED); the connection is
  closed so the resend starts clean.
- TLS (ssl wrap after connect) and the shared_key HELO/PING/PONG handshake (SHA-512
  digests, optional user/password) as in_forward implements it; the server's PONG digest
  is checked too, so we never deliver to a server that does not know the key.
The acknowledgement means the receiver has the chunk in its buffer, not that it reached
the final store; that is the forward protocol's guarantee. Fluentd is a router, so
read_back is not possible: it raises ReadBackUnsupported.

This module must never log the shared key or password, and never drop a record without
an outcome.
"""

from __future__ import annotations

import base64
import hashlib
import os
import ssl
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import msgpack
from fluent.sender import EventTime, FluentSender
from pydantic import SecretStr

from shipper.sinks.base import ItemResult, Outcome, SinkError, SinkRecord
from shipper.sinks.config import FluentdSinkConfig
from shipper.sinks.errors import ReadBackUnsupported


def chunk_id(record_ids: Sequence[str]) -> str:
    """Deterministic chunk id: the same records always give the same id."""
    digest = hashlib.sha256("\n".join(record_ids).encode()).digest()[:16]
    return base64.b64encode(digest).decode()


def _sha512_hex(*parts: bytes) -> str:
    h = hashlib.sha512()
    for part in parts:
        h.update(part)
    return h.hexdigest()


def _b(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value).encode()


class HandshakeError(Exception):
    """The shared_key handshake failed (wrong key, wrong user, unexpected server)."""


class _AckSender(FluentSender):  # type: ignore[misc]
    """FluentSender whose connection is TLS-wrapped and authenticated when asked."""

    socket: Any  # set by FluentSender._reconnect; a plain or TLS socket, or None

    def __init__(
        self,
        cfg: FluentdSinkConfig,
        shared_key: SecretStr | None,
        password: SecretStr | None,
    ) -> None:
        super().__init__(cfg.tag_prefix, host=cfg.host, port=cfg.port, timeout=cfg.timeout_s,
                         nanosecond_precision=True)
        self._cfg = cfg
        self._shared_key = shared_key
        self._password = password
        self.unpacker = msgpack.Unpacker(raw=True)

    def _reconnect(self) -> None:
        current: Any = self.socket
        if current:
            return
        super()._reconnect()
        self.unpacker = msgpack.Unpacker(raw=True)
        try:
            if self._cfg.tls.enabled:
                plain: Any = self.socket
                self.socket = self._tls_context().wrap_socket(
                    plain, server_hostname=self._cfg.host)
            if self._shared_key is not None:
                self._handshake()
        except BaseException:
            self._close()
            raise

    def _tls_context(self) -> ssl.SSLContext:
        tls = self._cfg.tls
        ctx = ssl.create_default_context(cafile=str(tls.ca_file) if tls.ca_file else None)
        if not tls.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if tls.client_cert is not None:
            ctx.load_cert_chain(str(tls.client_cert), str(tls.client_key))
        return ctx

    def read_message(self, deadline: float) -> Any:
        """The next msgpack object from the server, or TimeoutError at the deadline."""
        sock = self.socket
        while True:
            for obj in self.unpacker:
                return obj
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer from the forward server")
            sock.settimeout(left)
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("forward server closed the connection")
            self.unpacker.feed(data)

    def _handshake(self) -> None:
        assert self._shared_key is not None
        deadline = time.monotonic() + self._cfg.timeout_s
        helo = self.read_message(deadline)
        if not (isinstance(helo, list) and helo and _b(helo[0]) == b"HELO"):
            raise HandshakeError("server did not start with HELO (is shared_key set there?)")
        opts = {_b(k).decode(): v for k, v in (helo[1] if len(helo) > 1 else {}).items()}
        nonce = _b(opts.get("nonce", b""))
        auth_salt = _b(opts.get("auth", b""))
        key = self._shared_key.get_secret_value().encode()
        salt = os.urandom(16)
        hostname = self._cfg.self_hostname.encode()
        user = (self._cfg.username or "").encode()
        password = self._password.get_secret_value().encode() if self._password else b""
        user_digest = _sha512_hex(auth_salt, user, password) if auth_salt else ""
        ping = ["PING", self._cfg.self_hostname, salt, _sha512_hex(salt, hostname, nonce, key),
                user.decode(), user_digest]
        self.socket.sendall(msgpack.packb(ping, use_bin_type=True))
        pong = self.read_message(deadline)
        if not (isinstance(pong, list) and len(pong) >= 5 and _b(pong[0]) == b"PONG"):
            raise HandshakeError("server did not answer PING with PONG")
        if not pong[1]:
            raise HandshakeError(f"server refused authentication: {_b(pong[2]).decode()}")
        expected = _sha512_hex(salt, _b(pong[3]), nonce, key)
        if _b(pong[4]).decode() != expected:
            raise HandshakeError("server's PONG digest is wrong: it does not know the key")


class FluentdSink:
    kind = "fluentd"

    def __init__(
        self,
        cfg: FluentdSinkConfig,
        name: str,
        *,
        shared_key: SecretStr | None = None,
        password: SecretStr | None = None,
    ) -> None:
        self.name = name
        self._cfg = cfg
        self._sender = _AckSender(cfg, shared_key, password)

    def start(self) -> None:
        """Connect (and authenticate) once, so a wrong key shows at start."""
        try:
            self._sender._reconnect()
        except HandshakeError as exc:
            raise SinkError(Outcome.HOLD, f"forward handshake: {exc}") from None
        except (OSError, ValueError, msgpack.UnpackException) as exc:
            raise SinkError(Outcome.RETRY, f"forward connect: {type(exc).__name__}: {exc}") \
                from None

    def tag_for(self, doc: Mapping[str, Any]) -> str:
        return f"{self._cfg.tag_prefix}.{doc.get('kind') or 'record'}"

    def send(self, batch: Sequence[SinkRecord]) -> Sequence[ItemResult]:
        results: list[ItemResult | None] = [None] * len(batch)
        chunks: dict[str, list[int]] = {}
        for i, rec in enumerate(batch):
            time_ns = rec.doc.get("time_ns")
            if not isinstance(time_ns, int) or isinstance(time_ns, bool) or time_ns < 0:
                results[i] = ItemResult(Outcome.DEAD_LETTER, "record has no valid time_ns")
                continue
            chunks.setdefault(self.tag_for(rec.doc), []).append(i)
        failed: str | None = None
        for tag, positions in chunks.items():
            if failed is None:
                failed = self._send_chunk(tag, [batch[p] for p in positions])
            outcome = ItemResult(Outcome.DELIVERED) if failed is None else \
                ItemResult(Outcome.RETRY, failed)
            for p in positions:
                results[p] = outcome
        out: list[ItemResult] = []
        for r in results:
            assert r is not None, "fluentd sink left a record without an outcome"
            out.append(r)
        return out

    def _send_chunk(self, tag: str, records: Sequence[SinkRecord]) -> str | None:
        """Send one chunk and wait for its ack; None on success, else the reason."""
        cid = chunk_id([r.record_id for r in records])
        entries = [[EventTime.from_unix_nano(r.doc["time_ns"]), dict(r.doc)] for r in records]
        packet = msgpack.packb([tag, entries, {"chunk": cid, "size": len(entries)}],
                               use_bin_type=True)
        sender = self._sender
        try:
            sender._reconnect()
            sender.socket.settimeout(self._cfg.timeout_s)
            sender.socket.sendall(packet)
            deadline = time.monotonic() + self._cfg.ack_timeout_s
            while True:
                answer = sender.read_message(deadline)
                if isinstance(answer, Mapping):
                    ack = {_b(k): v for k, v in answer.items()}.get(b"ack")
                    if ack is not None and _b(ack).decode() == cid:
                        return None
        except HandshakeError as exc:
            sender._close()
            return f"forward handshake: {exc}"
        except (OSError, TimeoutError, ValueError, msgpack.UnpackException) as exc:
            sender._close()
            return f"no ack for chunk {cid}: {type(exc).__name__}: {exc}"

    def read_back(self, start_ns: int, end_ns: int) -> Iterator[Mapping[str, Any]]:
        raise ReadBackUnsupported(
            f"sink {self.name}: Fluentd/Fluent Bit forward is a router and keeps nothing to "
            "read back; verify against the store it forwards to, or the archive"
        )

    def close(self) -> None:
        self._sender._close()

