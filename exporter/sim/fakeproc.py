"""Build a realistic fake procfs tree from simulated processes.

For `--backend sim` runs and tests: the simulator gives each ProcessSample a
ProcessIdentity (uid, start time, environment, cgroup path), and this module writes what
the kernel would show for it under <root>/<pid>/ (stat, status, environ, cgroup, comm,
cmdline, and maps listing the libraries the scenario says it loaded) plus <root>/stat
with the boot time, so the Resolver reads simulated processes
through exactly the code path it uses on a real host. It must never be pointed at a real
/proc (it refuses a root that holds a live kernel's self/ link) and never writes outside
`root`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from exporter.attribution.software import file_name
from gpu_audit.model.samples import GpuSample, ProcessIdentity, ProcessSample

DEFAULT_BOOT_TIME = 1_700_000_000.0


def _comm(name: str, pid: int) -> str:
    # The kernel keeps 15 characters of the executable's base name (TASK_COMM_LEN 16).
    base = os.path.basename(name.rstrip("/")) or f"proc{pid}"
    return base.replace("\n", " ")[:15]


def _stat_line(pid: int, comm: str, start_ticks: int) -> str:
    # Fields 1..24 of proc(5) stat; field 22 is starttime. The rest are plausible zeros.
    fields = [
        str(pid), f"({comm})", "S", "1", str(pid), str(pid), "0", "-1", "4194560",
        "0", "0", "0", "0", "0", "0", "0", "0", "20", "0", "1", "0",
        str(start_ticks), "0", "0",
    ]  # fmt: skip
    return " ".join(fields) + "\n"


def _status(comm: str, pid: int, uid: int | None) -> str:
    lines = [f"Name:\t{comm}", "Umask:\t0022", "State:\tS (sleeping)", f"Tgid:\t{pid}",
             f"Pid:\t{pid}", "PPid:\t1"]  # fmt: skip
    if uid is not None:
        lines.append(f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}")
        lines.append(f"Gid:\t{uid}\t{uid}\t{uid}\t{uid}")
    lines.append("Threads:\t1")
    return "\n".join(lines) + "\n"


def _maps(exe: str, ident: ProcessIdentity | None) -> bytes:
    """A maps file as the kernel shows it for a process that loaded the identity's
    libraries (each library's file under a CUDA toolkit or wheel directory), between its
    executable and libc."""
    lines = [f"{exe if exe.startswith('/') else '/usr/bin/' + exe}"]
    for short, version in sorted((ident.software if ident else {}).items()):
        where = "/opt/venv/lib/python3.12/site-packages/torch/lib" if short.startswith(
            "torch") else "/usr/local/cuda/lib64"
        lines.append(f"{where}/{file_name(short, version)}")
    lines.append("/usr/lib/x86_64-linux-gnu/libc.so.6")
    out: list[str] = []
    addr = 0x400000
    for path in lines:
        # start-end perms offset dev inode path: one read-only and one executable mapping
        for perms in ("r--p", "r-xp"):
            out.append(f"{addr:08x}-{addr + 0x1000:08x} {perms} 00000000 08:01 {1000 + len(out)}"
                       f"{' ' * 19}{path}\n")
            addr += 0x1000
    out.append(f"{addr:08x}-{addr + 0x21000:08x} rw-p 00000000 00:00 0{' ' * 26}[heap]\n")
    return "".join(out).encode("utf-8", errors="surrogateescape")


def _write_if_changed(path: Path, data: bytes) -> None:
    try:
        if path.read_bytes() == data:
            return
    except FileNotFoundError:
        pass
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_fake_proc(
    root: Path,
    processes: Iterable[ProcessSample],
    *,
    boot_time: float = DEFAULT_BOOT_TIME,
    prune: bool = False,
) -> set[int]:
    """Write (or update) <root>/<pid>/... for each process; return the pids written.

    A process without an identity gets only what its ProcessSample says (name, uid), a
    cgroup at the v2 root and an empty environment. With `prune`, pid directories of
    processes not given are removed, as the kernel does when a process exits.
    """
    if (root / "self").is_symlink():
        raise ValueError(f"{root} looks like a real procfs; refusing to write to it")
    root.mkdir(parents=True, exist_ok=True)
    _write_if_changed(root / "stat", f"cpu  0 0 0 0 0 0 0 0 0 0\nbtime {int(boot_time)}\n".encode())
    written: set[int] = set()
    for proc in processes:
        pid = proc.pid
        if pid in written:
            continue  # the same process on several GPUs
        ident = proc.identity
        uid = ident.uid if ident is not None and ident.uid is not None else proc.uid
        start = ident.start_time_ticks if ident and ident.start_time_ticks is not None else None
        if start is None:
            start = 1000 + pid  # stable across calls, so the resolver's cache holds
        comm = _comm(proc.name, pid)
        environ = b"".join(
            f"{k}={v}".encode("utf-8", errors="surrogateescape") + b"\0"
            for k, v in (ident.environ.items() if ident else ())
        )
        cgroup = ident.cgroup if ident and ident.cgroup else "0::/"
        pid_dir = root / str(pid)
        pid_dir.mkdir(exist_ok=True)
        _write_if_changed(pid_dir / "stat", _stat_line(pid, comm, start).encode())
        _write_if_changed(pid_dir / "status", _status(comm, pid, uid).encode())
        _write_if_changed(pid_dir / "comm", (comm + "\n").encode())
        _write_if_changed(pid_dir / "cmdline", (proc.name or comm).encode() + b"\0")
        _write_if_changed(pid_dir / "environ", environ)
        _write_if_changed(pid_dir / "cgroup", (cgroup.rstrip("\n") + "\n").encode())
        _write_if_changed(pid_dir / "maps", _maps(proc.name or comm, ident))
        written.add(pid)
    if prune:
        for child in root.iterdir():
            if child.name.isdigit() and int(child.name) not in written and child.is_dir():
                shutil.rmtree(child)
    return written


class SimProcfs:
    """A fake /proc mirroring the simulated processes, so attribution runs for real on
    simulated data (the demo shows users, projects and jobs). Lives in a temporary
    directory that `remove()` deletes; the simulator's harness uses it only when the
    configured procfs root is the default /proc."""

    def __init__(self) -> None:
        self._base = Path(tempfile.mkdtemp(prefix="gpu-audit-simproc-"))
        self.root = self._base / "proc"
        self.root.mkdir()
        # An empty user database: simulated uids must not borrow this host's user names,
        # so the owner source answers "uid:<n>" unless the scenario's environ says more.
        self.passwd = self._base / "passwd"
        self.passwd.write_text("")

    def update(self, gpus: Sequence[GpuSample]) -> None:
        write_fake_proc(self.root, (p for g in gpus for p in g.processes), prune=True)

    def remove(self) -> None:
        shutil.rmtree(self._base, ignore_errors=True)
