"""What a GPU process runs: the CUDA runtime and framework libraries it has mapped, and
the container image its environment names.

Read from /proc/<pid>/maps once per process lifetime (the resolver caches it with the
process's other /proc facts under (pid, start time)) and recorded only in the
`process_start` audit event (docs/ATTRIBUTION.md, "What a process runs"). A shared
library's file name often carries its version: the CUDA toolkit installs
libcudart.so.12.4.127 (maps shows the file, not the libcudart.so.12 link to it), NCCL
libnccl.so.2.21.5, cuDNN libcudnn.so.9, auditwheel-renamed copies inside wheels
libcudart-1a2b3c4d.so.12. Only library names in `LIBRARIES` are recognised and a
version is digits and dots only, so nothing a job chose (its paths, its own library
names) reaches a record: what is recorded is always one of a few dozen names and a
short dotted number.

The image comes from the environment Apptainer and Singularity set inside a container
(APPTAINER_NAME / SINGULARITY_NAME: the image's name) or a site's CONTAINER_IMAGE (the
keys the launcher's job fingerprint reads), only when it is an image reference (letters,
digits and ._:/@+- , at most 200 characters); no other source on these hosts knows the
image (docs/ATTRIBUTION.md).

The maps file and the environment belong to a job and are hostile input: this module
parses bytes it is given and must never raise on garbage (odd lines are simply not
matched), never keep or log the text, and never return a name, version or image outside
the allow-list and charset, nor any environment key's value but the image keys'.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gpu_audit.model.attribution import Software

# File name stem -> the short name recorded. The driver's user-space library (libcuda)
# carries the driver version; the rest are the runtime, math and communication
# libraries and the frameworks' own shared objects.
LIBRARIES: Mapping[str, str] = {
    "libcuda": "cuda",
    "libcudart": "cudart",
    "libcublas": "cublas",
    "libcublasLt": "cublaslt",
    "libcudnn": "cudnn",
    "libnccl": "nccl",
    "libcufft": "cufft",
    "libcurand": "curand",
    "libcusparse": "cusparse",
    "libcusolver": "cusolver",
    "libnvrtc": "nvrtc",
    "libnvinfer": "tensorrt",
    "libtorch": "torch",
    "libtorch_cuda": "torch_cuda",
    "libtensorflow_framework": "tensorflow",
    "libonnxruntime": "onnxruntime",
}
SHORT_NAMES: frozenset[str] = frozenset(LIBRARIES.values())
# Keyed by the stem without "lib", which the pattern below matches as a literal prefix.
_BY_STEM = {stem.encode()[3:]: short for stem, short in LIBRARIES.items()}

MAX_VERSION_PARTS = 4
MAX_VERSION_PART_DIGITS = 8
# A version as recorded: 1-4 dot-separated numbers of at most 8 digits (<= 35 chars).
VERSION_PATTERN = r"^[0-9]{1,8}(\.[0-9]{1,8}){0,3}$"
_VERSION = re.compile(VERSION_PATTERN)

# One mapped file whose base name is a recognised library: `/lib<stem>[-<8 hex>].so[.N...]`
# at the end of a line (the kernel appends " (deleted)" to a file removed since it was
# mapped). Longer stems first, so libcudart is not read as libcuda + "rt". The literal
# "/lib" prefix lets the regex engine skip to candidates (~25 % faster than "/(lib...)").
_STEMS = b"|".join(re.escape(s) for s in sorted(_BY_STEM, key=len, reverse=True))
_MAPPED = re.compile(
    rb"/lib(" + _STEMS + rb")(?:-[0-9a-f]{8})?\.so((?:\.[0-9]{1,8}){0,4})(?: \(deleted\))?$",
    re.MULTILINE,
)


def _rank(version: str) -> tuple[int, tuple[int, ...]]:
    parts = tuple(int(p) for p in version.split("."))
    return len(parts), parts


def parse_maps(data: bytes, *, complete: bool = True) -> Software | None:
    """The recognised libraries mapped in `data` (a /proc/<pid>/maps text), or None
    when there are none. `complete=False`: `data` was cut at a byte limit, so its last
    line may be partial and is ignored.

    When one library is mapped in several versions (a wheel's private copy beside the
    system's), the most precise version wins (most numbers), then the highest.
    """
    if not complete:
        cut = data.rfind(b"\n")
        data = data[: cut + 1] if cut >= 0 else b""
    loaded: set[str] = set()
    versions: dict[str, str] = {}
    # findall and a set: a library has several mappings (one line each), and a hostile
    # process may map one file thousands of times; only distinct names cost Python work.
    for stem, suffix in set(_MAPPED.findall(data)):
        short = _BY_STEM[stem]
        loaded.add(short)
        if not suffix:
            continue
        version = suffix[1:].decode("ascii")
        old = versions.get(short)
        if old is None or _rank(version) > _rank(old):
            versions[short] = version
    if not loaded:
        return None
    return Software(loaded=tuple(sorted(loaded)), libraries=versions)


IMAGE_ENVIRON_KEYS: tuple[str, ...] = ("APPTAINER_NAME", "SINGULARITY_NAME", "CONTAINER_IMAGE")
IMAGE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}$"
_IMAGE = re.compile(IMAGE_PATTERN.encode())
_IMAGE_KEYS = tuple(k.encode() + b"=" for k in IMAGE_ENVIRON_KEYS)


def image_from_environ(buffer: bytes, *, complete: bool = True) -> str:
    """The container image a NUL-separated environ buffer names, or "". The first key
    of IMAGE_ENVIRON_KEYS present wins (the first occurrence of it, as getenv); a value
    that is not an image reference gives nothing rather than a cleaned guess."""
    entries = buffer.split(b"\0")
    if not complete:
        entries = entries[:-1]
    found: dict[bytes, bytes] = {}
    for entry in entries:
        if entry.startswith(_IMAGE_KEYS):
            key, _, value = entry.partition(b"=")
            found.setdefault(key, value)
    for key in _IMAGE_KEYS:
        named = found.get(key[:-1])
        if named is not None:
            return named.decode("ascii") if _IMAGE.fullmatch(named) else ""
    return ""


def valid_version(version: str) -> bool:
    """Whether `version` is a version as this module records them (digits and dots)."""
    return _VERSION.fullmatch(version) is not None


def file_name(short: str, version: str = "") -> str:
    """The file name a library `short` of `version` has on disk (the simulator writes
    it into a fake maps file): file_name("cudart", "12.4.127") -> libcudart.so.12.4.127."""
    for stem, name in LIBRARIES.items():
        if name == short:
            return f"{stem}.so.{version}" if version else f"{stem}.so"
    raise KeyError(short)
