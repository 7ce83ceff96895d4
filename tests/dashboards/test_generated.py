"""The committed Grafana JSON is what the code builds, and every dashboard follows the
conventions: stable uids, a datasource variable and no `__inputs`, units on every panel,
refIds and the datasource variable on every target, links carrying the variables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dashboards import build
from tests.dashboards import queries

EXPECTED_UIDS = {
    "fleet": "gpu-audit-fleet", "node": "gpu-audit-node", "users": "gpu-audit-users",
    "waste": "gpu-audit-waste", "hardware": "gpu-audit-hardware",
    "pipeline": "gpu-audit-pipeline",
}
MODELS = build.build_all()


def _panels(model: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in model["panels"] if p["type"] != "row"]


def test_committed_json_matches_the_code() -> None:
    """Regenerating the dashboards gives exactly the committed files (no drift)."""
    assert build.stale_files() == []


def test_drift_is_detected(tmp_path: Path) -> None:
    """A hand edit to a committed file, or a file no builder makes, is reported."""
    build.write_all(tmp_path)
    path = tmp_path / "fleet.json"
    model = json.loads(path.read_text())
    model["title"] = "edited by hand"
    path.write_text(json.dumps(model))
    (tmp_path / "orphan.json").write_text("{}")
    assert build.stale_files(tmp_path) == ["fleet.json", "orphan.json"]
    assert build.main(["--check", "--out", str(tmp_path)]) == 1


def test_uids_are_stable_and_unique() -> None:
    """Each dashboard keeps its uid (provisioning and `push` upsert by it)."""
    assert {name: m["uid"] for name, m in MODELS.items()} == EXPECTED_UIDS


@pytest.mark.parametrize("name", sorted(EXPECTED_UIDS))
def test_datasource_is_a_variable_without_inputs(name: str) -> None:
    """The datasource is a template variable; no `__inputs`/`${DS_...}` that only an
    import resolves, so a provisioned copy works as it is."""
    model = MODELS[name]
    text = json.dumps(model)
    assert "__inputs" not in model and "DS_" not in text
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in _panels(model):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"


@pytest.mark.parametrize("name", sorted(EXPECTED_UIDS))
def test_every_panel_has_a_unit_and_every_target_a_ref_id(name: str) -> None:
    """Units on every panel; unique refIds within a panel; unique panel ids."""
    model = MODELS[name]
    ids = [p["id"] for p in model["panels"]]
    assert len(ids) == len(set(ids)) and 0 not in ids
    for panel in _panels(model):
        assert panel["fieldConfig"]["defaults"].get("unit"), panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and all(refs) and len(refs) == len(set(refs)), panel["title"]


def test_gpu_dashboards_have_the_filter_variables() -> None:
    """datasource, node, GPU, user, project and job where the data has them; the users
    dashboard (rules, no node) has datasource/user/project/job, the pipeline node/sink."""
    names = {n: [v["name"] for v in m["templating"]["list"]] for n, m in MODELS.items()}
    for n in ("fleet", "node", "waste", "hardware"):
        assert names[n] == ["datasource", "sim", "node", "gpu", "user", "project", "job"]
    assert names["users"] == ["datasource", "user", "project", "job"]
    assert names["pipeline"] == ["datasource", "node", "sink"]


@pytest.mark.parametrize("name", sorted(EXPECTED_UIDS))
def test_links_carry_variables_and_time(name: str) -> None:
    """Every dashboard links to the others (by tag) with variables and time range."""
    (link,) = MODELS[name]["links"]
    assert link["type"] == "dashboards" and link["tags"] == ["gpu-audit"]
    assert link["includeVars"] and link["keepTime"]
    assert "gpu-audit" in MODELS[name]["tags"]


@pytest.mark.parametrize("name", sorted(EXPECTED_UIDS))
def test_every_variable_in_a_query_is_defined(name: str) -> None:
    """No query names a variable the dashboard does not define (it would be sent to
    Prometheus as a literal `$name`)."""
    model = MODELS[name]
    values = {**queries.all_values(model), **queries.builtin_values(3600)}
    for target in queries.targets(model):
        assert "$" not in queries.substitute(target.expr, values)
    for vq in queries.variable_queries(model):
        queries.substitute(vq.match, values)


def test_substitute_refuses_unknown_variables() -> None:
    """An undefined variable is an error, not left in the query."""
    with pytest.raises(KeyError, match=r"\$nope"):
        queries.substitute('x{a=~"$nope"}', {})
    assert queries.substitute('x{a=~"${a}", b="$b"}[$__range]',
                              {"a": ".*", "b": "1", "__range": "5m"}) == 'x{a=~".*", b="1"}[5m]'


def test_users_dashboard_reads_the_recording_rules() -> None:
    """GPU-hours, busy GPU-hours, energy and efficiency come from the contract's
    user_project_job:* rules, not raw per-process series."""
    exprs = " ".join(t.expr for t in queries.targets(MODELS["users"]))
    for rule in ("user_project_job:gpus_held:sum", "user_project_job:gpus_busy:sum",
                 "user_project_job:gpu_power_watts:sum"):
        assert rule in exprs
    assert "gpu_process_" not in exprs


def _documented_names() -> set[str]:
    import re

    root = Path(build.__file__).resolve().parents[1]
    metrics = set(re.findall(r"^\| `([a-zA-Z_:][\w:]*)` \|",
                             (root / "docs" / "METRICS.md").read_text(), re.M))
    histograms = {m + suffix for m in metrics for suffix in ("_bucket", "_sum", "_count")}
    rules = set(re.findall(r"record: ([\w:]+)", (root / "alerts" / "rules" /
                                                  "recording.yaml").read_text()))
    return metrics | histograms | rules | {"up", "ALERTS"}


def test_every_queried_metric_is_documented_or_a_recording_rule() -> None:
    """Panels and variables query only metrics docs/METRICS.md lists, the recording rules
    of alerts/rules/recording.yaml, or Prometheus' `up` and `ALERTS`: a renamed metric
    breaks this test, not a dashboard in production."""
    import re

    known = _documented_names()
    assert "gpu_utilization_ratio" in known and "fleet:gpus:count" in known
    functions = {"sum", "max", "min", "avg", "count", "rate", "increase", "deriv", "scalar",
                 "sort_desc", "histogram_quantile", "time", "sum_over_time", "avg_over_time",
                 "max_over_time", "count_over_time", "label_values", "by", "on", "unless",
                 "and", "or", "group_left", "group_right", "without", "bool", "le",
                 "clamp_min", "offset", "predict_linear", "quantile_over_time"}
    unknown = set()
    for name, model in MODELS.items():
        texts = [t.expr for t in queries.targets(model)]
        texts += [v.match for v in queries.variable_queries(model)]
        for text in texts:
            stripped = re.sub(r'"[^"]*"', '""', text)  # label values are not names
            stripped = re.sub(r"\{[^}]*\}", "{}", stripped)  # nor label names
            stripped = re.sub(r"\((?:[\w, ]+)\)", "()", stripped)  # by (...) lists
            stripped = re.sub(r"\[[^\]]*\]", "[]", stripped)  # ranges
            stripped = re.sub(r"\$\w+|\b\d[\w.]*", "", stripped)  # variables, numbers
            for token in re.findall(r"[a-zA-Z_:][\w:]*", stripped):
                if token in functions:
                    continue
                if token not in known:
                    unknown.add(f"{name}: {token}")
    assert sorted(unknown) == []


def test_readme_names_the_nvidia_panels_that_need_dcgm_profiling() -> None:
    """dashboards/README.md names each panel of NVIDIA's dashboard that reads a DCGM
    profiling field, with the field, as docs/METRICS.md's generated table does."""
    from exporter.exposition.compat import NVIDIA_DASHBOARD_PANELS, needs_profiling

    readme = (Path(build.__file__).resolve().parent / "README.md").read_text()
    section = readme.split("## NVIDIA's DCGM dashboard", 1)[1].split("\n## ", 1)[0]
    section = " ".join(section.split())  # the README wraps its lines anywhere
    for title, name in NVIDIA_DASHBOARD_PANELS:
        if needs_profiling(name):
            assert f"**{title}** (`{name}`)" in section, title
    assert "two of its eight panels" in section


