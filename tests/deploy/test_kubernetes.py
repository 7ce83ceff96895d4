"""deploy/kubernetes: every overlay renders with `kubectl kustomize`, its core objects
validate against the Kubernetes schemas (kubernetes-validate, offline, strict), the
PrometheusRule is the rule source of alerts/ and passes `promtool check rules`, and the
dashboard ConfigMaps carry the committed dashboard JSON byte for byte."""

from __future__ import annotations

import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpu_audit_app.config import load_config
from tests.deploy.conftest import DEPLOY, REPO, need_tool

K8S = DEPLOY / "kubernetes"
OVERLAYS = sorted(p.parent.name for p in (K8S / "overlays").glob("*/kustomization.yaml"))
TARGETS = ["base", *(f"overlays/{name}" for name in OVERLAYS)]
# API groups whose schemas are CRDs (not in kubernetes-validate's core schemas).
CRD_GROUPS = ("monitoring.coreos.com/",)
# The oldest Kubernetes still supported upstream when this was written, and the newest
# the installed kubernetes-validate knows.
VERSIONS = ("1.29.0", kubernetes_validate.utils.latest_version() + ".0")


@cache
def kubectl_with_kustomize_v4() -> str:
    """kubectl, when its embedded kustomize understands `labels:` and `patches:` (v4+,
    kubectl 1.21+; Debian 12's kubernetes-client 1.20 embeds v2)."""
    kubectl = need_tool("kubectl")
    done = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True,
                          timeout=60, check=False)
    found = re.search(r"Kustomize Version: v(\d+)", done.stdout)
    if found is None or int(found.group(1)) < 4:
        pytest.skip(f"kubectl's embedded kustomize is older than v4 ({done.stdout.strip()!r});"
                    " install kubectl 1.21 or later")
    return kubectl


