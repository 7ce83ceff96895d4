"""Sink configuration (discriminated by type, secrets by reference) and the factory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from gpu_audit.errors import ConfigError
from shipper.sinks.archive.sink import ArchiveSink
from shipper.sinks.config import SinkConfig
from shipper.sinks.elasticsearch.bulk import SearchSink
from shipper.sinks.fluentd.sink import FluentdSink
from shipper.sinks.influxdb.sink import InfluxV1Sink, InfluxV2Sink
from shipper.sinks.registry import create_sink

ADAPTER: TypeAdapter[Any] = TypeAdapter(SinkConfig)


def parse(data: dict[str, Any]) -> Any:
    return ADAPTER.validate_python(data)


@pytest.mark.parametrize(
    ("data", "cls", "kind"),
    [
        ({"type": "elasticsearch", "hosts": ["http://e:9200"]}, SearchSink, "elasticsearch"),
        ({"type": "opensearch"}, SearchSink, "opensearch"),
        ({"type": "influxdb_v1", "database": "a"}, InfluxV1Sink, "influxdb_v1"),
        ({"type": "influxdb_v2", "bucket": "b"}, InfluxV2Sink, "influxdb_v2"),
        ({"type": "fluentd"}, FluentdSink, "fluentd"),
        ({"type": "archive"}, ArchiveSink, "archive"),
    ],
)
def test_each_type_builds_its_sink(data: dict[str, Any], cls: type, kind: str,
                                   tmp_path: Path) -> None:
    """`type` picks the model and the factory builds the matching sink; name defaults."""
    sink = create_sink(parse(data), spool_dir=tmp_path / "spool")
    assert isinstance(sink, cls)
    assert sink.kind == kind and sink.name == kind


def test_unknown_keys_and_types_are_errors() -> None:
    """extra=forbid per sink, and an unknown type is named."""
    with pytest.raises(ValidationError, match="extra"):
        parse({"type": "influxdb_v1", "database": "a", "passwd": "x"})
    with pytest.raises(ValidationError, match="type"):
        parse({"type": "kafka"})


def test_plain_secrets_cannot_be_configured() -> None:
    """There is no `password` key: secrets only by env var or file."""
    with pytest.raises(ValidationError):
        parse({"type": "elasticsearch", "username": "u", "password": "hunter2"})
    with pytest.raises(ValidationError, match="only one"):
        parse({"type": "influxdb_v2", "bucket": "b", "token_env": "T", "token_file": "/x"})


def test_secret_from_env_and_file_never_in_repr(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Secrets resolve from env or file into SecretStr; reprs never show them."""
    monkeypatch.setenv("ES_PW", "hunter2")
    (tmp_path / "tok").write_text("t0ken\n")
    es = create_sink(parse({"type": "elasticsearch", "username": "u",
                            "password_env": "ES_PW"}), spool_dir=tmp_path)
    influx = create_sink(parse({"type": "influxdb_v2", "bucket": "b",
                                "token_file": str(tmp_path / "tok")}), spool_dir=tmp_path)
    assert "hunter2" not in repr(vars(es))
    assert "t0ken" not in repr(vars(influx))
    assert influx._token is not None and influx._token.get_secret_value() == "t0ken"  # type: ignore[attr-defined]


def test_missing_secrets_are_all_reported(tmp_path: Path) -> None:
    """Every missing secret of a sink is listed in one ConfigError, by name not value."""
    cfg = parse({"type": "fluentd", "shared_key_env": "NOPE_KEY", "username": "u",
                 "password_file": str(tmp_path / "absent")})
    with pytest.raises(ConfigError) as info:
        create_sink(cfg, spool_dir=tmp_path)
    assert len(info.value.problems) == 2
    assert "NOPE_KEY" in info.value.render()


def test_fluentd_user_auth_needs_shared_key() -> None:
    """User authentication is part of the handshake: without shared_key it is refused."""
    with pytest.raises(ValidationError, match="shared_key"):
        parse({"type": "fluentd", "username": "u", "password_env": "P"})