def test_the_alert_list_lost_gpus_xids_and_owner_columns_are_there() -> None:
    """The fleet overview lists firing alerts (ALERTS), lost GPUs and XIDs in the range;
    the hardware dashboard lists firing hardware alerts, and its lost-GPU, XID and memory
    error tables join the GPU owner (gpu_owner_info) onto their rows."""
    def exprs(name: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for t in queries.targets(MODELS[name]):
            out[t.panel] = out.get(t.panel, "") + t.expr
        return out

    fleet, hardware = exprs("fleet"), exprs("hardware")
    assert 'ALERTS{alertstate="firing"' in fleet["Firing alerts"]
    assert "gpu_up" in fleet["GPUs lost"] and "gpu_owner_info" in fleet[
        "Lost GPUs and their owners"]
    assert "gpu_xid_errors_total" in fleet["XIDs in range"]
    assert "gpu_owner_info" in fleet["XIDs in range by GPU"]
    assert 'category=~"hardware"' in hardware["Firing hardware alerts"]
    for title in ("Lost GPUs (gpu_up == 0) and their owners",
                  "XID errors by code, with the GPU's owner",
                  "Uncorrectable memory errors, with the GPU's owner"):
        assert "group_left (user, project, job) gpu_owner_info" in hardware[title], title
