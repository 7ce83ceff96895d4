"""`gpu-audit check-config` lists every problem in one pass: structure and machine
problems together, each with its file and line or the variable or option that set it,
sorted, with key paths in one style."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_audit.errors import ConfigError
from gpu_audit_app.check_config import check_config

ROOT = Path(__file__).resolve().parents[3]


def _check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("GPU_AUDIT__")}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "gpu_audit_app", "check-config", *args],
                          cwd=ROOT, env=full, capture_output=True, text=True, timeout=60,
                          check=False)


def _problems(stderr: str) -> list[str]:
    return [line[4:] for line in stderr.splitlines() if line.startswith("  - ")]


def test_structure_errors_do_not_hide_machine_problems(tmp_path: Path) -> None:
    """A bad value in one section, a broken sink, a bad web-config file, a missing
    secret, a bad URL and an unreadable HMAC key are all reported by one run, each with
    its own file and line, sorted, and every key path in dotted form."""
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  prom: not-a-hash\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "exporter:\n"                                        # 1
        "  interval_seconds: -1\n"                           # 2
        f"  web_config_file: {web}\n"                        # 3
        "audit:\n"                                           # 4
        f"  hmac_key_file: {tmp_path / 'no-key'}\n"          # 5
        "spool:\n"                                           # 6
        f"  directory: {tmp_path / 'spool'}\n"               # 7
        "shipper:\n"                                         # 8
        "  sinks:\n"                                         # 9
        "    - type: elasticsearch\n"                        # 10
        "      hosts: ['http://:9200']\n"                    # 11
        "      username: u\n"                                # 12
        "      password_env: CHECK_CONFIG_TEST_MISSING\n"    # 13
        "    - type: fluentd\n"                              # 14
        "      port: 99999\n"                                # 15
    )
    res = _check("--config", str(cfg))
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.splitlines()[0] == \
        f"gpu-audit: configuration error in {cfg}: 6 problem(s)"
    assert _problems(res.stderr) == [
        f"{cfg}:2: exporter.interval_seconds: Input should be greater than 0",
        f"{cfg}:5: audit.hmac_key_file: {tmp_path / 'no-key'} is not a readable file",
        f"{cfg}:11: shipper.sinks.0.hosts.0: 'http://:9200' must be an http:// or https:// "
        "URL with a host",
        f"{cfg}:13: shipper.sinks.0.password_env: environment variable "
        "CHECK_CONFIG_TEST_MISSING is not set or empty",
        f"{cfg}:15: shipper.sinks.1.port: Input should be less than or equal to 65535",
        f"{web}:2: basic_auth_users.prom: not a bcrypt hash (one starting $2a$, $2b$ or "
        "$2y$, e.g. from `htpasswd -nBC 10 USER`)",
    ]


def test_problems_from_the_environment_and_options_name_them(tmp_path: Path) -> None:
    """A bad value from GPU_AUDIT__... is blamed on that variable, one from an option on
    the option, never on "(defaults)"."""
    res = _check("--listen", "nowhere", env={
        "GPU_AUDIT__EXPORTER__BACKEND": "cuda",
        "GPU_AUDIT__SPOOL__DIRECTORY": str(tmp_path / "spool"),
        "GPU_AUDIT__SHIPPER__BATCH_MAX_RECORDS": "0",
    })
    assert res.returncode == 2
    problems = _problems(res.stderr)
    assert len(problems) == 3, res.stderr
    assert problems[0].startswith("GPU_AUDIT__EXPORTER__BACKEND: exporter.backend: ")
    assert problems[1].startswith(
        "GPU_AUDIT__SHIPPER__BATCH_MAX_RECORDS: shipper.batch_max_records: ")
    assert problems[2].startswith("--listen: exporter.listen: ")
    assert "(defaults)" not in res.stderr


def test_the_sim_backend_without_a_scenario_is_blamed_on_what_chose_sim(
    tmp_path: Path,
) -> None:
    """`--backend sim` without a scenario: the problem names the option that chose sim."""
    with pytest.raises(ConfigError) as info:
        check_config(None, {("exporter", "backend"): "sim",
                            ("spool", "directory"): str(tmp_path / "spool")},
                     environ={}, labels={("exporter", "backend"): "--backend"})
    assert info.value.problems == [
        "--backend: exporter.backend: the sim backend needs a scenario (exporter.scenario "
        "or --scenario: a shipped name such as busy, or a file)"]


@pytest.mark.parametrize(("yaml_text", "path"), [
    ('host: ""\n', "host"),
    ("shipper:\n  sinks:\n    - {type: fluentd, host: ''}\n", "shipper.sinks.0.host"),
    ("shipper:\n  sinks:\n    - {type: influxdb_v1, database: ''}\n",
     "shipper.sinks.0.database"),
    ("exporter:\n  web_config_file: ''\n", "exporter.web_config_file"),
    ("shipper:\n  sinks:\n    - {type: elasticsearch, username: '', password_env: X}\n",
     "shipper.sinks.0.username"),
])
def test_empty_required_strings_are_refused(tmp_path: Path, yaml_text: str, path: str) -> None:
    """An empty string where a value is needed (`host: ""`) is an error, not accepted."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml_text)
    with pytest.raises(ConfigError) as info:
        check_config(cfg, environ={})
    assert any(re.match(rf"{re.escape(str(cfg))}:\d+: {re.escape(path)}: ", p)
               for p in info.value.problems), info.value.render()


