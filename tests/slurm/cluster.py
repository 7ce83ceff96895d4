"""A real Slurm cluster on loopback for the tests: munge, MariaDB + slurmdbd, slurmctld and
two slurmd nodes with two simulated GPUs each, all under one temporary directory.

This is the recipe docs/SLURM.md ("A staging cluster on one machine") describes; a site
can run it by hand (`python -m tests.slurm.cluster DIR`) to get the same cluster.

- Every daemon runs in the foreground (`-D`, `-F`) as a child of the test process, on a
  free port of 127.0.0.1, with its state, logs, pid files and sockets under the cluster's
  directory, and is stopped by its own pid (SIGTERM, then SIGKILL) and waited for before
  the directory is removed. Nothing is written outside that directory but two unix
  users (created with useradd, removed by `stop()`).
- munge runs with its own key and socket (`AuthInfo=socket=...`), so it never meets the
  host's munge.
- Two nodes on one host: two `NodeName`s with the host's name as `NodeHostname`,
  `NodeAddr=127.0.0.1` and their own `Port`; `slurmd -N n1` / `-N n2`; `%n` in the spool,
  pid and log paths.
- GPUs: `gres.conf` names character devices `DIR/dev/<node>/nvidia<i>` made with mknod
  (Slurm refuses plain files). Their numbers are those of the kernel's memory devices
  (1:3 /dev/null, 1:5 /dev/zero, 1:7 /dev/full, 1:9 /dev/urandom, one per simulated GPU),
  so a job can open "its GPU" (`exec 9<>"$dev"`) as CUDA would open /dev/nvidiaN: the
  simulator reports a process holding the device open as a process on that GPU
  (exporter/sim/hostprocs.py), so the whole attribution path runs without a GPU.
- Preemption: partition `low` (PriorityTier 1, PreemptMode REQUEUE, GraceTime) and
  `high` (PriorityTier 10); `PreemptType=preempt/partition_prio`; the user's `--signal`
  is sent at preemption too (`SlurmctldParameters=preempt_send_user_signal`).
- Short intervals so the suite stays short: `SchedulerParameters=sched_interval=2`,
  `MinJobAge`, `KillWait`, `MessageTimeout`, `BatchStartTimeout`.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from gpu_audit.slurmcmd import key_values
from tests.polling import WaitTimeout, wait_for
from tests.slurm import config
from tests.slurm.config import CPUS_PER_NODE, DB_NAME, GPUS_PER_NODE, NODES, REPO, gpu_uuid

__all__ = ["CPUS_PER_NODE", "GPUS_PER_NODE", "NODES", "REPO", "ClusterError", "SlurmCluster",
           "User", "gpu_uuid", "missing_binaries", "running"]

# (major, minor) of each simulated GPU's device node: memory devices every kernel has,
# distinct so gres sees distinct devices and each opens like a device.
_DEVICE_NUMBERS = ((1, 3), (1, 5), (1, 7), (1, 9))
ACCOUNTS = ("physics", "vision")
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "sacct",
            "slurmdbd", "sacctmgr", "mariadbd", "mariadb-install-db")


class ClusterError(RuntimeError):
    """The cluster could not be started; the message carries the daemons' last log lines."""


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_LIBC = ctypes.CDLL("libc.so.6", use_errno=True)
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the forked child: SIGTERM when the test process dies, so a killed test run
    leaves no daemon behind (they all run in the foreground as our children). Only a
    prctl(2) call: safe between fork and exec even with threads in the parent."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Daemon:
    """One foreground daemon of ours."""

    name: str
    argv: list[str]
    log: Path
    env: Mapping[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                         env=dict(self.env) if self.env else None,
                                         preexec_fn=_die_with_parent)  # noqa: PLW1509

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, n: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.proc = None


def _wait(pred: Callable[[], bool], timeout: float, what: str,
          daemons: Sequence[Daemon] = (), step: float = 0.1) -> None:
    """wait_for, failing at once (ClusterError) when one of `daemons` exits, and with
    every daemon's log tail when the time runs out."""
    def alive() -> None:
        for d in daemons:
            if d.proc is not None and d.proc.poll() is not None:
                raise ClusterError(f"{d.name} exited with {d.proc.returncode} while waiting "
                                   f"for {what}:\n{d.tail()}")

    try:
        wait_for(pred, timeout, what, step=step, check=alive,
                 detail=lambda: "\n".join(f"--- {d.name}\n{d.tail()}" for d in daemons))
    except WaitTimeout as exc:
        raise ClusterError(str(exc)) from None


def _write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


@dataclass
class User:
    name: str
    uid: int
    gid: int
    account: str


