"""docs/CONFIGURATION.md is what the configuration models generate, and what it says
about each key holds: the variable it names sets that key, the default it shows is the
model's, and no key is left without a description."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_audit.config_layers import env_overrides
from gpu_audit.config_section import Section
from gpu_audit_app import configdocs
from gpu_audit_app.config import Config, load_settings

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "CONFIGURATION.md"


def test_committed_reference_matches_the_models() -> None:
    """The committed file equals a fresh generation; the failure says how to regenerate."""
    committed = REFERENCE.read_text(encoding="utf-8")
    assert committed == configdocs.generate(), (
        f"docs/CONFIGURATION.md is out of date: run `{configdocs.REGENERATE}` and commit it")


def test_check_mode_fails_on_a_drifted_file(tmp_path: Path) -> None:
    """`--check` exits 1 on a file that differs and 0 on a fresh one."""
    out = tmp_path / "CONFIGURATION.md"
    assert configdocs.main(["--output", str(out)]) == 0
    assert configdocs.main(["--check", "--output", str(out)]) == 0
    out.write_text(out.read_text(encoding="utf-8").replace("`0.0.0.0:9945`", "`:1`"),
                   encoding="utf-8")
    assert configdocs.main(["--check", "--output", str(out)]) == 1


def test_every_key_has_a_description() -> None:
    """A key without a `description=` in its model would show an empty cell: add one."""
    missing = [".".join(r.path) for r in configdocs.rows() if not r.description.strip()]
    assert not missing, "keys without a description in their model:\n" + "\n".join(missing)


def _leaf_paths(model: type[Any], prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    out: set[tuple[str, ...]] = set()
    for name, field in model.model_fields.items():
        path = (*prefix, field.alias or name)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, Section):
            out |= _leaf_paths(annotation, path)
        else:
            out.add(path)
    return out


def test_every_key_of_the_root_model_is_listed() -> None:
    """Each leaf key of Config (outside the sinks list) has a row, and no row names a
    key the model does not have."""
    documented = {r.path for r in configdocs.rows() if r.type != "section" and r.env}
    assert documented == _leaf_paths(Config)


def test_each_documented_variable_sets_its_key() -> None:
    """The variable a row names is the one the loader maps to that key path."""
    for row in configdocs.rows():
        if row.env is None:
            continue
        assert env_overrides({row.env: "x"}) == {row.path: "x"}, row.env


@pytest.mark.parametrize(("env", "value", "expect"), [
    ("GPU_AUDIT__EXPORTER__INTERVAL_SECONDS", "2.5", 2.5),
    ("GPU_AUDIT__ATTRIBUTION__KUBELET__REFRESH_SECONDS", "7", 7.0),
    ("GPU_AUDIT__SPOOL__WHEN_FULL", "drop_oldest", "drop_oldest"),
])
def test_documented_variables_change_the_loaded_configuration(
        env: str, value: str, expect: object) -> None:
    """A few documented variables, through the real loader."""
    assert any(r.env == env for r in configdocs.rows()), env
    config = load_settings(None, environ={env: value})
    node: Any = config
    for key in env.removeprefix("GPU_AUDIT__").lower().split("__"):
        node = getattr(node, key)
    assert node == expect


def test_defaults_shown_are_the_models() -> None:
    """A few rendered defaults, compared with a default Config (a renderer that dropped
    or mangled defaults would fail here)."""
    by_path = {r.path: r for r in configdocs.rows()}
    config = Config()
    assert by_path[("exporter", "listen")].default == f"`{config.exporter.listen}`"
    assert by_path[("spool", "max_bytes")].default == f"`{config.spool.max_bytes}` (2 GiB)"
    assert by_path[("attribution", "sources")].default == (
        "`[" + ", ".join(config.attribution.sources) + "]`")
    assert by_path[("shipper", "sinks")].default == "`[{type: archive}]`"
    assert by_path[("host",)].default == "this machine's host name"


def test_secret_keys_are_marked() -> None:
    """Every *_env / *_file key naming a secret is marked, and no other key is."""
    marked = {".".join(r.path) for r in configdocs.rows() if r.kept_in}
    assert "audit.hmac_key_file" in marked
    assert "shipper.sinks[].password_env" in marked
    assert "shipper.sinks[].token_file" in marked
    assert "exporter.web_config_file" not in marked
    assert "shipper.deadletter_dir" not in marked
