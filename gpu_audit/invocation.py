"""How to spell a `gpu-audit` command so that it works from where the user stands.

Hints such as "run the simulator instead" must name a command the user can type: after
`make run` in a clone, `gpu-audit` is not on PATH (it lives in the clone's `.venv/bin`),
and `make run ARGS="..."` is the form the user already knows. The Makefile marks its
`run` recipe with MAKE_RUN_ENV so hints for `run` can use that form, and installs of an
extra go into the clone's `.venv`.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

MAKE_RUN_ENV = "GPU_AUDIT_VIA_MAKE_RUN"


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _program() -> str:
    """The shortest spelling of the running `gpu-audit` that works from the cwd."""
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    on_path = shutil.which("gpu-audit")
    if on_path and (not argv0 or _same_file(on_path, argv0)):
        return "gpu-audit"
    if Path(argv0).name == "gpu-audit":
        script = os.path.abspath(argv0)
        rel = os.path.relpath(script)
        if rel.startswith(".."):
            return shlex.quote(script)
        return shlex.quote(rel if os.sep in rel else f".{os.sep}{rel}")
    # `python -m gpu_audit_app` or embedded in another program
    return f"{shlex.quote(sys.executable)} -m gpu_audit_app"


def command(args: str) -> str:
    """The command line for `gpu-audit ARGS` as the user can type it from here."""
    if os.environ.get(MAKE_RUN_ENV) and (args == "run" or args.startswith("run ")):
        rest = args[len("run"):].strip()
        return f'make run ARGS="{rest}"' if rest else "make run"
    return f"{_program()} {args}"


def pip_install(extra: str) -> str:
    """The command that adds gpu-audit's `extra` to the environment this process runs in."""
    if os.environ.get(MAKE_RUN_ENV):
        return f".venv/bin/python -m pip install -e '.[{extra}]'"
    return f"{shlex.quote(sys.executable)} -m pip install 'gpu-audit[{extra}]'"