@cache
def rendered(target: str) -> tuple[dict[str, Any], ...]:
    kubectl = kubectl_with_kustomize_v4()
    done = subprocess.run([kubectl, "kustomize", str(K8S / target)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, f"kubectl kustomize {target}: {done.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def objects(target: str, kind: str) -> list[dict[str, Any]]:
    return [doc for doc in rendered(target) if doc["kind"] == kind]


def daemonset(target: str) -> dict[str, Any]:
    (ds,) = objects(target, "DaemonSet")
    return ds


def test_overlays_exist() -> None:
    assert {"sim", "nvml", "openshift"} <= set(OVERLAYS)


@pytest.mark.parametrize("target", TARGETS)
def test_core_objects_validate_against_the_kubernetes_schemas(target: str) -> None:
    docs = rendered(target)
    core = [d for d in docs if not d["apiVersion"].startswith(CRD_GROUPS)]
    assert {"Namespace", "ServiceAccount", "DaemonSet", "Service", "ConfigMap"} <= {
        d["kind"] for d in core}
    for version in VERSIONS:
        for doc in core:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{target}: {doc['kind']}/{doc['metadata']['name']} "
                            f"(Kubernetes {version}): {exc.message} at {list(exc.path)}")
    crds = {d["kind"] for d in docs if d["apiVersion"].startswith(CRD_GROUPS)}
    assert crds == {"ServiceMonitor", "PrometheusRule"}


@pytest.mark.parametrize("target", ["base", "overlays/nvml", "overlays/openshift"])
def test_the_gpu_daemonset_sees_the_host(target: str) -> None:
    spec = daemonset(target)["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    (container,) = spec["containers"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert volumes[mounts["/host/proc"]["name"]]["hostPath"]["path"] == "/proc"
    assert mounts["/host/proc"]["readOnly"] is True
    pod_resources = mounts["/var/lib/kubelet/pod-resources"]
    assert volumes[pod_resources["name"]]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    assert volumes[mounts["/var/lib/gpu-audit"]["name"]]["hostPath"]["path"] == "/var/lib/gpu-audit"
    assert volumes[mounts["/run/gpu-audit/jobs"]["name"]]["hostPath"]["path"] == (
        "/run/gpu-audit/jobs")
    assert container["resources"]["requests"] and container["resources"]["limits"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"],
                                                            "add": ["SYS_PTRACE"]}
    # The configuration points attribution at the mounts.
    config = _mounted_config(target)
    assert str(config.attribution.procfs_root) == "/host/proc"
    assert config.attribution.kubelet.enabled
    assert str(config.attribution.kubelet.socket).startswith("/var/lib/kubelet/pod-resources/")
    assert str(config.spool.directory).startswith("/var/lib/gpu-audit/")


def test_the_sim_overlay_needs_no_host_access() -> None:
    spec = daemonset("overlays/sim")["spec"]["template"]["spec"]
    assert spec["hostPID"] is False
    assert "nodeSelector" not in spec
    assert all("hostPath" not in v for v in spec["volumes"])
    (container,) = spec["containers"]
    assert container["securityContext"]["runAsUser"] == 10001
    assert "add" not in container["securityContext"]["capabilities"]
    mounted = {m["name"] for m in container["volumeMounts"]}
    assert mounted <= {v["name"] for v in spec["volumes"]}
    config = _mounted_config("overlays/sim")
    assert config.exporter.backend == "sim"
    assert config.exporter.scenario == "busy"


def test_openshift_grants_the_privileged_scc() -> None:
    (binding,) = objects("overlays/openshift", "RoleBinding")
    assert binding["roleRef"]["name"] == "system:openshift:scc:privileged"
    assert binding["subjects"][0]["name"] == "gpu-audit"
    (container,) = daemonset("overlays/openshift")["spec"]["template"]["spec"]["containers"]
    assert container["securityContext"]["seLinuxOptions"] == {"type": "spc_t"}
    assert daemonset("overlays/openshift")["spec"]["template"]["spec"]["runtimeClassName"] == (
        "nvidia")


def _mounted_config(target: str) -> Any:
    ds = daemonset(target)
    spec = ds["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["args"] == ["run", "--config", "/etc/gpu-audit/config.yaml"]
    config_volume = next(v for v in spec["volumes"] if v["name"] == "config")
    (cm,) = [c for c in objects(target, "ConfigMap")
             if c["metadata"]["name"] == config_volume["configMap"]["name"]]
    return _load_config_text(cm["data"]["config.yaml"])


def _load_config_text(text: str) -> Any:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(text)
        return load_config(path)


@pytest.mark.parametrize("target", TARGETS)
def test_service_and_monitor_scrape_as_the_rules_expect(target: str) -> None:
    (service,) = objects(target, "Service")
    (monitor,) = objects(target, "ServiceMonitor")
    ds = daemonset(target)
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"][
        "labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    # The scrape job label is the value of jobLabel on the Service: the rules' scrape_jobs.
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "gpu-audit"


def test_generated_files_are_current() -> None:
    done = subprocess.run([sys.executable, str(K8S / "generate.py"), "--check"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


def test_prometheus_rule_is_the_alerts_rule_source_and_promtool_accepts_it(
    tmp_path: Path,
) -> None:
    (rule,) = objects("base", "PrometheusRule")
    groups = rule["spec"]["groups"]
    committed: list[dict[str, Any]] = []
    for name in ("recording.yaml", "alerts.yaml"):
        committed.extend(yaml.safe_load((REPO / "alerts" / "rules" / name).read_text())[
            "groups"])
    assert groups == committed
    promtool = need_tool("promtool")
    path = tmp_path / "prometheusrule-groups.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in groups)} rules found" in done.stdout


@pytest.mark.parametrize("target", TARGETS)
def test_dashboard_config_maps_equal_the_committed_json(target: str) -> None:
    maps = [c for c in objects(target, "ConfigMap")
            if c["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    committed = {p.stem: p.read_text(encoding="utf-8")
                 for p in (REPO / "dashboards" / "grafana").glob("*.json")}
    assert len(committed) >= 6
    seen = {}
    for cm in maps:
        ((key, text),) = cm["data"].items()
        stem = key.removeprefix("gpu-audit-").removesuffix(".json")
        seen[stem] = text
    assert seen.keys() == committed.keys()
    for stem, text in committed.items():
        assert seen[stem] == text, f"ConfigMap of {stem}.json differs from the committed JSON"
