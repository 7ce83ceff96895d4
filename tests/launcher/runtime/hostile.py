"""A hostile local user, for real: attacks on the launcher run in a process that has
become that user (uid, gid, groups) before it touches the socket or the state directory,
so the daemon sees exactly what it would see from an attacker on a shared node.

`as_user(user, attack, *args)` runs one attack to completion and returns its JSON
result; `Holding(user, attack, *args)` starts one that keeps its connections open until
the test leaves the `with` block (the attacker waits for its stdin to close).

Attacks (each prints one JSON line; the holding ones print it once their connections
are in place, then wait):
- `flood SOCKET N`: open N connections and keep them; report how many connected and the
  answers read back within a second (a refusal is answered at once).
- `big_lines SOCKET N SIZE`: N connections each send SIZE bytes with no newline; report
  the answers read back.
- `non_readers SOCKET N REQUEST`: N connections each send REQUEST and never read.
- `connect_close SOCKET PROCS SECONDS`: PROCS processes each connect and close at once,
  as fast as they can, for SECONDS (or until the test leaves the block); the result
  counts the connects that got in and those refused with EAGAIN.
- `connect_to SOCKET`: one connection; "ok" or the errno's name.
- `plant_links DIR NAME=TARGET...`: replace NAME in DIR with a symbolic link to TARGET;
  report which succeeded and the error of the others.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pwd
import resource
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]

_PRELUDE = """
import os, sys, resource
import tests.launcher.runtime.hostile as h
uid, gid, groups = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
if os.environ.get("GPA_CGROUP_PROCS"):  # into the user's own CPU group, as root
    with open(os.environ["GPA_CGROUP_PROCS"], "w") as f:
        f.write("0")
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (max(hard, 8192), max(hard, 8192)))
os.setgroups([int(g) for g in groups.split(",") if g])
os.setgid(gid)
os.setuid(uid)
h.main(sys.argv[4:])
"""


def _argv(user: str, attack: str, args: tuple[object, ...]) -> list[str]:
    pw = pwd.getpwnam(user)
    groups = ",".join(map(str, os.getgrouplist(user, pw.pw_gid)))
    return [sys.executable, "-c", _PRELUDE, str(pw.pw_uid), str(pw.pw_gid), groups,
            attack, *map(str, args)]


def as_user(user: str, attack: str, *args: object, timeout: float = 120) -> Any:
    """Run `attack` as `user` to completion; its JSON result."""
    r = subprocess.run(_argv(user, attack, args), cwd=REPO, capture_output=True, text=True,
                       timeout=timeout, check=False, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise AssertionError(f"attack {attack} as {user} failed: {r.stdout}{r.stderr}")
    return json.loads(r.stdout.splitlines()[-1])


class Holding:
    """An attack that keeps its connections open while the `with` block runs."""

    def __init__(self, user: str, attack: str, *args: object, timeout: float = 120,
                 cgroup: Path | None = None) -> None:
        """cgroup: a cpu cgroup (v1) directory the attacker runs in, as systemd puts
        each logged-in user's processes in their own user-UID.slice."""
        self._argv = _argv(user, attack, args)
        self._timeout = timeout
        self._env = dict(os.environ)
        if cgroup is not None:
            self._env["GPA_CGROUP_PROCS"] = str(cgroup / "cgroup.procs")
        self.proc: subprocess.Popen[str] | None = None
        self.result: Any = None

    def __enter__(self) -> Holding:
        self.proc = subprocess.Popen(self._argv, cwd=REPO, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=self._env)
        assert self.proc.stdout is not None
        line = _readline_within(self.proc, self._timeout)
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"the attacker ended before it was in place: {err}")
        self.result = json.loads(line)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


