"""deploy/systemd: the units pass `systemd-analyze verify` without a warning, keep their
hardening (scored with `systemd-analyze security --offline`), and their ExecStart lines
are commands the gpu-audit CLI accepts."""

from __future__ import annotations

import configparser
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_audit_app.cli import build_parser
from tests.deploy.conftest import DEPLOY, need_tool

SYSTEMD = DEPLOY / "systemd"
UNITS = sorted(SYSTEMD.glob("*.service"))
INSTALLED_BIN = "/opt/gpu-audit/bin/gpu-audit"
# Exposure scores (0 safest .. 10) as measured, with a little room; deploy/README.md
# quotes them. The launcher's sandbox is inherited by the users' jobs, hence its score
# (6.8 before the launcher dropped CAP_DAC_OVERRIDE/CAP_FOWNER and gained ProtectSystem=
# full, ProtectControlGroups and a syscall filter no job needs; 5.0 as its own account).
MAX_EXPOSURE = {"gpu-audit-exporter.service": 2.5, "gpu-audit-shipper.service": 1.8,
                "gpu-audit-launcher.service": 5.5,
                "gpu-audit-launcher-dedicated.service": 5.2}
LAUNCHER_CAPS = {"CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_CHOWN", "CAP_SYS_NICE"}


def unit(path: Path) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(path)
    return parser


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The units with ExecStart pointing at this checkout's gpu-audit (verify checks that
    the binary exists and is executable)."""
    out = tmp_path_factory.mktemp("units")
    gpu_audit = shutil.which("gpu-audit", path=str(Path(sys.executable).parent))
    assert gpu_audit is not None
    for path in UNITS:
        (out / path.name).write_text(path.read_text().replace(INSTALLED_BIN, gpu_audit))
    return out


def test_the_units_exist() -> None:
    assert [p.name for p in UNITS] == sorted(MAX_EXPOSURE)


def _systemd_analyze() -> str:
    tool = need_tool("systemd-analyze")
    done = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=30,
                          check=False)
    if done.returncode != 0:
        pytest.skip(f"systemd-analyze cannot run here: {done.stderr.strip()[:200]}")
    return tool


def test_systemd_analyze_verify_is_silent(installed: Path) -> None:
    tool = _systemd_analyze()
    done = subprocess.run([tool, "verify", *sorted(map(str, installed.glob("*.service")))],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    # verify reports unknown keys and bad values on stderr but still exits 0.
    assert done.stderr.strip() == "", done.stderr


@pytest.mark.parametrize("name", sorted(MAX_EXPOSURE))
def test_hardening_score(installed: Path, name: str) -> None:
    tool = _systemd_analyze()
    done = subprocess.run([tool, "security", "--offline=yes", "--no-pager",
                           str(installed / name)], capture_output=True, text=True,
                          timeout=120, check=False)
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+)", done.stdout + done.stderr)
    if found is None:
        pytest.skip(f"systemd-analyze security --offline gave no score: {done.stderr[:200]}")
    assert float(found.group(1)) <= MAX_EXPOSURE[name]


def test_common_hardening_and_the_launcher_exception() -> None:
    for path in UNITS:
        service = dict(unit(path)["Service"])
        assert service["ProtectKernelModules"] == "yes"
        if path.name.startswith("gpu-audit-launcher"):
            # Drops to the job's user: needs setuid/setgid, and its sandbox binds the jobs.
            caps = set(service["CapabilityBoundingSet"].split())
            assert caps == LAUNCHER_CAPS, "no DAC override, no FOWNER, nothing else"
            assert service["NoNewPrivileges"] == "no"
            assert "ProtectHome" not in service and "PrivateTmp" not in service
            assert service["ProtectSystem"] == "full"  # strict would bind the users' homes
            assert service["StateDirectoryMode"] == "0711"  # jobs reach their own files
            if path.name == "gpu-audit-launcher-dedicated.service":
                assert service["User"] == "gpu-audit-launcher"
                assert set(service["AmbientCapabilities"].split()) == LAUNCHER_CAPS
            continue
        assert service["User"] == "gpu-audit"
        assert service["NoNewPrivileges"] == "yes"
        assert service["ProtectSystem"] == "strict"
        assert service["ReadWritePaths"] == "/var/lib/gpu-audit"
        assert service["ProtectHome"] == "read-only"
        assert service["PrivateTmp"] == "yes"
    exporter = dict(unit(SYSTEMD / "gpu-audit-exporter.service")["Service"])
    assert exporter["CapabilityBoundingSet"] == exporter["AmbientCapabilities"] == (
        "CAP_SYS_PTRACE")
    assert exporter["ProtectProc"] == "default"  # attribution reads every process
    assert "PrivateDevices" not in exporter  # /dev/nvidia*


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_exec_start_is_a_command_the_cli_accepts(path: Path) -> None:
    argv = shlex.split(dict(unit(path)["Service"])["ExecStart"])
    assert argv[0] == INSTALLED_BIN
    parser = build_parser()
    action = parser._subparsers._group_actions[0]  # type: ignore[union-attr]
    commands = dict(action.choices or {})
    assert argv[1] in commands, f"the unit runs `gpu-audit {argv[1]}`, which the CLI lacks"
    args = parser.parse_args(argv[1:])
    assert args.command == argv[1]
    assert str(args.config).startswith("/etc/gpu-audit/")


def test_state_directories_do_not_nest() -> None:
    """systemd gives a StateDirectory= recursively to its unit's user: the launcher's
    (root's) state must not lie inside the exporter's (gpu-audit's)."""
    dirs = {p.name: dict(unit(p)["Service"])["StateDirectory"] for p in UNITS}
    for name in ("gpu-audit-launcher.service", "gpu-audit-launcher-dedicated.service"):
        launcher = dirs.pop(name)
        assert not launcher.startswith("gpu-audit/")
        argv = shlex.split(dict(unit(SYSTEMD / name)["Service"])["ExecStart"])
        assert argv[argv.index("--state-dir") + 1] == f"/var/lib/{launcher}"
    assert set(dirs.values()) == {"gpu-audit"}
