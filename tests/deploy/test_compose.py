"""compose/: the stack file validates with `docker-compose config` under every profile
combination, every file it mounts from the repository exists, the gpu-audit configuration
files load, and each profile combination starts a consistent set of services (one
exporter, one shipper, every dependency and every scrape/sink target present)."""

from __future__ import annotations

import os
import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_audit_app.config import load_config
from tests.deploy.conftest import REPO, need_tool

COMPOSE = REPO / "compose"
STACK = COMPOSE / "compose.yaml"
EXPORTERS = ("sim", "nvml")
SEARCH = ("elastic", "opensearch")
COMBINATIONS = [(e, s) for e in EXPORTERS for s in SEARCH]


def _env(profiles: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}
    if profiles is not None:
        env["COMPOSE_PROFILES"] = profiles
    return env


@cache
def resolved(profiles: str | None) -> dict[str, Any]:
    """`docker-compose config` of the stack (profiles None: the .env default)."""
    compose = need_tool("docker-compose")
    done = subprocess.run([compose, "--project-directory", str(COMPOSE), "-f", str(STACK),
                           "config"], cwd=COMPOSE, env=_env(profiles), capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, f"docker-compose config ({profiles}): {done.stderr}"
    doc = yaml.safe_load(done.stdout)
    assert isinstance(doc, dict)
    return doc


def active(doc: dict[str, Any], profiles: set[str]) -> dict[str, dict[str, Any]]:
    """The services `docker compose up` starts with these profiles (compose spec rules:
    a service without profiles always, one with profiles when one of them is on)."""
    return {name: svc for name, svc in doc["services"].items()
            if not svc.get("profiles") or profiles & set(svc["profiles"])}


def names_and_aliases(services: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Network name -> service."""
    out = {}
    for name, svc in services.items():
        out[name] = name
        for net in (svc.get("networks") or {}).values():
            for alias in (net or {}).get("aliases", []):
                assert out.get(alias, name) == name, f"{alias} is both {out[alias]} and {name}"
                out[alias] = name
    return out


def test_the_default_profiles_are_the_simulator_and_elastic() -> None:
    env_file = dict(line.split("=", 1) for line in (COMPOSE / ".env").read_text().splitlines()
                    if line and not line.startswith("#"))
    assert env_file["COMPOSE_PROFILES"] == "sim,elastic"
    resolved(None)


@pytest.mark.parametrize(("exporter", "search"), COMBINATIONS)
def test_every_profile_combination_is_consistent(exporter: str, search: str) -> None:
    doc = resolved(f"{exporter},{search}")
    services = active(doc, {exporter, search})
    network = names_and_aliases(services)
    # One exporter and one shipper, reachable under the names Prometheus scrapes.
    assert network["exporter"] == f"exporter-{exporter}"
    assert network["shipper"] == ("shipper" if search == "elastic" else "shipper-opensearch")
    for always in ("prometheus", "alertmanager", "grafana", "influxdb", "fluent-bit"):
        assert always in services
    engine = {"elastic": ("elasticsearch", "kibana"),
              "opensearch": ("opensearch", "opensearch-dashboards")}[search]
    assert set(engine) <= set(services)
    # Start order: every dependency runs in this combination, and waits on a healthcheck
    # wherever the dependency has one.
    for name, svc in services.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on {dep}, not started with these profiles"
            want = "service_healthy" if "healthcheck" in services[dep] else "service_started"
            assert cond["condition"] == want, f"{name} -> {dep}"
    # Every scrape target and every sink host is a service of this combination.
    prom = yaml.safe_load((COMPOSE / "prometheus" / "prometheus.yml").read_text())
    for job in prom["scrape_configs"]:
        for static in job["static_configs"]:
            for target in static["targets"]:
                host = target.rsplit(":", 1)[0]
                assert host == "127.0.0.1" or host in network, f"scrape target {target}"
    shipper = services[network["shipper"]]
    config_file = _mounted_gpu_audit_config(shipper)
    config = load_config(config_file)
    for sink in config.shipper.sinks:
        for url in [*getattr(sink, "hosts", []), getattr(sink, "url", "")]:
            if url:
                host = re.sub(r"^https?://", "", url).split(":")[0].split("/")[0]
                assert host in network, f"sink {sink.name}: {url}"
        host = getattr(sink, "host", None)
        if host:
            assert host in network
    assert config.shipper.metrics_listen == "0.0.0.0:9946"
    exporter_config = load_config(_mounted_gpu_audit_config(services[f"exporter-{exporter}"]))
    assert exporter_config.exporter.backend == ("sim" if exporter == "sim" else "nvml")
    assert exporter_config.spool.directory == config.spool.directory


def _mounted_gpu_audit_config(svc: dict[str, Any]) -> Path:
    command = svc["command"]
    path = command[command.index("--config") + 1]
    for volume in svc["volumes"]:
        if isinstance(volume, dict) and volume.get("target") == path:
            return Path(volume["source"])
        if isinstance(volume, str) and volume.split(":")[1] == path:
            return Path(volume.split(":")[0])
    raise AssertionError(f"{path} is not mounted")


def test_the_nvml_exporter_sees_the_host() -> None:
    svc = resolved("nvml,elastic")["services"]["exporter-nvml"]
    assert svc["pid"] == "host"
    assert svc["runtime"] == "nvidia"
    mounts = {_split(v)[1]: _split(v) for v in svc["volumes"]}
    assert mounts["/host/proc"][0] == "/proc"
    assert mounts["/host/proc"][2] == "ro"
    config = load_config(Path(mounts["/etc/gpu-audit/exporter-nvml.yaml"][0]))
    assert str(config.attribution.procfs_root) == "/host/proc"
    assert str(config.attribution.jobmap_dir) in mounts


def _split(volume: Any) -> tuple[str, str, str]:
    if isinstance(volume, dict):
        return (volume["source"], volume["target"], "ro" if volume.get("read_only") else "rw")
    parts = volume.split(":")
    return (parts[0], parts[1], parts[2] if len(parts) > 2 else "rw")


def test_every_mounted_file_exists_in_the_repository() -> None:
    doc = resolved("sim,elastic")
    mounted: set[Path] = set()
    for name, svc in doc["services"].items():
        for volume in svc.get("volumes", []):
            source = Path(_split(volume)[0])
            if not source.is_absolute() or source.parts[:2] in {("/", "proc"), ("/", "run")}:
                continue  # a named volume, or the host's own /proc and job-mapping dir
            assert source.exists(), f"{name}: {source} is mounted but not in the repository"
            assert source.is_relative_to(REPO), f"{name}: {source} is outside the repository"
            mounted.add(source)
    # Every gpu-audit configuration, Prometheus and Fluent Bit file is used by a service.
    for path in [*COMPOSE.glob("config/*.yaml"), COMPOSE / "prometheus" / "prometheus.yml",
                 *COMPOSE.glob("fluent-bit/*.conf")]:
        assert path in mounted, f"{path.relative_to(REPO)} is not mounted by any service"
    for expected in ("alerts/rules", "alerts/alertmanager/alertmanager.yml", "dashboards/grafana",
                     "dashboards/provisioning/datasources", "dashboards/provisioning/dashboards"):
        assert REPO / expected in mounted
    # The rules Prometheus loads are the mounted alerts/rules files.
    prom = yaml.safe_load((COMPOSE / "prometheus" / "prometheus.yml").read_text())
    assert prom["rule_files"] == ["/etc/prometheus/rules/*.yaml"]
    assert sorted((REPO / "alerts" / "rules").glob("*.yaml"))


@pytest.mark.parametrize("path", sorted(COMPOSE.glob("config/*.yaml")), ids=lambda p: p.name)
def test_gpu_audit_configuration_files_load(path: Path) -> None:
    load_config(path)


def test_prometheus_configuration_passes_promtool(tmp_path: Path) -> None:
    promtool = need_tool("promtool")
    text = (COMPOSE / "prometheus" / "prometheus.yml").read_text()
    rules = REPO / "alerts" / "rules"
    # The container's rule path, pointed at the files it mounts.
    (tmp_path / "prometheus.yml").write_text(text.replace("/etc/prometheus/rules", str(rules)))
    done = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


def test_fluent_bit_listens_where_the_shippers_send() -> None:
    conf = (COMPOSE / "fluent-bit" / "gpu-audit.conf").read_text()
    inputs = re.findall(r"\[INPUT\]\n((?:[ \t]+\S.*\n)+)", conf)
    settings = [dict(line.split(None, 1) for line in block.strip().splitlines())
                for block in inputs]
    forward = [s for s in settings if s["Name"] == "forward"]
    assert forward
    for path in COMPOSE.glob("config/shipper*.yaml"):
        sinks = [s for s in load_config(path).shipper.sinks if s.type == "fluentd"]
        assert [s.port for s in sinks] == [int(forward[0]["Port"])]
