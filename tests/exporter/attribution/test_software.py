"""What a GPU process runs: the libraries in its /proc/<pid>/maps, read once per process.

Real processes (a child that loaded fake CUDA libraries built here with `cc -shared`,
one of them running as another unix user) read through the real /proc; hostile maps
files (huge, odd names, a FIFO, a symlink) through a fake tree.
"""

from __future__ import annotations

import logging
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.attribution import procfs
from exporter.attribution import resolver as resolver_module
from exporter.attribution.resolver import Resolver
from exporter.attribution.software import (
    IMAGE_PATTERN,
    LIBRARIES,
    SHORT_NAMES,
    VERSION_PATTERN,
    file_name,
    image_from_environ,
    parse_maps,
    valid_version,
)
from gpu_audit.audit.schema import record_schema
from gpu_audit.model.attribution import Software
from gpu_audit.model.samples import ProcessSample
from tests.exporter.attribution.helpers import GPU0, config, gpu, make_tree, proc, resolver

FAKE_LIBS = ("libcudart.so.12.4.127", "libnccl.so.2.21.5", "libcudnn.so.9")


def _build_libs(directory: Path) -> list[Path]:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc/gcc) to build the fake CUDA libraries")
    src = directory / "fake.c"
    src.write_text("int gpu_audit_fake_symbol(void) { return 12; }\n")
    out = []
    for name in FAKE_LIBS:
        target = directory / name
        subprocess.run([cc, "-shared", "-fPIC", "-o", str(target), str(src)], check=True,
                       timeout=60, capture_output=True)
        target.chmod(0o755)
        out.append(target)
    return out


_CHILD = (
    "import ctypes, sys\n"
    "for path in sys.argv[1:]:\n"
    "    ctypes.CDLL(path)\n"
    "print('loaded', flush=True)\n"
    "sys.stdin.read()\n"
)


@pytest.fixture
def lib_dir() -> Iterator[Path]:
    # Not pytest's tmp_path: another user's process must be able to load from it.
    d = Path(tempfile.mkdtemp(prefix="gpu-audit-fakecuda-", dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _spawn(python: str, libs: list[Path], **kwargs: object) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [python, "-c", _CHILD, *map(str, libs)], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True, **kwargs,  # type: ignore[call-overload]
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    if line.strip() != "loaded":
        child.kill()
        child.wait(timeout=10)
        pytest.fail(f"the child did not load the fake libraries (said {line!r})")
    return child


def _stop(child: subprocess.Popen[str]) -> None:
    assert child.stdin is not None
    child.stdin.close()
    child.wait(timeout=10)


def _real_resolver(tmp_path: Path) -> Resolver:
    return resolver(config(tmp_path, procfs_root=Path("/proc")))


def test_real_process_with_fake_cuda_libraries(tmp_path: Path, lib_dir: Path) -> None:
    """A real child that loaded libcudart.so.12.4.127, libnccl.so.2.21.5 and
    libcudnn.so.9 (built here) is fingerprinted through the real /proc."""
    child = _spawn(sys.executable, _build_libs(lib_dir))
    try:
        r = _real_resolver(tmp_path)
        sample = ProcessSample(pid=child.pid, name="python", uid=os.getuid())
        (ap,) = r.attribute([gpu(GPU0, sample)])[GPU0]
    finally:
        _stop(child)
    assert ap.software == Software(
        loaded=("cudart", "cudnn", "nccl"),
        libraries={"cudart": "12.4.127", "nccl": "2.21.5", "cudnn": "9"},
    )
    assert r.stats()["software_reads"] == 1


@pytest.fixture
def other_user() -> Iterator[tuple[int, int]]:
    if os.geteuid() != 0:
        pytest.skip("needs root: creates a local user with useradd")
    name = f"gpa-sw-{secrets.token_hex(3)}"
    subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", name], check=True,
                   timeout=30, capture_output=True)
    try:
        pw = pwd.getpwnam(name)
        yield pw.pw_uid, pw.pw_gid
    finally:
        subprocess.run(["userdel", name], check=False, timeout=30, capture_output=True)


def test_process_of_another_unix_user(tmp_path: Path, lib_dir: Path,
                                      other_user: tuple[int, int]) -> None:
    """The exporter runs as root: another user's process is fingerprinted too, and its
    owner is still attributed."""
    uid, gid = other_user
    python = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3")
                   if Path(p).exists()), None)
    if python is None:
        pytest.skip("no python3 that another user can execute")
    child = _spawn(python, _build_libs(lib_dir), user=uid, group=gid, extra_groups=[],
                   cwd="/")
    try:
        r = _real_resolver(tmp_path)
        sample = ProcessSample(pid=child.pid, name="python3")
        (ap,) = r.attribute([gpu(GPU0, sample)])[GPU0]
    finally:
        _stop(child)
    assert ap.software is not None and ap.software.libraries["cudart"] == "12.4.127"
    assert ap.attribution.sources["user"] == "owner"


