"""The process that reads submissions (YAML) for the daemon: `python -m launcher.parseworker`.

Reading a submission is the one request whose cost grows with what a user sends (a
megabyte of YAML takes seconds of pure-Python parsing), so the daemon never does it on
its loop: it hands the text to this process (launcher/submissions.py) and goes on
serving. Here, each request is one frame on stdin and its answer one frame on stdout
(a 4-byte big-endian length, then JSON): `{"text", "source", "levels"}` in (`levels`:
the urgency level names the daemon defines), `{"specs": [...]}`
(each a JobSpec as JSON) or `{"problems": [...]}` out.

Before reading anything it gives up every privilege it can (uid and gid `nobody`, no
groups, when it starts as root or with CAP_SETUID/CAP_SETGID) and caps its memory: a
parser bug must not land as root, and a pathological document ends in MemoryError, not
in the node's OOM killer. This module must never touch a file or a socket: text in,
answer out.
"""

from __future__ import annotations

import os
import resource
import struct
import sys
from typing import Any, BinaryIO

import orjson

from gpu_audit.errors import ConfigError
from launcher.privileges import can_switch_users
from launcher.spec import expansion_problems, load_submission

NOBODY = 65534
_FRAME = struct.Struct(">I")
MAX_FRAME = 64 << 20


def read_frame(stream: BinaryIO) -> bytes | None:
    """One frame (None at the end of the stream)."""
    head = stream.read(_FRAME.size)
    if len(head) < _FRAME.size:
        return None
    (size,) = _FRAME.unpack(head)
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes")
    data = stream.read(size)
    if len(data) < size:
        return None
    return data


def frame(doc: dict[str, Any]) -> bytes:
    data = orjson.dumps(doc)
    return _FRAME.pack(len(data)) + data


def _give_up_privileges() -> None:
    if can_switch_users() and os.geteuid() != NOBODY:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    vm = 0
    for line in open("/proc/self/status"):  # noqa: SIM115 - a kernel file, read once
        if line.startswith("VmSize:"):
            vm = int(line.split()[1]) * 1024
    limit = vm + (1 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def answer(text: str, source: str, levels: list[str] | None = None,
           max_expanded: int | None = None) -> dict[str, Any]:
    try:
        specs = load_submission(text, source=source, levels=levels)
        if max_expanded is not None:
            # here, in the capped worker: an expanded submission past the limit never
            # reaches the daemon's memory
            too_big = expansion_problems(specs, max_expanded)
            if too_big:
                return {"problems": too_big}
    except ConfigError as exc:
        return {"problems": list(exc.problems)}
    except MemoryError:
        return {"problems": ["the submission is too large to read"]}
    except RecursionError:
        return {"problems": ["the submission is nested too deeply to read"]}
    return {"specs": [s.model_dump(mode="json") for s in specs]}


def main() -> int:
    _give_up_privileges()  # everything it needs is imported above, as the daemon's user
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        data = read_frame(stdin)
        if data is None:
            return 0
        request = orjson.loads(data)
        levels = request.get("levels")
        limit = request.get("max_expanded")
        result = answer(str(request.get("text", "")), str(request.get("source", "")),
                        [str(v) for v in levels] if isinstance(levels, list) else None,
                        limit if isinstance(limit, int) else None)
        stdout.write(frame(result))
        stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
