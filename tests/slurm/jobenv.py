"""How the test cluster's jobs run Python (shared by tests/slurm/conftest.py and
bench/bench_slurm_preempt.py): a copy of gpu_audit_ckpt, the examples, the user-side
Slurm wrappers and usegpu.py in the cluster's shared directory, and an interpreter the
job users can execute with numpy (and torch where installed) on its path."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from tests.slurm.cluster import REPO, SlurmCluster, User


@dataclass
class JobEnv:
    """How a job runs Python: an interpreter its user can execute, and a PYTHONPATH with
    numpy (and torch where installed) and a copy of gpu_audit_ckpt and the examples."""

    python: str
    code: Path
    env: dict[str, str]
    as_root: bool  # the job users cannot reach a Python with numpy: jobs run as root

    def user(self, user: User) -> User | None:
        return None if self.as_root else user

    def script(self, cluster: SlurmCluster, name: str, body: str) -> Path:
        path = cluster.shared / name
        path.write_text("#!/bin/bash\n" + textwrap.dedent(body))
        path.chmod(0o755)
        return path


def _site_packages() -> str:
    import numpy

    return str(Path(numpy.__file__).resolve().parents[1])


def make_jobenv(slurm: SlurmCluster) -> JobEnv:
    """Copy what jobs run into the shared directory and find an interpreter for them."""
    code = slurm.shared / "code"
    code.mkdir()
    shutil.copytree(REPO / "gpu_audit_ckpt", code / "gpu_audit_ckpt",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "examples", code / "examples",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "deploy" / "slurm", code / "slurm")  # the user-side wrappers
    shutil.copy(Path(__file__).with_name("usegpu.py"), code / "usegpu.py")
    for p in [code, *code.rglob("*")]:
        p.chmod(0o755 if p.is_dir() or p.suffix == ".sh" else 0o644)
    env = {"PYTHONPATH": f"{code}{os.pathsep}{_site_packages()}",
           "GPU_AUDIT_TEST_DEVDIR": str(slurm.root / "dev"), "PYTHONDONTWRITEBYTECODE": "1"}
    probe = "import numpy, gpu_audit_ckpt"
    for python in (sys.executable, "/usr/bin/python3"):
        done = subprocess.run(slurm.as_user(slurm.users[0], [python, "-c", probe]),
                              env={**os.environ, **env}, capture_output=True, timeout=60,
                              check=False)
        if done.returncode == 0:
            return JobEnv(python, code, env, as_root=False)
    # e.g. the venv and its interpreter under /root (mode 0700): the jobs run as root,
    # and the tests still check the owner Slurm reports for them
    return JobEnv(sys.executable, code, env, as_root=True)
