"""The launcher's socket protocol: one JSON object per line each way.

Request: `{"op": OP, ...}` with OP one of submit (`spec`: the YAML text, `path`: its
name for messages, `cwd`: the client's directory), queue, status (`id` optional), logs
(`id`, `stream` out|err, `offset`, `attempt` optional), cancel / hold / release (`id`),
ping. Response: `{"ok": true, ...}` or `{"ok": false, "error": CODE, "message": TEXT,
"problems": [...]}`, CODE one of invalid, denied, not_found, bad_request, internal.

The caller's identity is never part of a request: the daemon takes it from the socket
(launcher.peer). `call()` is the client side: one request, one response, a timeout.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import orjson

MAX_LINE = 8 * 1024 * 1024
OPS = frozenset({"submit", "queue", "status", "logs", "cancel", "hold", "release", "ping"})
DEFAULT_SOCKET = Path("/run/gpu-audit/launcher.sock")


class ProtocolError(Exception):
    """The daemon could not be reached or answered something that is not the protocol."""


def encode(doc: dict[str, Any]) -> bytes:
    return orjson.dumps(doc) + b"\n"


def error(code: str, message: str, problems: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"ok": False, "error": code, "message": message}
    if problems:
        out["problems"] = problems
    return out


def call(path: Path, request: dict[str, Any], *, timeout: float = 30.0) -> dict[str, Any]:
    """Send one request to the daemon at `path` and return its response."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        try:
            s.connect(str(path))
        except FileNotFoundError:
            raise ProtocolError(
                f"no launcher socket at {path}: is `gpu-audit launcher serve` running "
                "(or pass --socket)?") from None
        except ConnectionRefusedError:
            raise ProtocolError(
                f"the launcher at {path} refused the connection: the daemon is not "
                "running (a stale socket file is left)") from None
        except PermissionError:
            raise ProtocolError(
                f"permission denied on {path}: the socket is restricted to a group you "
                "are not in") from None
        s.sendall(encode(request))
        buf = bytearray()
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
            if len(buf) > MAX_LINE:
                raise ProtocolError("response larger than the protocol allows")
    except TimeoutError:
        raise ProtocolError(f"the launcher at {path} did not answer within {timeout:g} s") \
            from None
    finally:
        s.close()
    try:
        doc = orjson.loads(bytes(buf))
    except orjson.JSONDecodeError:
        raise ProtocolError("the launcher's answer is not JSON (is that its socket?)") \
            from None
    if not isinstance(doc, dict):
        raise ProtocolError("the launcher's answer is not a JSON object")
    return doc
