"""The launcher's socket protocol: one JSON object per line each way, one request per
connection.

Request: `{"op": OP, ...}` with OP one of submit (`spec`: the YAML text, `path`: its
name for messages, `cwd`: the client's directory), queue, status (`id` optional), logs
(`id`, `stream` out|err, `offset`, `attempt` optional), cancel / hold / release (`id`),
retry (`id`), ping. Response: `{"ok": true, ...}` or `{"ok": false, "error": CODE, "message": TEXT,
"problems": [...]}`, CODE one of invalid, denied, not_found, bad_request, too_large,
busy, internal.

`parse_request(line)` is the daemon's frame parser: it turns one line into a `Request`
or an error answer naming every problem (unknown op or key, a number out of its range
from launcher.limits, a wrong type). The caller's identity is never part of a request:
the daemon takes it from the socket (launcher.peer).

`call()` is the client side: it writes the request while reading, so an answer that
comes before the request is fully sent (a request too large) is read and reported
(`RequestTooLarge`) instead of the client dying on a broken pipe. It connects through
the uid's own socket beside the common one when the daemon made one
(`user_socket_path`, launcher.usersockets), else through the common socket.
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import stat
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from gpu_audit.errors import GpuAuditError
from launcher.limits import MAX_ATTEMPT, MAX_JOB_ID, MAX_LOG_OFFSET, MAX_RESPONSE_BYTES

OPS = frozenset({"submit", "queue", "status", "logs", "cancel", "hold", "release", "retry",
                 "ping"})
DEFAULT_SOCKET = Path("/run/gpu-audit/launcher.sock")
MAX_PROBLEMS = 200  # an answer lists at most this many problems, then says how many more
_MAX_TEXT = 4096

# The keys each op takes (besides "op"), and those it needs.
KEYS: dict[str, frozenset[str]] = {
    "ping": frozenset(), "queue": frozenset(), "status": frozenset({"id", "events_from"}),
    "logs": frozenset({"id", "stream", "offset", "attempt"}),
    "submit": frozenset({"spec", "path", "cwd"}),
    "cancel": frozenset({"id"}), "hold": frozenset({"id"}), "release": frozenset({"id"}),
    "retry": frozenset({"id"}),
}
REQUIRED: dict[str, frozenset[str]] = {
    "logs": frozenset({"id"}), "submit": frozenset({"spec"}), "cancel": frozenset({"id"}),
    "hold": frozenset({"id"}), "release": frozenset({"id"}), "retry": frozenset({"id"}),
}


class ProtocolError(GpuAuditError):
    """The daemon could not be reached or answered something that is not the protocol."""


class RequestTooLarge(ProtocolError):
    """The daemon refused the request for its size before it was fully sent."""

    def __init__(self, size: int, limit: int | None) -> None:
        self.size, self.limit = size, limit
        super().__init__(f"request too large: {size} bytes, limit "
                         f"{limit if limit is not None else 'unknown'}")


@dataclass(frozen=True, slots=True)
class Request:
    """A request that passed `parse_request`: every field present is in range."""

    op: str
    id: int | None = None
    stream: str = "out"
    offset: int = 0
    attempt: int | None = None
    spec: str | None = None
    path: str = "<submission>"
    cwd: str | None = None
    events_from: int | None = None  # status: the first event of the page (default: newest)


def encode(doc: dict[str, Any]) -> bytes:
    return orjson.dumps(doc) + b"\n"


def error(code: str, message: str, problems: list[str] | None = None,
          **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"ok": False, "error": code, "message": message}
    if problems:
        if len(problems) > MAX_PROBLEMS:
            more = len(problems) - MAX_PROBLEMS + 1
            problems = [*problems[:MAX_PROBLEMS - 1], f"... and {more} more problems"]
        out["problems"] = problems
    out.update(extra)
    return out


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _integer(name: str, value: object, low: int, high: int,
             problems: list[str]) -> int | None:
    """`value` as an integer in [low, high] (a JSON integer or a string of digits, as the
    command line sends ids); None with a problem otherwise."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 20:
        number = int(value)
    if number is None or not low <= number <= high:
        problems.append(f"{name}: must be an integer {low}..{high}, not {_short(value)}")
        return None
    return number


def _text(name: str, value: object, problems: list[str], *,
          limit: int | None = _MAX_TEXT) -> str | None:
    if not isinstance(value, str):
        problems.append(f"{name}: must be a string, not {type(value).__name__}")
        return None
    if limit is not None and len(value) > limit:
        problems.append(f"{name}: longer than {limit} characters")
        return None
    if "\0" in value:
        problems.append(f"{name}: contains a NUL character")
        return None
    return value


