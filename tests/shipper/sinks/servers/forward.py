"""In-process Fluentd forward-protocol server.

Parses the msgpack stream in Message, Forward and PackedForward (optionally gzip
CompressedPackedForward) modes, decodes EventTime (ext type 0: u32 sec + u32 nsec) to
nanoseconds, answers `{"ack": chunk}` when asked, de-duplicates by chunk id (counting the
duplicates), and can run the shared_key HELO/PING/PONG handshake. Misbehaves on command:
`drop_acks` (store the chunk, send no ack), `close_on_next` (read a message, store
nothing, close the connection).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import socket
import socketserver
import struct
import threading
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import msgpack


@dataclass(frozen=True)
class Event:
    tag: str
    time_ns: int
    record: dict[str, Any]


def _ext_hook(code: int, data: bytes) -> Any:
    if code == 0:
        sec, nsec = struct.unpack(">II", data)
        return ("EventTime", sec * 1_000_000_000 + nsec)
    return msgpack.ExtType(code, data)


def _time_ns(value: Any) -> int:
    if isinstance(value, tuple) and value[0] == "EventTime":
        return int(value[1])
    return int(value) * 1_000_000_000  # integer seconds (fluent-logger's default)


class ForwardServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, *, shared_key: str | None = None, users: dict[str, str] | None = None,
                 hostname: str = "fake-fluentd") -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.events: list[Event] = []
        self.chunks_seen: set[str] = set()
        self.duplicates = 0
        self.messages = 0
        self.drop_acks = 0
        self.close_on_next = 0
        self.shared_key = shared_key
        self.users = users
        self.hostname = hostname
        self.wrong_pong = False
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def __enter__(self) -> ForwardServer:
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.shutdown()
        self.server_close()

    def ingest(self, msg: list[Any]) -> str | None:
        """Store one message's events; return the chunk id to ack, if any."""
        tag = msg[0].decode() if isinstance(msg[0], bytes) else msg[0]
        option: dict[str, Any] = {}
        entries: list[tuple[Any, Any]]
        if isinstance(msg[1], list):  # Forward
            entries = [(e[0], e[1]) for e in msg[1]]
            option = msg[2] if len(msg) > 2 else {}
        elif isinstance(msg[1], (bytes, bytearray)):  # PackedForward
            option = msg[2] if len(msg) > 2 else {}
            blob = bytes(msg[1])
            if option.get("compressed") == "gzip":
                blob = gzip.decompress(blob)
            unpacker = msgpack.Unpacker(raw=False, ext_hook=_ext_hook)
            unpacker.feed(blob)
            entries = [(e[0], e[1]) for e in unpacker]
        else:  # Message
            entries = [(msg[1], msg[2])]
            option = msg[3] if len(msg) > 3 else {}
        chunk = option.get("chunk") if isinstance(option, dict) else None
        with self.lock:
            self.messages += 1
            if chunk is not None and chunk in self.chunks_seen:
                self.duplicates += 1
            else:
                if chunk is not None:
                    self.chunks_seen.add(chunk)
                self.events += [Event(tag, _time_ns(t), rec) for t, rec in entries]
        return chunk


def _hex(*parts: bytes) -> str:
    h = hashlib.sha512()
    for p in parts:
        h.update(p)
    return h.hexdigest()


class _Handler(socketserver.BaseRequestHandler):
    server: ForwardServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(10)
        unpacker = msgpack.Unpacker(raw=False, ext_hook=_ext_hook)
        srv = self.server
        if srv.shared_key is not None and not self._handshake(sock, unpacker):
            return
        while True:
            try:
                data = sock.recv(65536)
            except OSError:
                return
            if not data:
                return
            unpacker.feed(data)
            for msg in unpacker:
                with srv.lock:
                    closing = srv.close_on_next > 0
                    if closing:
                        srv.close_on_next -= 1
                if closing:
                    sock.close()
                    return
                chunk = srv.ingest(msg)
                with srv.lock:
                    dropping = chunk is not None and srv.drop_acks > 0
                    if dropping:
                        srv.drop_acks -= 1
                if chunk is not None and not dropping:
                    sock.sendall(msgpack.packb({"ack": chunk}, use_bin_type=True))

    def _next(self, sock: socket.socket, unpacker: msgpack.Unpacker) -> Any:
        while True:
            for obj in unpacker:
                return obj
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("closed")
            unpacker.feed(data)

    def _handshake(self, sock: socket.socket, unpacker: msgpack.Unpacker) -> bool:
        srv = self.server
        assert srv.shared_key is not None
        nonce, auth_salt = os.urandom(16), os.urandom(16) if srv.users else b""
        sock.sendall(msgpack.packb(["HELO", {"nonce": nonce, "auth": auth_salt,
                                             "keepalive": True}], use_bin_type=True))
        ping = self._next(sock, unpacker)
        _, client_host, salt, digest, user, user_digest = ping
        key = srv.shared_key.encode()
        ok, reason = True, ""
        if digest != _hex(salt, client_host.encode(), nonce, key):
            ok, reason = False, "shared_key mismatch"
        elif srv.users is not None:
            password = srv.users.get(user)
            if password is None or user_digest != _hex(auth_salt, user.encode(),
                                                       password.encode()):
                ok, reason = False, "username/password mismatch"
        pong_key = b"not-the-key" if srv.wrong_pong else key
        sock.sendall(msgpack.packb(
            ["PONG", ok, reason, srv.hostname,
             _hex(salt, srv.hostname.encode(), nonce, pong_key)], use_bin_type=True))
        if not ok:
            sock.close()
        return ok