def test_archive_defaults_beside_the_spool(tmp_path: Path) -> None:
    """Without a directory the archive lives in 'archive' next to the spool directory."""
    sink = create_sink(parse({"type": "archive"}), spool_dir=tmp_path / "spool")
    sink.start()
    assert (tmp_path / "archive").is_dir()


def test_archive_only_shipper_never_imports_sink_client_libraries(tmp_path: Path) -> None:
    """The default (archive-only) shipper loads no client library of another sink kind:
    each is imported only when a sink of its kind is configured (RSS budget)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from shipper.config import ShipperConfig\n"
        "from shipper.engine import Shipper\n"
        "from shipper.sinks.registry import create_sink\n"
        "cfg = ShipperConfig()\n"
        f"create_sink(cfg.sinks[0], spool_dir=Path({str(tmp_path / 'spool')!r}))\n"
        "heavy = ('elasticsearch', 'elastic_transport', 'opensearchpy', 'influxdb_client',\n"
        "         'fluent', 'msgpack')\n"
        "# each sink folder's config is loaded (the YAML union needs it); its sink, client\n"
        "# and encoding modules only when a sink of that kind is built\n"
        "sink_code = tuple(f'shipper.sinks.{kind}.{part}' for kind in\n"
        "                  ('elasticsearch', 'opensearch', 'influxdb', 'fluentd')\n"
        "                  for part in ('sink', 'client', 'encode', 'response'))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy or m in sink_code))\n"
    )
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                         text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_the_registry_lists_exactly_the_configurable_sink_types() -> None:
    """Every `type:` the YAML accepts has one registry entry whose config class is the
    union member for that type and whose `module:Class` is a sink class in that sink's
    own folder; nothing else is registered."""
    from typing import get_args

    from shipper.sinks.registry import OPTIONAL_SDKS, SINK_TYPES, sink_class

    union_members = get_args(get_args(SinkConfig)[0])
    by_type = {cls.model_fields["type"].annotation.__args__[0]: cls for cls in union_members}
    assert set(SINK_TYPES) == set(by_type)
    for name, entry in SINK_TYPES.items():
        assert entry.type == name and entry.config is by_type[name]
        folder = entry.config.__module__.rsplit(".", 1)[0]
        assert entry.sink.startswith(f"{folder}.sink:"), (name, entry.sink)
        assert isinstance(sink_class(name), type), name
    assert set(OPTIONAL_SDKS) == {"elasticsearch", "opensearch", "fluentd"}


def test_sink_configurations_are_pure_data() -> None:
    """No shipper/sinks/*/config.py imports a module of a sink (its own or another's)
    other than configuration: building is the registry's, after the check."""
    import ast

    root = Path(__file__).resolve().parents[3] / "shipper" / "sinks"
    configs = sorted(root.glob("*/config.py"))
    assert len(configs) == 5
    for path in configs:
        tree = ast.parse(path.read_text())
        imported = {node.module for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom) and node.module}
        imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                     for alias in node.names}
        own = [m for m in imported if m.startswith("shipper.sinks.")
               and m not in ("shipper.sinks.build",) and not m.endswith(".config")]
        assert not own, f"{path.relative_to(root)} imports {own}"


@pytest.mark.parametrize(
    ("sink_type", "foreign"),
    [("elasticsearch", ("opensearchpy",)), ("opensearch", ("elasticsearch", "elastic_transport"))],
)
def test_each_search_sink_loads_only_its_own_client_library(
    sink_type: str, foreign: tuple[str, ...], tmp_path: Path
) -> None:
    """Building an Elasticsearch sink never imports opensearch-py, and an OpenSearch sink
    never imports the elasticsearch library (each is its own optional extra)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from pydantic import TypeAdapter\n"
        "from shipper.sinks.config import SinkConfig\n"
        "from shipper.sinks.registry import create_sink\n"
        f"cfg = TypeAdapter(SinkConfig).validate_python({{'type': {sink_type!r}}})\n"
        f"create_sink(cfg, spool_dir=Path({str(tmp_path)!r}))\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {foreign!r}))\n"
    )
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                         text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"