def parse_request(line: bytes) -> Request | dict[str, Any]:
    """The request in `line` (one JSON object, without its newline), or the error answer
    that names every problem with it."""
    try:
        doc = orjson.loads(line)
    except orjson.JSONDecodeError:
        return error("bad_request", "request is not JSON")
    if not isinstance(doc, dict):
        return error("bad_request", "request is not a JSON object")
    op = doc.get("op")
    if not isinstance(op, str) or op not in OPS:
        return error("bad_request", f"unknown op {_short(op)}; one of "
                                    f"{', '.join(sorted(OPS))}")
    problems: list[str] = []
    keys = KEYS[op]
    unknown = sorted(str(k) for k in doc if k != "op" and k not in keys)
    if unknown:
        problems.append(f"unknown key(s) for {op}: {', '.join(_short(k) for k in unknown[:10])}"
                        f"{' ...' if len(unknown) > 10 else ''}")
    for key in sorted(REQUIRED.get(op, frozenset()) - {k for k, v in doc.items()
                                                        if v is not None}):
        problems.append(f"{key}: required for {op}")
    fields: dict[str, Any] = {}
    if doc.get("id") is not None and "id" in keys:
        fields["id"] = _integer("id", doc["id"], 1, MAX_JOB_ID, problems)
    if doc.get("offset") is not None and "offset" in keys:
        fields["offset"] = _integer("offset", doc["offset"], 0, MAX_LOG_OFFSET, problems)
    if doc.get("events_from") is not None and "events_from" in keys:
        fields["events_from"] = _integer("events_from", doc["events_from"], 0,
                                         MAX_LOG_OFFSET, problems)
    if doc.get("attempt") is not None and "attempt" in keys:
        fields["attempt"] = _integer("attempt", doc["attempt"], 1, MAX_ATTEMPT, problems)
    if doc.get("stream") is not None and "stream" in keys:
        if doc["stream"] not in ("out", "err"):
            problems.append(f"stream: must be out or err, not {_short(doc['stream'])}")
        else:
            fields["stream"] = doc["stream"]
    if doc.get("spec") is not None and "spec" in keys:
        fields["spec"] = _text("spec", doc["spec"], problems, limit=None)
    if doc.get("path") is not None and "path" in keys:
        fields["path"] = _text("path", doc["path"], problems)
    if doc.get("cwd") is not None and "cwd" in keys:
        fields["cwd"] = _text("cwd", doc["cwd"], problems)
    if problems:
        return error("bad_request", f"bad {op} request", problems)
    return Request(op=op, **fields)


# --- the client ---------------------------------------------------------------------------


BUSY_RETRY_SECONDS = 5.0  # how long a client keeps trying a daemon whose queue is full


class DaemonBusy(ProtocolError):
    """The daemon's connection queue stayed full (or it kept answering busy) for the
    whole retry window."""


def _connect_once(path: Path, timeout: float) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # a blocking connect with a send timeout: when the daemon's listen queue is full the
    # kernel lets this wait for room (woken as the daemon accepts) instead of failing
    # with EAGAIN at once, as a non-blocking connect does
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                 struct.pack("ll", int(timeout), int((timeout % 1) * 1e6)))
    try:
        s.connect(str(path))
    except BaseException:
        s.close()
        raise
    s.setblocking(False)
    return s


def user_socket_dir(path: Path) -> Path:
    """Where the daemon listening on `path` keeps its per-user sockets."""
    return path.with_name(path.name + ".d")


def user_socket_path(path: Path, uid: int) -> Path:
    """The socket the daemon at `path` listens on for `uid` alone
    (launcher.usersockets): a flood in someone else's queue is not in front of it."""
    return user_socket_dir(path) / str(uid)


def _own_socket(path: Path) -> Path | None:
    """This uid's own socket beside `path`, when the daemon made one for it (owned by
    this uid, or by root for root): anything else there is not used."""
    uid = os.geteuid()
    own = user_socket_path(path, uid)
    try:
        st = os.lstat(own)
    except OSError:
        return None
    return own if stat.S_ISSOCK(st.st_mode) and st.st_uid == uid else None


def _connect(path: Path, timeout: float) -> socket.socket:
    """A connection to the daemon, through this uid's own socket when the daemon made
    one (a stale one falls back to the common socket); a full listen queue (EAGAIN) is
    retried with a growing pause for up to BUSY_RETRY_SECONDS, then reported as the
    daemon being busy."""
    deadline = time.monotonic() + min(timeout, BUSY_RETRY_SECONDS)
    pause = 0.01
    own = _own_socket(path)
    while True:
        left = max(0.05, deadline - time.monotonic())
        try:
            return _connect_once(own or path, min(left, 1.0))
        except (BlockingIOError, TimeoutError, InterruptedError):
            # a full queue (of its own socket: this uid over its rate): wait for room
            if time.monotonic() >= deadline:
                raise DaemonBusy(_busy(path)) from None
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
                if time.monotonic() >= deadline:
                    raise DaemonBusy(_busy(path)) from None
            elif own is not None:
                own = None  # a dead daemon's, or taken away: the common socket
                continue
            else:
                raise _unreachable(path, exc) from None
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, 0.5)


