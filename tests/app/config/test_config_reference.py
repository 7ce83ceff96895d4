"""docs/CONFIGURATION.md is what the configuration models generate, and what it says
about each key holds: the variable it names sets that key, the default it shows is the
model's, and no key is left without a description."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from gpu_audit.config_layers import env_overrides
from gpu_audit.config_section import Section
from gpu_audit_app import configdocs
from gpu_audit_app.cli import build_parser
from gpu_audit_app.config import Config, load_settings
from gpu_audit_app.launcher.main import LauncherConfig, load_config, serve_options

ROOT = Path(__file__).resolve().parents[3]
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


# --- the launcher daemon's file (gpu-audit launcher serve --config FILE) -------------


def test_the_reference_has_the_launcher_part_after_the_main_one() -> None:
    """The launcher part is generated (not hand-kept) and comes after every main table."""
    text = configdocs.generate()
    main_end = text.index(f"### {configdocs.tables()[-1].title}")
    launcher = text.index(f"## {configdocs.LAUNCHER_TITLE}")
    assert main_end < launcher
    for table in configdocs.launcher_tables():
        assert text.index(table.title, launcher) > launcher


def test_check_mode_covers_the_launcher_part(tmp_path: Path) -> None:
    """A drift in the launcher tables alone fails `--check` too."""
    out = tmp_path / "CONFIGURATION.md"
    assert configdocs.main(["--output", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    row = "| `preempt_grace_seconds` | number | `120.0` |"
    assert row in text
    out.write_text(text.replace(row, "| `preempt_grace_seconds` | number | `60.0` |"),
                   encoding="utf-8")
    assert configdocs.main(["--check", "--output", str(out)]) == 1


def _launcher_leaf_paths(model: type[Any], prefix: tuple[str, ...] = (),
                         seen: set[type[Any]] | None = None) -> set[tuple[str, ...]]:
    """Every leaf key; a model met a second time (the quota limits of `project`,
    `users.<name>`, `projects.<name>`) is documented once, where it is met first."""
    seen = set() if seen is None else seen
    seen.add(model)
    out: set[tuple[str, ...]] = set()
    subs: list[tuple[type[Any], tuple[str, ...]]] = []
    for name, field in model.model_fields.items():
        path = (*prefix, field.alias or name)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            subs.append((annotation, path))
        else:
            out.add(path)
            args = typing.get_args(annotation)
            if typing.get_origin(annotation) is dict and isinstance(args[1], type) \
                    and issubclass(args[1], BaseModel):  # a mapping of sections
                subs.append((args[1], (*path, "<name>")))
    for sub, path in subs:  # breadth first, as the reference is generated
        if sub not in seen:
            out |= _launcher_leaf_paths(sub, path, seen)
    return out


def test_every_launcher_key_is_listed_and_described() -> None:
    """Each leaf key of LauncherConfig (core.policy, core.engine included) has a row with
    a description, and no row names a key the model does not have."""
    rows = configdocs.launcher_rows()
    documented = {r.path for r in rows if r.type != "section"}
    expected = _launcher_leaf_paths(LauncherConfig)
    assert ("core", "policy", "urgency_levels", "<name>", "groups") in expected
    assert ("core", "quotas", "project", "max_gpu_hours") in expected
    assert ("core", "engine", "preempt_grace_seconds") in expected
    assert documented == expected
    missing = [".".join(r.path) for r in rows if not r.description.strip()]
    assert not missing, "launcher keys without a description:\n" + "\n".join(missing)


def test_launcher_keys_name_no_environment_variable() -> None:
    """load_config has no environment layer, so no launcher row may claim one."""
    assert all(r.env is None for r in configdocs.launcher_rows())
    text = configdocs.generate()
    launcher = text[text.index(f"## {configdocs.LAUNCHER_TITLE}"):]
    table_lines = [line for line in launcher.splitlines() if line.startswith("| `")]
    assert table_lines
    assert not [line for line in table_lines if "`GPU_AUDIT__" in line]


def test_launcher_environment_does_not_change_the_loaded_configuration(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What the reference says is true: a GPU_AUDIT__ variable shaped like a launcher key
    is ignored by load_config."""
    monkeypatch.setenv("GPU_AUDIT__TICK_SECONDS", "7")
    monkeypatch.setenv("GPU_AUDIT__CORE__POLICY__W_AGE", "1")
    config = load_config(None, {})
    assert config.tick_seconds == LauncherConfig().tick_seconds
    assert config.core.policy.w_age == LauncherConfig().core.policy.w_age


def test_each_documented_serve_option_sets_its_key(tmp_path: Path) -> None:
    """Every option the launcher rows name, parsed by the real CLI parser and applied the
    way `serve` applies it, sets that key over the file's value."""
    named = configdocs._launcher_options()
    assert set(named) == {("state_dir",), ("socket",), ("gpus",), ("metrics_listen",)}
    launcher_part = configdocs.generate().split(f"## {configdocs.LAUNCHER_TITLE}")[1]
    for path, option in named.items():
        assert f"| `{path[-1]}` |" in launcher_part
        assert f"`{option}` |" in launcher_part
    file = tmp_path / "launcher.yaml"
    file.write_text("state_dir: /from/file\ngpus: nvml\ntick_seconds: 2\n", encoding="utf-8")
    values = {"--state-dir": str(tmp_path / "state"), "--socket": str(tmp_path / "s.sock"),
              "--gpus": "sim:2", "--metrics-listen": "127.0.0.1:0"}
    argv = ["launcher", "serve", "--config", str(file)]
    for option in named.values():
        argv += [option, values[option]]
    args = build_parser().parse_args(argv)
    config = load_config(args.config, {key: getattr(args, key) for key in serve_options()})
    assert config.state_dir == tmp_path / "state"
    assert config.socket == tmp_path / "s.sock"
    assert config.gpus == "sim:2"
    assert config.metrics_listen == "127.0.0.1:0"
    assert config.tick_seconds == 2.0  # a key no option names keeps the file's value


def test_launcher_defaults_shown_are_the_models() -> None:
    by_path = {r.path: r for r in configdocs.launcher_rows()}
    config = LauncherConfig()
    assert by_path[("state_dir",)].default == f"`{config.state_dir}`"
    assert by_path[("socket_mode",)].default == "`438` (octal 666)"
    assert by_path[("core", "policy", "name")].default == f"`{config.core.policy.name}`"
    assert by_path[("core", "policy", "idle_memory_bytes")].default == (
        f"`{config.core.policy.idle_memory_bytes}` (1 GiB)")
    assert by_path[("core", "engine", "preempt_grace_seconds")].default == (
        f"`{config.core.engine.preempt_grace_seconds!r}`")


def test_launcher_doc_links_to_the_reference_section() -> None:
    """docs/LAUNCHER.md points at the generated section by its anchor."""
    text = (ROOT / "docs" / "LAUNCHER.md").read_text(encoding="utf-8")
    assert "CONFIGURATION.md#launcher-daemon-gpu-audit-launcher-serve---config-file" in text
