"""Sink client libraries are optional extras: the default install runs the exporter, the
archive and the InfluxDB sinks; a configured sink whose library is missing is exit 2 with
the extra to install, at check-config and at start. Missing modules are simulated (an
entry of None in sys.modules makes `import` fail), never uninstalled."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from gpu_audit.errors import ConfigError
from gpu_audit_app.cli import main
from gpu_audit_app.config import load_settings
from shipper.sinks.registry import OPTIONAL_SDKS, create_sink

ROOT = Path(__file__).resolve().parents[3]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# Module -> the distribution that provides it, for the modules of OPTIONAL_SDKS.
DISTRIBUTION = {"elasticsearch": "elasticsearch", "elastic_transport": "elasticsearch",
                "opensearchpy": "opensearch-py", "fluent": "fluent-logger",
                "msgpack": "msgpack", "influxdb_client": "influxdb-client"}
SINKS = {
    "elasticsearch": "{type: elasticsearch, hosts: ['http://127.0.0.1:9']}",
    "opensearch": "{type: opensearch, hosts: ['http://127.0.0.1:9']}",
    "fluentd": "{type: fluentd, host: 127.0.0.1, port: 9}",
}


def _names(requirements: list[str]) -> set[str]:
    return {r.split(";")[0].split("[")[0].split("<")[0].split(">")[0].split("=")[0].strip()
            for r in requirements}


def test_extras_split_the_sink_libraries_out_of_the_default_install() -> None:
    """Default dependencies hold no optional sink library and no benchmark-only one
    (influxdb-client); each sink family's extra holds its libraries, `all` holds every
    family, and `test` pulls `all` so every test runs after `make test`'s install."""
    extras = PYPROJECT["optional-dependencies"]
    default = _names(PYPROJECT["dependencies"])
    for sink_type, (modules, extra) in OPTIONAL_SDKS.items():
        wanted = {DISTRIBUTION[m.split(".")[0]] for m in modules}
        assert wanted <= _names(extras[extra]), sink_type
        assert not wanted & default, sink_type
    assert "influxdb-client" not in default
    assert "influxdb-client" in _names(extras["bench"])
    families = {extra for _modules, extra in OPTIONAL_SDKS.values()}
    assert f"gpu-audit[{','.join(sorted(families))}]" in extras["all"]
    assert "gpu-audit[all]" in extras["test"]


def test_the_default_install_runs_exporter_archive_and_influxdb_sinks(tmp_path: Path) -> None:
    """With every optional library unimportable, check-config passes for archive and
    InfluxDB sinks, those sinks are built, and `gpu-audit run` on the simulator starts and
    stops (what a plain `pip install gpu-audit` must do)."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(textwrap.dedent(f"""\
        exporter: {{listen: '127.0.0.1:0', backend: sim, scenario: busy}}
        spool: {{directory: {tmp_path / 'spool'}, min_free_bytes: 0}}
        shipper:
          sinks:
            - {{type: archive}}
            - {{type: influxdb_v1, url: 'http://127.0.0.1:9', database: x}}
            - {{type: influxdb_v2, url: 'http://127.0.0.1:9', org: o, bucket: b}}
        """))
    blocked = sorted({m.split(".")[0] for mods, _ in OPTIONAL_SDKS.values() for m in mods}
                     | {"influxdb_client"})
    script = textwrap.dedent(f"""\
        import sys
        for name in {blocked!r}:
            sys.modules[name] = None
        from gpu_audit_app.cli import main
        from gpu_audit_app.config import load_settings
        from pathlib import Path
        from gpu_audit_app.run import EmbeddedShipper, exporter_app
        assert main(["check-config", "--config", {str(cfg)!r}]) == 0
        app = exporter_app(load_settings(Path({str(cfg)!r}), environ={{}}),
                           with_shipper=True)
        app.start()
        app.stop()
        assert isinstance(app.companion, EmbeddedShipper)
        print("kinds", sorted(s.kind for s in app.companion.shipper.sinks))
        """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=False, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert "kinds ['archive', 'influxdb_v1', 'influxdb_v2']" in res.stdout


@pytest.mark.parametrize("sink_type", sorted(SINKS))
def test_a_missing_sink_library_names_the_extra(
    sink_type: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A configured sink whose client library is not installed: check-config and start
    (`gpu-audit shipper`, and the factory `run` uses) exit 2 with the pip command that
    installs the extra; never an ImportError traceback."""
    modules, extra = OPTIONAL_SDKS[sink_type]
    for module in list(sys.modules):  # forget what was imported, then hide the library
        if module.split(".")[0] == modules[0].split(".")[0]:
            monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, modules[0].split(".")[0], None)
    for cached in ("shipper.sinks.opensearch.client", "shipper.sinks.opensearch.sink",
                   "shipper.sinks.fluentd.client", "shipper.sinks.fluentd.encode",
                   "shipper.sinks.fluentd.sink", "shipper.sinks.elasticsearch.client"):
        monkeypatch.delitem(sys.modules, cached, raising=False)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"spool: {{directory: {tmp_path / 'spool'}}}\n"
                   f"shipper:\n  sinks:\n    - {SINKS[sink_type]}\n")
    hint = f"pip install 'gpu-audit[{extra}]'"
    assert main(["check-config", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "shipper.sinks.0.type:" in err and hint in err
    config = load_settings(cfg, environ={})
    with pytest.raises(ConfigError) as exc:
        create_sink(config.shipper.sinks[0], spool_dir=config.spool.directory)
    assert hint in str(exc.value)
    assert main(["shipper", "--config", str(cfg)]) == 2
    assert hint in capsys.readouterr().err