@dataclass
class SlurmCluster:
    """The cluster. `start()` brings everything up (ClusterError says what failed);
    `stop()` stops every daemon it started, by pid, and removes the users."""

    root: Path
    accounting: bool = True
    suffix: str = field(default_factory=lambda: secrets.token_hex(3))
    daemons: list[Daemon] = field(default_factory=list)
    users: list[User] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)
    started: float = 0.0

    # --- paths
    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def shared(self) -> Path:
        """World-writable (sticky) scratch every job user can use: checkpoints, outputs."""
        return self.root / "shared"

    @property
    def cluster_name(self) -> str:
        return f"ga{self.suffix}"

    def device(self, node: str, index: int) -> Path:
        return self.root / "dev" / node / f"nvidia{index}"

    def jobmap_dir(self, node: str) -> Path:
        return self.root / "jobmap" / node

    @property
    def env(self) -> dict[str, str]:
        """The environment Slurm's commands need: this cluster's slurm.conf."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
        env["SLURM_CONF"] = str(self.conf)
        return env

    # --- commands
    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float = 60,
            env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(list(argv), env={**self.env, **(env or {})}, text=True,
                              capture_output=True, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} -> {done.returncode}\n{done.stdout}"
                                 f"\n{done.stderr}")
        return done

    def as_user(self, user: User | None, argv: Sequence[str]) -> list[str]:
        if user is None:
            return list(argv)
        return ["runuser", "-u", user.name, "--", *argv]

    def sbatch(self, script: Path | str, *options: str, user: User | None = None,
               wrapper: Path | None = None, env: Mapping[str, str] | None = None) -> str:
        """Submit `script` (through `wrapper`, e.g. deploy/slurm/sbatch-checkpoint.sh);
        the job id."""
        front = [str(wrapper)] if wrapper is not None else ["sbatch"]
        argv = self.as_user(user, [*front, "--parsable", *options, str(script)])
        done = self.run(argv, env=env)
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict ({} once slurmctld forgot the job)."""
        done = self.run(["scontrol", "-o", "show", "job", job_id], check=False)
        if done.returncode != 0:
            return {}
        return key_values(done.stdout)

    def node(self, name: str) -> dict[str, str]:
        return key_values(self.run(["scontrol", "-o", "show", "node", name]).stdout)

    def wait_job(self, job_id: str, states: Sequence[str], timeout: float = 120,
                 what: str = "") -> dict[str, str]:
        """Wait until the job's state is one of `states`; its record."""
        seen: dict[str, str] = {}

        def reached() -> bool:
            nonlocal seen
            seen = self.job(job_id)
            return seen.get("JobState", "") in states

        try:
            _wait(reached, timeout, what or f"job {job_id} in {states}", self.daemons, 0.25)
        except ClusterError as exc:
            raise AssertionError(f"{exc}\nlast record: {seen}\n{self.logs()}") from None
        return seen

    def logs(self, n: int = 3000) -> str:
        return "\n".join(f"--- {d.name} ({d.log})\n{d.tail(n)}" for d in self.daemons)

    # --- start and stop
    def start(self) -> None:
        self.started = time.time()
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        for sub in ("etc", "log", "run", "state", "spool"):
            (self.root / sub).mkdir(exist_ok=True)
        self.shared.mkdir(exist_ok=True)
        self.shared.chmod(0o1777)
        self._make_devices()
        self._make_users()
        try:
            self._start_munge()
            if self.accounting:
                self._start_mariadb()
            self._write_config()
            if self.accounting:
                self._start_slurmdbd()
                self._register_accounts()
            self._start_slurmctld()
            for node in NODES:
                self._start_slurmd(node)
            _wait(self._nodes_idle, 60, "both nodes idle", self.daemons, 0.25)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        # slurmd first (their steps), then slurmctld, slurmdbd, the database, munge last
        for d in reversed(self.daemons):
            d.stop()
        self.daemons.clear()
        for u in self.users:
            subprocess.run(["userdel", u.name], check=False, capture_output=True, timeout=30)
        self.users.clear()

    # --- pieces
    def _make_devices(self) -> None:
        numbers = iter(_DEVICE_NUMBERS)
        for node in NODES:
            for i in range(GPUS_PER_NODE):
                dev = self.device(node, i)
                dev.parent.mkdir(parents=True, exist_ok=True)
                if not dev.exists():
                    major, minor = next(numbers)
                    os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
                else:
                    next(numbers)
                dev.chmod(0o666)
            self.jobmap_dir(node).mkdir(parents=True, exist_ok=True)

    def _make_users(self) -> None:
        for i, account in enumerate(ACCOUNTS):
            name = f"ga{'ab'[i]}{self.suffix}"
            try:
                pw = pwd.getpwnam(name)
            except KeyError:
                subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", name], check=True,
                               capture_output=True, timeout=30)
                pw = pwd.getpwnam(name)
            self.users.append(User(name, pw.pw_uid, pw.pw_gid, account))

    def _start_munge(self) -> None:
        mdir = self.root / "munge"
        mdir.mkdir(exist_ok=True)
        mdir.chmod(0o700)
        key = mdir / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        self.munge_socket = mdir / "munge.sock"
        d = Daemon("munged", ["munged", "-F", "--force", f"--key-file={key}",
                              f"--socket={self.munge_socket}",
                              f"--pid-file={mdir / 'munged.pid'}",
                              f"--seed-file={mdir / 'munged.seed'}",
                              f"--log-file={mdir / 'munged.log'}", "--num-threads=2"],
                   self.root / "log" / "munged.out")
        d.start()
        self.daemons.append(d)
        # the socket's directory must let job users reach it (srun, sbatch as a user)
        _wait(self.munge_socket.exists, 20, "munged's socket", [d])
        mdir.chmod(0o755)

    def _start_mariadb(self) -> None:
        ddir = self.root / "mariadb"
        data = ddir / "data"
        data.mkdir(parents=True, exist_ok=True)
        self.db_socket = ddir / "mysqld.sock"
        self.ports["mariadb"] = free_port()
        self.db_password = secrets.token_hex(12)
        done = subprocess.run(
            ["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
             "--auth-root-authentication-method=socket", "--skip-test-db"],
            capture_output=True, text=True, timeout=300, check=False)
        if done.returncode != 0:
            raise ClusterError(f"mariadb-install-db failed:\n{done.stdout}\n{done.stderr}")
        d = Daemon("mariadbd", [
            "mariadbd", "--no-defaults", f"--datadir={data}", "--user=root",
            f"--socket={self.db_socket}", "--bind-address=127.0.0.1",
            f"--port={self.ports['mariadb']}", f"--pid-file={ddir / 'mariadbd.pid'}",
            "--skip-log-bin", "--innodb-buffer-pool-size=32M", "--innodb-log-file-size=8M",
            "--innodb-flush-log-at-trx-commit=2", "--skip-name-resolve",
            f"--log-error={ddir / 'error.log'}"], self.root / "log" / "mariadbd.out")
        d.start()
        self.daemons.append(d)
        _wait(self.db_socket.exists, 60, "mariadbd's socket", [d])
        sql = (f"CREATE DATABASE {DB_NAME}; "
               f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{self.db_password}'; "
               f"GRANT ALL ON {DB_NAME}.* TO 'slurm'@'127.0.0.1';")
        _wait(lambda: subprocess.run(["mariadb", f"--socket={self.db_socket}", "-u", "root",
                                      "-e", "SELECT 1"], capture_output=True, check=False,
                                     timeout=30).returncode == 0, 60, "mariadb answering", [d])
        subprocess.run(["mariadb", f"--socket={self.db_socket}", "-u", "root", "-e", sql],
                       check=True, capture_output=True, timeout=60)

    def _write_config(self) -> None:
        self.ports["slurmctld"] = free_port()
        for node in NODES:
            self.ports[node] = free_port()
        if self.accounting:
            self.ports["slurmdbd"] = free_port()
        layout = config.Layout(root=self.root, cluster_name=self.cluster_name,
                               host=socket.gethostname(), ports=dict(self.ports),
                               munge_socket=self.munge_socket,
                               db_password=getattr(self, "db_password", ""),
                               accounting=self.accounting)
        for path, (text, mode) in config.render(layout).items():
            _write(path, text, mode)

    def _start_slurmdbd(self) -> None:
        d = Daemon("slurmdbd", ["slurmdbd", "-D"], self.root / "log" / "slurmdbd.out",
                   env={**self.env, "SLURM_CONF": str(self.conf)})
        d.start()
        self.daemons.append(d)

        def answers() -> bool:
            done = self.run(["sacctmgr", "-n", "-P", "list", "cluster"], check=False,
                            timeout=30)
            return done.returncode == 0

        _wait(answers, 90, "slurmdbd answering sacctmgr", self.daemons, 0.5)

    def _register_accounts(self) -> None:
        self.run(["sacctmgr", "-i", "add", "cluster", self.cluster_name])
        for account in ACCOUNTS:
            self.run(["sacctmgr", "-i", "add", "account", account,
                      f"cluster={self.cluster_name}"])
        for u in self.users:
            self.run(["sacctmgr", "-i", "add", "user", u.name, f"account={u.account}",
                      f"cluster={self.cluster_name}"])
        self.run(["sacctmgr", "-i", "add", "user", "root", f"account={ACCOUNTS[0]}",
                  f"cluster={self.cluster_name}"])

    def _start_slurmctld(self) -> None:
        d = Daemon("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)],
                   self.root / "log" / "slurmctld.out", env=self.env)
        d.start()
        self.daemons.append(d)
        _wait(lambda: self.run(["scontrol", "ping"], check=False, timeout=20).returncode == 0,
              60, "slurmctld answering", self.daemons, 0.25)

    def _start_slurmd(self, node: str) -> None:
        d = Daemon(f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", str(self.conf)],
                   self.root / "log" / f"slurmd-{node}.out", env=self.env)
        d.start()
        self.daemons.append(d)

    def _nodes_idle(self) -> bool:
        done = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False, timeout=20)
        states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
        return all(states.get(n) == "idle" for n in NODES)


@contextmanager
def running(root: Path, accounting: bool = True) -> Iterator[SlurmCluster]:
    cluster = SlurmCluster(root, accounting=accounting)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


if __name__ == "__main__":  # a staging cluster by hand: python -m tests.slurm.cluster DIR
    where = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/gpu-audit-slurm")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop() runs on the way out
    with running(where) as c:
        print(f"cluster {c.cluster_name} up: export SLURM_CONF={c.conf}", flush=True)
        with suppress(KeyboardInterrupt):
            signal.pause()