def _readline_within(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(timeout):
            proc.kill()
            raise AssertionError(f"the attacker was not in place within {timeout:g} s")
        return proc.stdout.readline()
    finally:
        sel.close()


# ----------------------------------------------------------------- run as the attacker


def _connect(path: str) -> socket.socket | str:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError as exc:
        s.close()
        return errno.errorcode.get(exc.errno or 0, str(exc))
    s.setblocking(False)
    return s


def _answers(socks: list[socket.socket], seconds: float) -> list[str]:
    """What each connection reads back within `seconds` ("" where nothing came)."""
    got = {s.fileno(): b"" for s in socks}
    sel = selectors.DefaultSelector()
    for s in socks:
        sel.register(s, selectors.EVENT_READ)
    deadline = time.monotonic() + seconds
    open_ = len(socks)
    while open_ and time.monotonic() < deadline:
        for key, _ in sel.select(max(0.0, deadline - time.monotonic())):
            s = key.fileobj
            assert isinstance(s, socket.socket)
            try:
                chunk = s.recv(65536)
            except BlockingIOError:
                continue
            except OSError as exc:
                chunk = b""
                got[s.fileno()] += f"<{errno.errorcode.get(exc.errno or 0)}>".encode()
            if not chunk or b"\n" in got[s.fileno()] + chunk:
                got[s.fileno()] += chunk
                sel.unregister(s)
                open_ -= 1
            else:
                got[s.fileno()] += chunk
    sel.close()
    return [got[s.fileno()].decode("utf-8", "replace") for s in socks]


def _hold() -> None:
    sys.stdout.flush()
    sys.stdin.read()  # until the test closes our stdin


def flood(path: str, n: str) -> None:
    socks: list[socket.socket] = []
    errors: dict[str, int] = {}
    for _ in range(int(n)):
        s = _connect(path)
        if isinstance(s, str):
            errors[s] = errors.get(s, 0) + 1
        else:
            socks.append(s)
    answers = [a for a in _answers(socks, 1.0) if a]
    print(json.dumps({"connected": len(socks), "errors": errors,
                      "answered": len(answers), "answers": sorted(set(answers))[:5]}))
    _hold()


def big_lines(path: str, n: str, size: str) -> None:
    socks = [s for s in (_connect(path) for _ in range(int(n))) if not isinstance(s, str)]
    left = {s.fileno(): int(size) for s in socks}
    chunk = b"x" * 65536
    sent_errors: dict[str, int] = {}
    deadline = time.monotonic() + 60
    busy = True
    while busy and time.monotonic() < deadline:
        busy = False
        for s in socks:
            if left[s.fileno()] <= 0:
                continue
            try:
                k = s.send(chunk[:left[s.fileno()]])
                left[s.fileno()] -= k
                busy = True
            except BlockingIOError:
                busy = True
            except OSError as exc:
                name = errno.errorcode.get(exc.errno or 0, str(exc))
                sent_errors[name] = sent_errors.get(name, 0) + 1
                left[s.fileno()] = 0
        time.sleep(0.001)
    answers = _answers(socks, 10.0)
    print(json.dumps({"connected": len(socks), "send_errors": sent_errors,
                      "unsent_bytes": sum(left.values()),
                      "answers": sorted({a for a in answers if a})[:5],
                      "answered": sum(1 for a in answers if a)}))
    _hold()


def non_readers(path: str, n: str, request: str) -> None:
    socks: list[socket.socket] = []
    for _ in range(int(n)):
        s = _connect(path)
        if isinstance(s, str):
            continue
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.setblocking(True)
        s.sendall(request.encode() + b"\n")
        socks.append(s)
    print(json.dumps({"connected": len(socks)}))
    _hold()


def plant_links(directory: str, *pairs: str) -> None:
    done: dict[str, str] = {}
    for pair in pairs:
        name, _, target = pair.partition("=")
        tmp = os.path.join(directory, f".{name}.link")
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            os.symlink(target, tmp)
            os.replace(tmp, os.path.join(directory, name))
            done[name] = "linked"
        except OSError as exc:
            done[name] = errno.errorcode.get(exc.errno or 0, str(exc))
    print(json.dumps(done))


def _connect_close_loop(path: str, seconds: float, out: int) -> None:
    ok = again = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(path)
            ok += 1
        except BlockingIOError:
            again += 1
        except OSError:
            again += 1
        s.close()
    os.write(out, f"{ok} {again}\n".encode())
    os._exit(0)


def connect_close(path: str, procs: str, seconds: str) -> None:
    r, w = os.pipe()
    kids = []
    for _ in range(int(procs)):
        pid = os.fork()
        if pid == 0:
            os.close(r)
            _connect_close_loop(path, float(seconds), w)
        kids.append(pid)
    os.close(w)
    time.sleep(0.5)  # the loops are running before the test measures
    print(json.dumps({"procs": len(kids)}))
    sys.stdout.flush()
    sys.stdin.read()
    for pid in kids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
        os.waitpid(pid, 0)


def connect_to(path: str) -> None:
    """One connection to PATH: "ok" or the errno's name."""
    got = _connect(path)
    if isinstance(got, str):
        print(json.dumps({"result": got}))
        return
    got.close()
    print(json.dumps({"result": "ok"}))


ATTACKS: dict[str, Callable[..., None]] = {
    "connect_close": connect_close, "connect_to": connect_to,
    "flood": flood, "big_lines": big_lines, "non_readers": non_readers,
    "plant_links": plant_links,
}


def main(argv: list[str]) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    ATTACKS[argv[0]](*argv[1:])