def _unreachable(path: Path, exc: OSError) -> ProtocolError:
    if isinstance(exc, FileNotFoundError):
        return ProtocolError(f"no launcher socket at {path}: is `gpu-audit launcher serve` "
                             "running (or pass --socket)?")
    if isinstance(exc, ConnectionRefusedError):
        return ProtocolError(f"the launcher at {path} refused the connection: the daemon "
                             "is not running (a stale socket file is left)")
    if isinstance(exc, PermissionError):
        return ProtocolError(f"permission denied on {path}: the socket is restricted to a "
                             "group you are not in (or its directory is closed to you)")
    return ProtocolError(f"cannot connect to the launcher at {path}: "
                         f"{exc.strerror or exc}")


def _busy(path: Path) -> str:
    return (f"the launcher at {path} is busy: it took no new connection for "
            f"{BUSY_RETRY_SECONDS:g} s (its queue is full; another user may be flooding "
            "it). Try again in a moment; if it lasts, tell the node's admin")


def _exchange(s: socket.socket, data: bytes, path: Path, timeout: float) -> bytes:
    """Write `data` while reading; the first answer line (the daemon may answer before
    it has read everything: then the rest is not sent)."""
    sel = selectors.DefaultSelector()
    sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE)
    deadline = time.monotonic() + timeout
    view, sent = memoryview(data), 0
    buf = bytearray()
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProtocolError(f"the launcher at {path} did not answer within "
                                    f"{timeout:g} s")
            for _, events in sel.select(left):
                if events & selectors.EVENT_READ:
                    try:
                        chunk = s.recv(65536)
                    except (BlockingIOError, InterruptedError):
                        chunk = None
                    except ConnectionResetError:
                        chunk = b""
                    if chunk == b"":
                        return bytes(buf)
                    if chunk:
                        buf += chunk
                        if b"\n" in chunk:
                            return bytes(buf)
                        if len(buf) > MAX_RESPONSE_BYTES:
                            raise ProtocolError("response larger than the protocol allows")
                if events & selectors.EVENT_WRITE and sent < len(view):
                    try:
                        sent += s.send(view[sent:sent + 65536], socket.MSG_NOSIGNAL)
                    except (BlockingIOError, InterruptedError):
                        pass
                    except OSError as exc:
                        if exc.errno not in (errno.EPIPE, errno.ECONNRESET):
                            raise
                        sent = len(view)  # the daemon stopped reading: its answer follows
                    if sent >= len(view):
                        sel.modify(s, selectors.EVENT_READ)
    finally:
        sel.close()


def call(path: Path, request: dict[str, Any], *, timeout: float = 30.0) -> dict[str, Any]:
    """Send one request to the daemon at `path` and return its response. Raises
    RequestTooLarge when the daemon refused it for its size, DaemonBusy when it stayed
    busy (full queue, or busy answers to this uid's new connections) for a few seconds,
    ProtocolError when it could not be reached or did not answer within `timeout`
    seconds."""
    deadline = time.monotonic() + min(timeout, BUSY_RETRY_SECONDS)
    pause = 0.02
    while True:
        doc = _call_once(path, request, timeout)
        if doc.get("error") != "busy" or doc.get("retry") is not True:
            return doc
        if time.monotonic() >= deadline:
            raise DaemonBusy(f"the launcher at {path} is busy: {doc.get('message')}")
        time.sleep(pause)
        pause = min(pause * 2, 0.5)


def _call_once(path: Path, request: dict[str, Any], timeout: float) -> dict[str, Any]:
    data = encode(request)
    s = _connect(path, timeout)
    try:
        buf = _exchange(s, data, path, timeout)
    finally:
        s.close()
    line = buf.split(b"\n", 1)[0]
    if not line:
        raise ProtocolError(f"the launcher at {path} closed the connection without an "
                            "answer")
    try:
        doc = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise ProtocolError("the launcher's answer is not JSON (is that its socket?)") \
            from None
    if not isinstance(doc, dict):
        raise ProtocolError("the launcher's answer is not a JSON object")
    if doc.get("error") == "too_large":
        limit = doc.get("limit")
        raise RequestTooLarge(len(data), limit if isinstance(limit, int) else None)
    return doc
