"""The launcher as a dedicated account with four capabilities (the least-privilege mode of
deploy/systemd/gpu-audit-launcher-dedicated.service), started here through setpriv with
the same ambient and bounding sets systemd would give it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

from tests.launcher.runtime.daemon import LauncherDaemon
from tests.launcher.runtime.users import ALICE, BOB, LAUNCHER, job_python, local_user
from tests.polling import wait_for

PY = job_python()
CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_CHOWN", "CAP_SYS_NICE")
REPORT = ("import os\n"
          "caps = {l.split(':')[0]: int(l.split()[1], 16) for l in open('/proc/self/status')"
          " if l.startswith('Cap')}\n"
          "print(os.getuid(), os.getgid(), caps['CapInh'], caps['CapPrm'], caps['CapEff'], "
          "caps['CapAmb'], flush=True)\n"
          "import time; time.sleep(60)\n")


def _caps(pid: int) -> dict[str, int]:
    return {line.split(":")[0]: int(line.split()[1], 16)
            for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            if line.startswith("Cap")}


def test_dedicated_account_runs_jobs_as_their_users_and_jobs_hold_no_capability(
        home: Path) -> None:
    """A daemon running as its own account with CAP_SETUID, CAP_SETGID, CAP_KILL,
    CAP_CHOWN and CAP_SYS_NICE (ambient) starts alice's job as alice, with no capability
    in any set (the daemon emptied its ambient set: a job inheriting it could make itself
    root); alice reads her log through the daemon, bob may not cancel it, alice may."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    account = local_user(LAUNCHER)
    alice = local_user(ALICE)
    d = LauncherDaemon(home, gpus=1, account=LAUNCHER, capabilities=CAPS).start()
    try:
        assert d.proc is not None
        caps = _caps(d.proc.pid)  # setpriv execs the daemon: same pid
        assert caps["CapAmb"] == 0, "the daemon kept its ambient capabilities"
        assert caps["CapEff"] == sum(1 << n for n in (23, 7, 6, 5, 0))
        assert os.stat(d.state).st_uid == account.pw_uid
        (home / "job.yaml").write_text(yaml.safe_dump({
            "name": "caps", "gpus": 0, "command": [PY, "-c", REPORT]}))
        (home / "job.yaml").chmod(0o644)
        out = d.client(ALICE, "submit", "job.yaml").stdout
        job = int(out.split(": ", 1)[1].split()[0])
        d.wait_state(job, {"running"})
        def report() -> str:
            return d.client(ALICE, "logs", str(job)).stdout.strip()

        line = wait_for(report, 30, "the job's report")
        uid, gid, inh, prm, eff, amb = map(int, line.split())
        assert (uid, gid) == (alice.pw_uid, alice.pw_gid)
        assert (inh, prm, eff, amb) == (0, 0, 0, 0), "the job holds capabilities"
        log_file = d.state / "logs" / str(job) / "1.out"
        st = log_file.stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (
            alice.pw_uid, account.pw_gid, 0o640)
        assert d.client(BOB, "cancel", str(job), check=False).returncode == 1
        d.client(ALICE, "cancel", str(job))
        assert d.wait_state(job, {"cancelled"})["state"] == "cancelled"
    finally:
        d.stop()
        d.kill_jobs()