def test_denied_maps_is_quiet_and_changes_no_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """EACCES on maps (an exporter without ptrace read access) leaves software absent,
    counted quietly; the attribution is what it would have been."""
    caplog.set_level(logging.DEBUG)
    p = proc(8, environ={"USER": "carol"})
    make_tree(tmp_path / "proc", p)
    real_open = os.open

    def guarded_open(path: str, flags: int, *args: int, **kwargs: int) -> int:
        if str(path) == "maps":
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(procfs.os, "open", guarded_open)
    r = resolver(config(tmp_path))
    (ap,) = r.attribute([gpu(GPU0, p)])[GPU0]
    assert ap.software is None
    assert (ap.attribution.user, ap.attribution.sources["user"]) == ("carol", "environ")
    assert r.stats()["software_denied"] == 1
    assert not [rec for rec in caplog.records if rec.levelno >= logging.WARNING]


def _count_maps_opens(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    opened: list[int] = []
    real_open = os.open

    def counting_open(path: str, flags: int, *args: int, **kwargs: int) -> int:
        if str(path) == "maps":
            opened.append(1)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(procfs.os, "open", counting_open)
    return opened


def test_maps_read_once_per_process_across_cycles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """100 cycles of one process read its maps once; the same Software object is
    handed out each cycle. A reused pid (new start time) is a new process: read again."""
    root = tmp_path / "proc"
    p = proc(9, start=100, software={"cudart": "12.4.127"})
    make_tree(root, p)
    opened = _count_maps_opens(monkeypatch)
    r = resolver(config(tmp_path))
    seen = {id(r.attribute([gpu(GPU0, p)])[GPU0][0].software) for _ in range(100)}
    assert len(opened) == 1 and len(seen) == 1
    reused = proc(9, start=200, software={"cudart": "11.8.89"})
    os.utime(root / "9" / "stat", (1, 1))  # older than the racy window either way
    make_tree(root, reused)
    (ap,) = r.attribute([gpu(GPU0, reused)])[GPU0]
    assert len(opened) == 2
    assert ap.software is not None and ap.software.libraries == {"cudart": "11.8.89"}


def test_software_off_reads_no_maps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`attribution.software: false` never opens a maps file."""
    p = proc(9)
    make_tree(tmp_path / "proc", p)
    opened = _count_maps_opens(monkeypatch)
    (ap,) = resolver(config(tmp_path, software=False)).attribute([gpu(GPU0, p)])[GPU0]
    assert ap.software is None and not opened


def _maps_line(path: str | bytes) -> bytes:
    raw = path.encode() if isinstance(path, str) else path
    return b"7f0000000000-7f0000001000 r-xp 00000000 08:01 42          " + raw + b"\n"


def test_huge_maps_file_is_capped_counted_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Only maps_max_bytes are read: a library listed before the cap is seen, one after
    it is not; a line cut by the cap is ignored; two capped processes count twice and
    log once."""
    root = tmp_path / "proc"
    procs = [proc(10), proc(11)]
    make_tree(root, *procs)
    filler = _maps_line("/usr/lib/x86_64-linux-gnu/libsomething.so.1") * 40_000  # ~4 MiB
    for p in procs:
        (root / str(p.pid) / "maps").write_bytes(
            _maps_line("/usr/local/cuda/lib64/libcudart.so.12.4.127") + filler
            + _maps_line("/usr/local/cuda/lib64/libnccl.so.2.21.5"))
    r = resolver(config(tmp_path, maps_max_bytes=1024 * 1024))
    with caplog.at_level(logging.WARNING):
        out = r.attribute([gpu(GPU0, *procs)])[GPU0]
    for ap in out:
        assert ap.software == Software(loaded=("cudart",), libraries={"cudart": "12.4.127"})
    assert r.stats()["software_truncated"] == 2
    assert len([rec for rec in caplog.records if "maps_max_bytes" in rec.getMessage()]) == 1
    # A cut line is not read as a version: the cap falls inside "libnccl.so.2.21.5".
    text = _maps_line("/x/libcudart.so.12") + _maps_line("/x/libnccl.so.2.21.5")
    cut = text.index(b".21.5")
    assert parse_maps(text[:cut], complete=False) == Software(("cudart",), {"cudart": "12"})


HOSTILE = [
    (b"/x/libcudart.so.12.4.127.evil", None),
    (b"/x/libcudart.so.1\x1b[31m", None),
    (b"/x/libcudart.so.123456789", None),  # a version part over 8 digits
    (b"/x/libcudart.so.1.2.3.4.5", None),  # over 4 parts
    (b"/x/libcudartX.so.1", None),
    (b"/x/libcudnn_ops.so.9", None),
    (b"/x/libCUDART.so.12", None),
    (b"/x/not-libcudart.so.12", None),
    (b"libcudart.so.12", None),  # no directory: not a mapped file's path
    (b"/x/\xff\xfe/libcudart.so.\xff12", None),
    (b"/x/libnccl.so.2.21.5 (deleted)", Software(("nccl",), {"nccl": "2.21.5"})),
    (b"/x/libcudart-1a2b3c4d.so.12", Software(("cudart",), {"cudart": "12"})),
    (b"/x/torch/lib/libtorch_cuda.so", Software(("torch_cuda",), {})),
    (b"/x/y z/libcuda.so.550.54.15", Software(("cuda",), {"cuda": "550.54.15"})),
]


@pytest.mark.parametrize(("path", "expected"), HOSTILE, ids=[repr(p) for p, _ in HOSTILE])
def test_odd_names(path: bytes, expected: Software | None) -> None:
    """Only allow-listed library names with a dotted numeric version are recognised."""
    assert parse_maps(_maps_line(path)) == expected


def test_several_versions_the_most_precise_then_highest_wins() -> None:
    """A wheel's private copy beside the toolkit's: the most precise version, then the
    highest, whatever the order in the file."""
    lines = [_maps_line(f"/a/{n}") for n in (
        "libcudart.so.12", "libcudart.so.12.4.127", "libcudart.so.12.1.105", "libcudart.so.11")]
    for order in (lines, lines[::-1]):
        assert parse_maps(b"".join(order)) == Software(("cudart",), {"cudart": "12.4.127"})


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2000), st.lists(st.sampled_from(sorted(LIBRARIES)), max_size=4),
       st.text(alphabet="0123456789.-abc\n\x00 ", max_size=20))
