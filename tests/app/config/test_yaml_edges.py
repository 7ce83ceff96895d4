"""YAML edge cases in every file kind (configuration, scenario, web-config): booleans are
not numbers, duplicate keys and non-finite floats are refused, and an alias bomb is
refused quickly with bounded memory."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from exporter.sim.scenario import load_scenario
from gpu_audit.errors import ConfigError
from gpu_audit.http.webconfig import load_web_config
from gpu_audit_app.config import load_settings

ROOT = Path(__file__).resolve().parents[3]

_SCENARIO = """\
name: t
gpus:
  - count: 1
processes:
  - name: train
    pid: 100
    gpu: 0
    memory: 1GiB
"""


def _config_error(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ={})
    return info.value.render()


def test_a_boolean_is_not_a_number(tmp_path: Path) -> None:
    """`interval_seconds: true` is refused (it was read as 1), in every number setting,
    in the configuration, a scenario and a web-config file."""
    path = tmp_path / "c.yaml"
    path.write_text("exporter:\n  interval_seconds: true\nshipper:\n  batch_max_records: false\n")
    text = _config_error(path)
    assert "exporter.interval_seconds" in text and "boolean" in text
    assert "shipper.batch_max_records" in text

    scen = tmp_path / "s.yaml"
    scen.write_text(_SCENARIO + "duration_seconds: true\n")
    with pytest.raises(ConfigError) as info:
        load_scenario(str(scen))
    assert "duration_seconds" in info.value.render()

    web = tmp_path / "web.yml"
    web.write_text("rate_limit:\n  burst: true\n")
    with pytest.raises(ConfigError) as info:
        load_web_config(web)
    assert "rate_limit.burst" in info.value.render()


def test_duplicate_keys_are_refused_naming_both_lines(tmp_path: Path) -> None:
    """A key given twice in one mapping is an error naming both lines (YAML would
    silently keep the last one)."""
    path = tmp_path / "c.yaml"
    path.write_text("exporter:\n  listen: 127.0.0.1:1\n  backend: sim\n  listen: 127.0.0.1:2\n")
    text = _config_error(path)
    assert "exporter.listen" in text and "duplicate key" in text
    assert "c.yaml:4: exporter.listen: duplicate key (also at line 2)" in text

    web = tmp_path / "web.yml"
    web.write_text("rate_limit:\n  burst: 1\nrate_limit:\n  burst: 2\n")
    with pytest.raises(ConfigError) as info:
        load_web_config(web)
    assert "duplicate key" in info.value.render()


def test_merge_keys_may_override_without_being_duplicates(tmp_path: Path) -> None:
    """A `<<: *anchor` merge followed by an explicit key is an override, not a duplicate."""
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent("""\
        shipper:
          sinks:
            - &one {type: archive, name: a, compress: false}
            - <<: *one
              name: b
        """))
    config = load_settings(path, environ={})
    assert config.shipper.sink_names() == ["a", "b"]


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_non_finite_numbers_are_refused(tmp_path: Path, value: str) -> None:
    """`time_scale: .inf` (or nan) is a configuration error, not a traceback every cycle."""
    path = tmp_path / "c.yaml"
    path.write_text(f"exporter:\n  time_scale: {value}\n  interval_seconds: {value}\n")
    text = _config_error(path)
    assert "exporter.time_scale" in text and "exporter.interval_seconds" in text
    assert "finite" in text

    scen = tmp_path / "s.yaml"
    scen.write_text(_SCENARIO + f"duration_seconds: {value}\n")
    with pytest.raises(ConfigError) as info:
        load_scenario(str(scen))
    assert "duration_seconds" in info.value.render()


def _bomb(levels: int = 9) -> str:
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        refs = ", ".join([f"*l{i - 1}"] * 9)
        lines.append(f"l{i}: &l{i} [{refs}]")
    return "\n".join(lines) + "\n"


_LOADERS = {
    "config": "from gpu_audit_app.config import load_settings; load_settings(p, environ={})",
    "scenario": "from exporter.sim.scenario import load_scenario; load_scenario(str(p))",
    "web-config": "from gpu_audit.http.webconfig import load_web_config; load_web_config(p)",
    "environment": "from gpu_audit_app.config import load_settings; load_settings(None, "
                   "environ={'GPU_AUDIT__ATTRIBUTION__ENVIRON_KEYS': p.read_text()})",
}


@pytest.mark.parametrize("kind", sorted(_LOADERS))
def test_an_alias_bomb_is_refused_quickly_with_bounded_memory(tmp_path: Path, kind: str) -> None:
    """A billion-laughs file (or environment variable) is refused with a message about
    aliases; the loader runs under a 1 GiB address-space limit and a time limit, so
    expanding it would fail."""
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb())
    script = textwrap.dedent(f"""\
        import resource, sys
        from pathlib import Path
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        from gpu_audit.errors import ConfigError
        p = Path(sys.argv[1])
        try:
            {_LOADERS[kind]}
        except ConfigError as exc:
            print(exc.render())
            sys.exit(0)
        sys.exit(3)
        """)
    res = subprocess.run([sys.executable, "-c", script, str(path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "alias" in res.stdout


def test_a_recursive_alias_is_refused(tmp_path: Path) -> None:
    """An alias inside its own anchor (a cycle) is refused, not followed forever."""
    path = tmp_path / "c.yaml"
    path.write_text("attribution:\n  environ_keys: &k [A, *k]\n")
    assert "alias" in _config_error(path)


def test_reasonable_anchors_still_work(tmp_path: Path) -> None:
    """Anchors and aliases that expand to a small document are allowed (they are common
    for sharing TLS settings between sinks)."""
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent("""\
        shipper:
          sinks:
            - {type: influxdb_v1, name: a, database: d, tls: &tls {enabled: true, verify: false}}
            - {type: influxdb_v1, name: b, database: d, tls: *tls}
        """))
    sinks = load_settings(path, environ={}).shipper.sinks
    assert [s.tls.verify for s in sinks] == [False, False]  # type: ignore[union-attr]


def test_deeply_nested_yaml_is_a_clear_error(tmp_path: Path) -> None:
    """Thousands of nested brackets are a configuration error, not a RecursionError."""
    path = tmp_path / "c.yaml"
    path.write_text("host: " + "[" * 5000 + "]" * 5000 + "\n")
    assert "nested" in _config_error(path)