def test_an_empty_name_still_means_the_default(tmp_path: Path) -> None:
    """Settings whose default is the empty string (a sink's name) may still be empty."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"spool:\n  directory: {tmp_path / 'spool'}\n"
                   "shipper:\n  sinks:\n    - {type: archive, name: ''}\n")
    assert check_config(cfg, environ={}).shipper.sink_names() == ["archive"]


def test_the_example_file_is_named_in_the_header() -> None:
    """Checking docs/config-example.yaml (whose secrets are absent here) names the file
    in the header and on every line; the only problems are the machine's."""
    res = _check("--config", "docs/config-example.yaml")
    assert res.returncode == 2
    assert res.stderr.splitlines()[0].startswith(
        "gpu-audit: configuration error in docs/config-example.yaml: ")
    problems = _problems(res.stderr)
    assert problems and all(p.startswith("docs/config-example.yaml:") for p in problems)
    assert problems == sorted(problems, key=lambda p: int(p.split(":")[1]))


def test_a_valid_configuration_is_ok(tmp_path: Path) -> None:
    """Nothing to report: exit 0 and say so."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"spool:\n  directory: {tmp_path / 'spool'}\n")
    res = _check("--config", str(cfg))
    assert res.returncode == 0, res.stderr
    assert "configuration OK" in res.stdout


def test_scenario_problems_name_the_scenario_file_and_line(tmp_path: Path) -> None:
    """With the sim backend, the scenario file is loaded too; its problems carry its own
    file name and line, beside the configuration's."""
    scen = tmp_path / "s.yaml"
    scen.write_text("name: t\ngpus:\n  - count: 0\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"exporter:\n  backend: sim\n  scenario: {scen}\n  listen: x\n"
                   f"spool:\n  directory: {tmp_path / 'spool'}\n")
    with pytest.raises(ConfigError) as info:
        check_config(cfg, environ={})
    assert info.value.problems == [
        f"{cfg}:4: exporter.listen: listen address 'x' is not HOST:PORT",
        f"{scen}:3: gpus.0.count: Input should be greater than or equal to 1",
    ]


def test_an_inventory_directory_that_cannot_work_is_reported(tmp_path: Path) -> None:
    """exporter.inventory_directory under a file (or inside /proc) is named with its
    line: at start it would only be a warning and a GPU inventory kept in memory."""
    (tmp_path / "file").write_text("")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"exporter:\n  inventory_directory: {tmp_path / 'file' / 'inv'}\n"
                   f"spool:\n  directory: {tmp_path / 'spool'}\n")
    res = _check("--config", str(cfg))
    assert res.returncode == 2, res.stdout + res.stderr
    (problem,) = _problems(res.stderr)
    assert problem.startswith(f"{cfg}:2: exporter.inventory_directory: "), problem


@pytest.mark.parametrize(("audit", "sample", "ok"), [
    (60, 5, True), (60, 60, True), (60, 0.2, True), (45, 10, False), (5, 10, False)])
def test_the_audit_interval_is_a_multiple_of_the_sampling_interval(
    audit: float, sample: float, ok: bool
) -> None:
    """audit.interval_seconds adds up whole samples: a multiple of
    exporter.interval_seconds (equal: the per-cycle trail); anything else is a
    configuration error that names both keys."""
    from gpu_audit_app.config import load_settings

    opts = {("audit", "interval_seconds"): audit, ("exporter", "interval_seconds"): sample}
    if ok:
        assert load_settings(None, opts, environ={}).audit.interval_seconds == audit
        return
    with pytest.raises(ConfigError) as exc:
        load_settings(None, opts, environ={})
    assert "audit.interval_seconds" in str(exc.value)
    assert "exporter.interval_seconds" in str(exc.value)


@pytest.mark.parametrize(("sample", "audit"), [
    (5, 60), (7, 63), (25, 50), (45, 45), (60, 60), (120, 120), (0.2, 60), (3600, 3600)])
def test_an_unset_audit_interval_follows_the_sampling_interval(
    sample: float, audit: float
) -> None:
    """With audit.interval_seconds left unset, any valid sampling interval starts: the audit
    interval is 60 s rounded to a multiple of it, or the sampling interval when longer (a
    default must never contradict a choice the user made), and the configuration says so
    in one line for the log."""
    from gpu_audit_app.config import load_settings

    config = load_settings(None, {("exporter", "interval_seconds"): sample}, environ={})
    assert config.audit.interval_seconds == pytest.approx(audit)
    note = config.audit_interval_note
    assert note is not None
    assert f"{audit:g} s" in note
    assert f"exporter.interval_seconds {sample:g}" in note


def test_an_explicit_audit_interval_is_kept_and_not_noted() -> None:
    """A value the user set is used as given, never replaced by the derived default."""
    from gpu_audit_app.config import load_settings

    opts = {("audit", "interval_seconds"): 120, ("exporter", "interval_seconds"): 7}
    with pytest.raises(ConfigError):  # 120 is not a multiple of 7: the user's contradiction
        load_settings(None, opts, environ={})
    config = load_settings(None, {("audit", "interval_seconds"): 30}, environ={})
    assert config.audit.interval_seconds == 30
    assert config.audit_interval_note is None


def test_run_with_an_interval_that_does_not_divide_60_starts(tmp_path: Path) -> None:
    """`gpu-audit run --interval 7` starts (here on the simulator, named) and says once in
    its log which audit interval it chose, instead of stopping with exit 2 on a setting
    the user never made."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpu_audit_app", "run", "--backend", "sim", "--scenario",
         "busy", "--interval", "7", "--listen", "127.0.0.1:0",
         "--spool-dir", str(tmp_path / "spool")],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=tmp_path)
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "serving http://" in line:
                break
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    notes = [ln for ln in lines if "audit.interval_seconds not set: 63 s" in ln]
    assert len(notes) == 1, "".join(lines)
    assert any("serving http://" in ln for ln in lines), "".join(lines)