def test_garbage_never_raises_nor_leaks(junk: bytes, stems: list[str], tail: str) -> None:
    """Whatever the bytes, the result names only allow-listed libraries with versions
    of digits and dots."""
    data = junk + b"".join(_maps_line(f"/{s}.so.{tail}".encode()) for s in stems) + junk
    sw = parse_maps(data)
    if sw is not None:
        assert set(sw.loaded) <= SHORT_NAMES and list(sw.loaded) == sorted(sw.loaded)
        assert set(sw.libraries) <= set(sw.loaded)
        assert all(valid_version(v) and len(v) <= 35 for v in sw.libraries.values())


def test_a_fifo_maps_does_not_hang_and_a_symlink_is_not_followed(tmp_path: Path) -> None:
    """In a fake tree (a mount a job could write to) a FIFO named maps, a maps symlink
    to a file that lists libraries, and a pid directory that is a symlink give no
    software, counted, and the processes are still attributed."""
    root = tmp_path / "proc"
    fifo, link, linked_dir = proc(20), proc(21), proc(22)
    make_tree(root, fifo, link, linked_dir)
    (root / "20" / "maps").unlink()
    os.mkfifo(root / "20" / "maps")
    decoy = tmp_path / "decoy"
    decoy.write_bytes(_maps_line("/x/libcudart.so.12.4.127"))
    (root / "21" / "maps").unlink()
    (root / "21" / "maps").symlink_to(decoy)
    (root / "22" / "maps").write_bytes(_maps_line("/x/libcudart.so.12.4.127"))
    real_dir = tmp_path / "elsewhere"
    (root / "22").rename(real_dir)
    (root / "22").symlink_to(real_dir)
    r = resolver(config(tmp_path))
    out = r.attribute([gpu(GPU0, fifo, link, linked_dir)])[GPU0]
    assert [ap.software for ap in out] == [None, None, None]
    assert all(ap.attribution.user == "alice" for ap in out)
    # The FIFO (not a regular file) and the symlink (ELOOP) are errors; the linked pid
    # directory fails O_DIRECTORY|O_NOFOLLOW with ENOTDIR, which reads as vanished.
    stats = r.stats()
    assert (stats["software_errors"], stats["proc_vanished"]) == (2, 1)


def test_maps_of_a_reused_pid_is_not_read(tmp_path: Path) -> None:
    """read_maps checks the start time through the pid directory's descriptor: a pid
    that now belongs to another process reads as vanished."""
    root = tmp_path / "proc"
    make_tree(root, proc(30, start=500))
    with pytest.raises(procfs.ProcError) as err:
        procfs.read_maps(str(root), 30, 499, 4096)
    assert err.value.kind == procfs.VANISHED
    assert procfs.read_maps(str(root), 30, 500, 4096)[1] is True


