"""The `gpu-audit` command line: help, exit codes, configuration errors, no silent
fallback to the simulator."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpu_audit.config_layers import env_overrides
from gpu_audit.errors import ConfigError
from gpu_audit_app.cli import main
from gpu_audit_app.config import load_settings


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpu_audit_app", *args],
        capture_output=True, text=True, timeout=timeout, check=False,
    )


@pytest.mark.parametrize(
    "argv",
    [[], ["run"], ["exporter"], ["shipper"], ["check-config"], ["audit", "verify"],
     ["spool", "verify"], ["spool", "stats"]],
)
def test_every_subcommand_has_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """`--help` works on the command and on each subcommand and exits 0."""
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    assert exc.value.code == 0
    assert "usage: gpu-audit" in capsys.readouterr().out


def test_exporter_options_exist() -> None:
    """`gpu-audit exporter` takes --config, --listen, --backend and --scenario."""
    out = _run("exporter", "--help").stdout
    for opt in ("--config", "--listen", "--backend", "--scenario"):
        assert opt in out


def test_bad_config_lists_every_problem_with_lines_and_exits_2(tmp_path: Path) -> None:
    """A config with several mistakes gives one message naming each with its line, exit 2."""
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(
        "exporter:\n"
        "  listen: nowhere\n"
        "  interval_seconds: -1\n"
        "  colour: blue\n"
        "attribution:\n"
        "  sources: [environ, astrology]\n"
        "spool:\n"
        "  fsync_window_ms: fast\n"
    )
    res = _run("check-config", "--config", str(cfg))
    assert res.returncode == 2
    err = res.stderr
    assert f"{cfg}:2: exporter.listen" in err
    assert f"{cfg}:3: exporter.interval_seconds" in err
    assert f"{cfg}:4: exporter.colour: unknown key" in err
    assert "attribution.sources" in err and "astrology" in err
    assert f"{cfg}:8: spool.fsync_window_ms" in err


def test_invalid_yaml_is_reported_with_position(tmp_path: Path) -> None:
    """Broken YAML is a configuration error with line and column, exit 2."""
    cfg = tmp_path / "broken.yaml"
    cfg.write_text("exporter:\n  listen: [unclosed\n")
    res = _run("check-config", "--config", str(cfg))
    assert res.returncode == 2
    assert "line" in res.stderr and "not valid YAML" in res.stderr


def test_missing_config_file_is_exit_2(tmp_path: Path) -> None:
    """A config path that does not exist is a usage error, not a crash."""
    res = _run("check-config", "--config", str(tmp_path / "nope.yaml"))
    assert res.returncode == 2 and "cannot read" in res.stderr


def test_environment_overrides_layer_over_the_file(tmp_path: Path) -> None:
    """GPU_AUDIT__SECTION__KEY overrides the file; CLI options override both."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("exporter:\n  interval_seconds: 7\n  listen: 127.0.0.1:1000\n")
    env = {"GPU_AUDIT__EXPORTER__INTERVAL_SECONDS": "3", "GPU_AUDIT__EXPORTER__LISTEN": "x:1"}
    conf = load_settings(cfg, {("exporter", "listen"): "127.0.0.1:2000"}, environ=env)
    assert conf.exporter.interval_seconds == 3
    assert conf.exporter.listen == "127.0.0.1:2000"
    assert env_overrides({"OTHER": "1", "GPU_AUDIT__LOG_LEVEL": "debug"}) == {
        ("log_level",): "debug"
    }


def test_bad_environment_override_is_reported() -> None:
    """A bad value coming from the environment is reported like one from the file."""
    with pytest.raises(ConfigError) as exc:
        load_settings(None, environ={"GPU_AUDIT__EXPORTER__BACKEND": "cuda"})
    assert "exporter.backend" in str(exc.value)


def test_nvml_without_a_gpu_fails_clearly_and_never_falls_back_to_the_simulator(
    tmp_path: Path,
) -> None:
    """On a machine without NVIDIA's library the exporter exits non-zero with a hint and
    points to the simulator; it never starts serving simulated data by itself."""
    pytest.importorskip("pynvml")
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # pragma: no cover - only on a GPU machine
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a working NVIDIA driver")
    res = _run("run", "--backend", "nvml", "--listen", "127.0.0.1:0",
               "--spool-dir", str(tmp_path / "spool"))
    assert res.returncode == 1
    assert "NVIDIA" in res.stderr or "nvidia" in res.stderr
    assert "--backend sim --scenario" in res.stderr
    assert "simulated" not in res.stdout


def test_sim_without_scenario_is_a_config_error(tmp_path: Path) -> None:
    """--backend sim without --scenario is exit 2 with a message naming the setting."""
    res = _run("exporter", "--backend", "sim", "--listen", "127.0.0.1:0",
               "--spool-dir", str(tmp_path / "spool"))
    assert res.returncode == 2
    assert "scenario" in res.stderr


def test_the_documented_example_configuration_is_valid() -> None:
    """docs/config-example.yaml (every section, every sink kind) passes validation; only
    the machine checks (secret files, CA file) can fail on a machine without them."""
    root = Path(__file__).resolve().parents[3]
    config = load_settings(root / "docs" / "config-example.yaml", environ={})
    assert [s.type for s in config.shipper.sinks] == [
        "archive", "elasticsearch", "influxdb_v1", "fluentd"]
    assert config.exporter.interval_seconds == 5


def test_every_yaml_example_in_the_docs_validates(tmp_path: Path) -> None:
    """The configuration snippets a user copies from the README and the docs (each YAML
    block marked `<!-- checked: gpu-audit-config -->` or `launcher-submission`) are
    valid as written."""
    import re

    root = Path(__file__).resolve().parents[3]
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    blocks = [block for page in pages for block in re.findall(
        r"<!-- checked: (?:gpu-audit-config|launcher-submission) -->\n```yaml\n(.*?)```",
        page.read_text(), re.S)]
    assert len(blocks) >= 2
    from launcher.spec import load_submission

    for i, block in enumerate(blocks):
        path = tmp_path / f"readme-{i}.yaml"
        path.write_text(block)
        if block.startswith("# pipeline.yaml"):
            assert len(load_submission(path)) == 3  # the launcher section's job pipeline
            continue
        load_settings(path, environ={})
