"""The rule files are generated from one source, the committed ones match production
params, and Prometheus' own checker accepts them."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from alerts.params import Params, load_params
from alerts.render import ALERTS_FILE, RECORDING_FILE, render
from gpu_audit.errors import ConfigError
from gpu_audit_app.cli import main as gpu_audit_main

ROOT = Path(__file__).resolve().parents[2]
PARAMS = ROOT / "alerts" / "params"
RULES = ROOT / "alerts" / "rules"

# the recording-rule contract shared with the dashboards and chargeback
CONTRACT = {
    "gpu:gpu_held:bool": {"instance", "gpu", "uuid", "user", "project", "job"},
    "gpu:gpu_idle_held:bool": {"instance", "gpu", "uuid", "user", "project", "job"},
    "user_project_job:gpus_held:sum": {"user", "project", "job"},
    "user_project_job:gpus_busy:sum": {"user", "project", "job"},
    "user_project_job:gpu_memory_used_bytes:sum": {"user", "project", "job"},
    "user_project_job:gpu_power_watts:sum": {"user", "project", "job"},
    "user_project_job:gpus_idle_held:sum": {"user", "project", "job"},
    "gpu:allocation_utilization_ratio": {"instance", "gpu", "uuid", "user", "project", "job"},
    "gpu:gpu_held:share": {"instance", "gpu", "uuid", "user", "project", "job"},
    "gpu:gpu_busy:sum": {"instance", "gpu", "uuid", "user", "project", "job"},
    "gpu:gpu_power_watts:share": {"instance", "gpu", "uuid", "user", "project", "job"},
    "gpu:gpu_up:max": {"instance", "gpu", "uuid"},
    "gpu:gpu_utilization_ratio:max": {"instance", "gpu", "uuid"},
    "gpu:gpu_power_watts:max": {"instance", "gpu", "uuid"},
    "fleet:gpus:count": set(),
    "fleet:gpus_held:sum": set(),
    "fleet:gpus_busy:sum": set(),
    "fleet:gpus_idle_held:sum": set(),
    "fleet:gpu_power_watts:sum": set(),
    "fleet:gpu_unattributed_memory_bytes:sum": set(),
}


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return path


def test_committed_rules_match_production_params() -> None:
    """alerts/rules/*.yaml are exactly what production.yaml renders: editing the rule
    code or the params without rendering again fails here."""
    rendered = render(load_params(PARAMS / "production.yaml"), "production.yaml")
    for name, text in rendered.items():
        committed = (RULES / name).read_text(encoding="utf-8")
        assert committed == text, (
            f"alerts/rules/{name} drifted: run `gpu-audit rules render --params "
            f"alerts/params/production.yaml --out alerts/rules`")


def test_recording_rules_keep_the_contract() -> None:
    """Every contracted recording rule exists in both params files (their exact labels
    and values are checked by the promtool unit tests, alerts/unittests/recording.yaml),
    and the fleet totals are always present (0 when nothing matches)."""
    for params in ("production.yaml", "fast.yaml"):
        text = render(load_params(PARAMS / params), params)[RECORDING_FILE]
        rules = {r["record"]: r["expr"] for r in yaml.safe_load(text)["groups"][0]["rules"]}
        assert set(CONTRACT) <= set(rules)
        for name, labels in CONTRACT.items():
            if not labels:
                assert rules[name].endswith("or vector(0)"), name


def test_production_excludes_simulated_data_and_fast_includes_it() -> None:
    """Production rules never count simulated="true" series; the fast params (for the
    simulator) have no such matcher."""
    prod = render(load_params(PARAMS / "production.yaml"), "p")
    fast = render(load_params(PARAMS / "fast.yaml"), "f")
    for name in (RECORDING_FILE, ALERTS_FILE):
        assert 'simulated!="true"' in prod[name]
        assert "simulated" not in fast[name].replace("simulated=", "")


def test_promtool_check_rules_is_clean(tmp_path: Path) -> None:
    """`promtool check rules` accepts the committed files and the fast rendering, with
    no warning."""
    promtool = _promtool()
    assert gpu_audit_main(["rules", "render", "--params", str(PARAMS / "fast.yaml"),
                           "--out", str(tmp_path)]) == 0
    files = [str(RULES / RECORDING_FILE), str(RULES / ALERTS_FILE),
             str(tmp_path / RECORDING_FILE), str(tmp_path / ALERTS_FILE)]
    res = subprocess.run([promtool, "check", "rules", *files], capture_output=True,
                         text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "WARNING" not in (res.stdout + res.stderr).upper()


def test_gpu_audit_rules_render_writes_both_files(tmp_path: Path) -> None:
    """`gpu-audit rules render --params FILE --out DIR` writes recording.yaml and
    alerts.yaml, equal to the committed ones for production params."""
    out = tmp_path / "new" / "rules"
    code = gpu_audit_main(["rules", "render", "--params", str(PARAMS / "production.yaml"),
                           "--out", str(out)])
    assert code == 0
    for name in (RECORDING_FILE, ALERTS_FILE):
        assert (out / name).read_text() == (RULES / name).read_text()


def test_bad_params_name_every_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       ) -> None:
    """A params file with a bad duration, a ratio above 1 and a missing section is
    refused with exit 2, each problem named with its key."""
    data = yaml.safe_load((PARAMS / "production.yaml").read_text())
    data["waste"]["idle_window"] = "an hour"
    data["waste"]["idle_fraction"] = 1.5
    del data["pipeline"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        load_params(bad)
    text = err.value.render()
    for key in ("waste.idle_window", "waste.idle_fraction", "pipeline"):
        assert key in text, text
    assert gpu_audit_main(["rules", "render", "--params", str(bad), "--out",
                           str(tmp_path / "o")]) == 2
    assert "waste.idle_window" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_thresholds_are_rendered_exactly() -> None:
    """A threshold reaches the rule as the number the params file says, not rounded to
    six significant digits (1 GiB stays 1073741824, not 1.07374e+09)."""
    data = yaml.safe_load((PARAMS / "production.yaml").read_text())
    data["leak"]["min_growth_ratio_per_hour"] = 0.0125
    data["pipeline"]["lag_seconds"] = 600.5
    params = Params.model_validate(data)
    rendered = render(params, "p")
    rules = {r["alert"]: r for g in yaml.safe_load(rendered[ALERTS_FILE])["groups"]
             for r in g["rules"]}
    records = {r["record"]: r for r in yaml.safe_load(rendered[RECORDING_FILE])["groups"][0]
               ["rules"]}
    assert rules["GpuUnattributedMemory"]["expr"].endswith("> 1073741824")
    assert "* 0.0125 / 3600)\n" in records["gpu:process_memory_growth_bytes_per_second:leak"][
        "expr"]
    assert "> 600.5\n" in rules["GpuAuditSinkLagGrowing"]["expr"]
    assert "(more than 600.5s)" in rules["GpuAuditSinkLagGrowing"]["annotations"]["description"]


def test_rules_read_only_metrics_the_exporter_serves() -> None:
    """Every metric a rule reads is one docs/METRICS.md lists (generated from the
    catalogue), or a recording rule of ours, or Prometheus' `up`/`ALERTS`: a rule on a
    misspelt or vendor-only name would silently never fire."""
    documented = set(re.findall(r"^\| `([a-zA-Z_:][a-zA-Z0-9_:]*)` \|",
                                (ROOT / "docs" / "METRICS.md").read_text(), re.M))
    for params in ("production.yaml", "fast.yaml"):
        rendered = render(load_params(PARAMS / params), params)
        recorded = {r["record"] for r in yaml.safe_load(rendered[RECORDING_FILE])["groups"][0]
                    ["rules"]}
        for text in rendered.values():
            for group in yaml.safe_load(text)["groups"]:
                for rule in group["rules"]:
                    # label lists and selectors name labels (gpu_instance_id), not metrics
                    expr = re.sub(r"\b(by|on|without|ignoring|group_left|group_right)"
                                  r"\s*\([^)]*\)", "", rule["expr"])
                    expr = re.sub(r"\{[^}]*\}", "", expr)
                    names = set(re.findall(r"\b(gpu_[a-z0-9_]+|[a-z_]+:[a-z_]+:[a-z_]+)\b",
                                           expr))
                    unknown = names - documented - recorded
                    assert not unknown, (rule.get("alert") or rule["record"], unknown)