def test_valid_version_is_whole() -> None:
    assert valid_version("12.4.127") and not valid_version("12.4.127\n")
    assert not valid_version("12.") and not valid_version("1.2.3.4.5")


def test_file_name_round_trips_through_the_parser() -> None:
    """What the simulator writes for a short name is read back as that name."""
    for short in SHORT_NAMES:
        assert parse_maps(_maps_line("/lib/" + file_name(short, "1.2"))) == Software(
            (short,), {short: "1.2"})
        assert parse_maps(_maps_line("/lib/" + file_name(short))) == Software((short,), {})


def test_schema_names_exactly_the_recognised_libraries() -> None:
    """The record schema's allow-list and version pattern are the parser's."""
    sw = record_schema()["properties"]["software"]["properties"]
    assert set(sw["loaded"]["items"]["enum"]) == SHORT_NAMES
    assert set(sw["libraries"]["propertyNames"]["enum"]) == SHORT_NAMES
    assert sw["libraries"]["additionalProperties"]["pattern"] == VERSION_PATTERN
    assert sw["image"]["pattern"] == IMAGE_PATTERN


def test_container_image_from_the_environment(tmp_path: Path) -> None:
    """Apptainer's APPTAINER_NAME (or SINGULARITY_NAME, CONTAINER_IMAGE) names the
    image, with or without libraries; a value that is not an image reference gives
    none; other keys stay unread; off with `software: false` or without the environ
    source."""
    root = tmp_path / "proc"
    with_libs = proc(40, environ={"APPTAINER_NAME": "pytorch_24.04-py3.sif", "TOKEN": "s3cr3t"},
                     software={"cudart": "12.4.127"})
    image_only = proc(41, environ={"CONTAINER_IMAGE": "nvcr.io/nvidia/pytorch:24.01-py3"})
    hostile = proc(42, environ={"SINGULARITY_NAME": "x\x1b[31m; rm -rf /"})
    too_long = proc(43, environ={"APPTAINER_NAME": "a" * 201})
    procs = (with_libs, image_only, hostile, too_long)
    make_tree(root, *procs)
    out = resolver(config(tmp_path)).attribute([gpu(GPU0, *procs)])[GPU0]
    assert [ap.software for ap in out] == [
        Software(("cudart",), {"cudart": "12.4.127"}, "pytorch_24.04-py3.sif"),
        Software(image="nvcr.io/nvidia/pytorch:24.01-py3"), None, None]
    assert out[0].software is not None and "s3cr3t" not in repr(out[0].software)
    for cfg in (config(tmp_path, software=False),
                config(tmp_path, sources=("jobmap", "cgroup", "owner"))):
        (ap,) = resolver(cfg).attribute([gpu(GPU0, image_only)])[GPU0]
        assert ap.software is None


@pytest.mark.parametrize(("buffer", "image"), [
    (b"APPTAINER_NAME=a.sif\0SINGULARITY_NAME=b.sif\0", "a.sif"),
    (b"SINGULARITY_NAME=b.sif\0APPTAINER_NAME=a.sif\0", "a.sif"),  # key order, not file
    (b"APPTAINER_NAME=a.sif\0APPTAINER_NAME=z.sif\0", "a.sif"),  # first, as getenv
    (b"XAPPTAINER_NAME=a.sif\0", ""),
    (b"APPTAINER_NAME=\0", ""),
    (b"APPTAINER_NAME=-leading-dash\0", ""),
    (b"APPTAINER_NAME=caf\xc3\xa9.sif\0", ""),
    (b"APPTAINER_NAME=a.sif\n\0", ""),  # "$" would match before a final newline
    (b"APPTAINER_NAME=cut", ""),  # checked with complete=False below
])
def test_image_values(buffer: bytes, image: str) -> None:
    complete = not buffer.endswith(b"cut")
    assert image_from_environ(buffer, complete=complete) == image


def test_a_bug_in_the_fingerprint_never_costs_attribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should parsing the maps file or the image ever raise, the process is attributed
    as before, software is absent and the failure is counted."""
    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(resolver_module, "parse_maps", broken)
    monkeypatch.setattr(resolver_module, "image_from_environ", broken)
    p = proc(50, environ={"USER": "carol", "APPTAINER_NAME": "a.sif"},
             software={"cudart": "12.4.127"})
    make_tree(tmp_path / "proc", p)
    r = resolver(config(tmp_path))
    (ap,) = r.attribute([gpu(GPU0, p)])[GPU0]
    assert ap.software is None and ap.attribution.user == "carol"
    assert r.stats()["software_errors"] == 2 and r.stats()["attribution_errors"] == 0
