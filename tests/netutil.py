"""Small helpers for tests that start real processes on loopback."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from tests.polling import wait_for


def free_port() -> int:
    """A port that was free a moment ago. Racy (another process may take it before it is
    bound): prefer `--listen 127.0.0.1:0` and `bound_port()` for processes of ours."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, b""


# `gpu-audit run|exporter` logs "serving http://HOST:PORT/metrics", the standalone shipper
# "shipper metrics on http://HOST:PORT/metrics", both with the port actually bound.
_SERVING = re.compile(rb"(?:serving|shipper metrics on) https?://\S+:(\d+)/metrics")


def bound_port(log: Path, proc: subprocess.Popen[bytes], timeout: float = 30) -> int:
    """The port a process of ours started with `--listen 127.0.0.1:0` bound, read from
    its log file (stderr redirected to `log`; log level info or lower)."""
    def exited() -> None:
        if proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode} before listening: "
                                 f"{log.read_bytes()[-3000:].decode(errors='replace')}")

    found = wait_for(lambda: _SERVING.search(log.read_bytes()) if log.exists() else None,
                     timeout, f"a 'serving ...' line in {log}", check=exited)
    return int(found.group(1))


def owns_listener(pid: int, port: int) -> bool:
    """Whether process `pid` holds the socket listening on 127.0.0.1:`port` (TCP, IPv4).

    Answers "is it *our* server that answers there": a server started on a port found
    free can lose it to another process and exit, while that other process answers."""
    want = f"0100007F:{port:04X}"
    inodes = set()
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if fields[1] == want and fields[3] == "0A":  # local address, state LISTEN
                inodes.add(fields[9])
    if not inodes:
        return False
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            return True
    return False
