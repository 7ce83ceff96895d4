"""A real `gpu-audit launcher serve` subprocess on simulated GPUs, and its clients.

`LauncherDaemon(dir, gpus=N)` writes a config under a directory every local user can
enter, starts the daemon (as root: it drops to each submitter), and waits for its socket.
`client(user, *args)` runs the real `gpu-audit launcher ...` command as that local user,
so the daemon learns the caller from SO_PEERCRED exactly as in production.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import resource
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from launcher.protocol import ProtocolError, call
from tests.netutil import free_port
from tests.polling import wait_for

GPU_AUDIT = [sys.executable, "-m", "gpu_audit_app"]
REPO = Path(__file__).resolve().parents[3]


_AS_USER = """
import os, sys
import gpu_audit_app.cli as cli, gpu_audit_app.launcher.main, gpu_audit_app.config
import launcher.protocol
import json, time, argparse, encodings.idna
uid, gid, groups = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
os.setgroups([int(g) for g in groups.split(",") if g])
os.setgid(gid)
os.setuid(uid)
sys.exit(cli.main(sys.argv[4:]))
"""


def write_spec(home: Path, name: str, text: str) -> Path:
    """A spec file in the test's home that the job's user can read (the client reads it
    after dropping privileges)."""
    p = home / name
    p.write_text(text)
    p.chmod(0o644)
    return p


class LauncherDaemon:
    def __init__(self, directory: Path, *, gpus: int = 2,
                 core: Mapping[str, Any] | None = None, admin_group: str | None = None,
                 extra: Mapping[str, Any] | None = None,
                 nofile: int | None = None, account: str | None = None,
                 capabilities: tuple[str, ...] = (), repo: Path = REPO) -> None:
        self.dir = directory
        self.socket = directory / "launcher.sock"
        self.state = directory / "state"
        self.jobmap = directory / "jobs"
        self.metrics_port = free_port()
        cfg: dict[str, Any] = {
            "state_dir": str(self.state), "socket": str(self.socket), "gpus": f"sim:{gpus}",
            "tick_seconds": 0.1, "jobmap_dir": str(self.jobmap),
            "metrics_listen": f"127.0.0.1:{self.metrics_port}", "log_level": "info",
            "core": dict(core or {}),
        }
        if admin_group:
            cfg["admin_group"] = admin_group
        cfg.update(extra or {})
        self.nofile = nofile  # RLIMIT_NOFILE (soft = hard) the daemon starts with
        # run as this account holding these capabilities (ambient, bounding), as
        # deploy/systemd/gpu-audit-launcher-dedicated.service does, through setpriv
        self.account, self.capabilities = account, capabilities
        self.repo = repo  # the checkout whose daemon and client run (bench: an older one)
        self.config = directory / "launcher.yaml"
        self.config.write_text(yaml.safe_dump(cfg))
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = directory / "daemon.log"

    def start(self) -> LauncherDaemon:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [*self._as_account(), *GPU_AUDIT, "launcher", "serve", "--config",
                 str(self.config)],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.repo,
                env={**os.environ, "PYTHONPATH": str(self.repo)},
                preexec_fn=self._limits if self.nofile else None)  # noqa: PLW1509
        wait_for(lambda: self._answers() or self.proc.poll() is not None, 30,
                 "the launcher to answer on its socket")
        if self.proc.poll() is not None:
            raise AssertionError(f"launcher exited: {self.log.read_text()}")
        return self

    def _as_account(self) -> list[str]:
        if self.account is None:
            return []
        caps = ",".join("+" + c.lower().removeprefix("cap_") for c in self.capabilities)
        return ["setpriv", f"--reuid={self.account}", f"--regid={self.account}",
                "--init-groups", f"--inh-caps=-all,{caps}", f"--ambient-caps=-all,{caps}",
                f"--bounding-set=-all,{caps}", "--"]

    def _limits(self) -> None:
        assert self.nofile is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))

    def alive(self) -> bool:
        """The daemon process runs and its socket file is there."""
        return self.proc is not None and self.proc.poll() is None and self.socket.exists()

    def rss_bytes(self) -> int:
        """The daemon's resident memory now (VmRSS)."""
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS in the daemon's status")

    def scrape(self) -> str:
        """The daemon's metrics endpoint, as text."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            return str(resp.read().decode())

    def _answers(self) -> bool:
        try:
            return bool(call(self.socket, {"op": "ping"}, timeout=5).get("ok"))
        except ProtocolError:
            return False

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)

    def kill_jobs(self) -> None:
        """Kill every job process group a test left (by the pid files the executor wrote)."""
        for pidfile in self.state.glob("logs/*/*.pid"):
            with contextlib.suppress(ValueError, OSError):
                os.killpg(int(pidfile.read_text().split()[0]), signal.SIGKILL)

    def client(self, user: str, *args: str, check: bool = True,
               timeout: float = 60) -> subprocess.CompletedProcess[str]:
        pw = pwd.getpwnam(user)
        env = {"PATH": "/usr/bin:/bin", "HOME": "/", "LANG": "C.UTF-8",
               "GPU_AUDIT_LAUNCHER_SOCKET": str(self.socket), "PYTHONPATH": str(self.repo)}
        # The client process becomes `user` before it connects (the kernel records the
        # peer's credentials at connect). It imports what it needs first: the test venv's
        # interpreter may live under /root, which the user cannot read.
        r = subprocess.run([sys.executable, "-c", _AS_USER, str(pw.pw_uid), str(pw.pw_gid),
                            ",".join(map(str, os.getgrouplist(user, pw.pw_gid))),
                            "launcher", *args],
                           cwd=self.dir, env=env, capture_output=True, text=True,
                           timeout=timeout, check=False)
        if check and r.returncode != 0:
            raise AssertionError(f"launcher {args} as {user}: exit {r.returncode}\n"
                                 f"{r.stdout}{r.stderr}")
        return r

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """A request from the test process itself (root: the daemon treats it as admin)."""
        return call(self.socket, request, timeout=30)

    def job(self, job: int) -> Any:
        return self.ask({"op": "status", "id": job})["job"]

    def wait_state(self, job: int, states: set[str], timeout: float = 60) -> Any:
        return wait_for(lambda: (j := self.job(job))["state"] in states and j,
                        timeout, f"job {job} to reach {states}", step=0.1)
