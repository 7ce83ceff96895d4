"""What a process's /proc/<pid>/cgroup says about its container, pod and Slurm job.

Pure parsing of the file's text; no I/O. Understands cgroup v1 (one line per hierarchy)
and v2 (the single `0::` line), the systemd and cgroupfs cgroup drivers, and the naming of
docker, containerd (CRI and nerdctl), cri-o and podman, Kubernetes pods of every QoS
class, and Slurm's job cgroups. It must never guess: a path it does not recognise gives
no answer rather than a wrong one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HEX64 = "[0-9a-f]{64}"

# systemd driver: the container's scope unit is named <prefix>-<id>.scope. conmon
# scopes (crio-conmon-, libpod-conmon-) hold the monitor process, not the container, so
# the id pattern (64 hex) excludes them naturally.
_SCOPE_RUNTIMES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(rf"^docker-({_HEX64})\.scope$"), "docker"),
    (re.compile(rf"^cri-containerd-({_HEX64})\.scope$"), "containerd"),
    (re.compile(rf"^nerdctl-({_HEX64})\.scope$"), "containerd"),
    (re.compile(rf"^crio-({_HEX64})\.scope$"), "cri-o"),
    (re.compile(rf"^libpod-({_HEX64})\.scope$"), "podman"),
)
# cgroupfs driver outside Kubernetes: /docker/<id>, /libpod_parent/libpod-<id>.
_PARENT_RUNTIMES: dict[str, tuple[re.Pattern[str], str]] = {
    "docker": (re.compile(rf"^({_HEX64})$"), "docker"),
    "libpod_parent": (re.compile(rf"^libpod-({_HEX64})$"), "podman"),
}
_BARE_ID = re.compile(rf"^({_HEX64})$")

# A pod UID is a UUID (dashes; the systemd driver writes them as underscores) or, for
# static/mirror pods, a 32-hex config hash.
_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
# systemd: kubepods-pod<uid>.slice (guaranteed), kubepods-burstable-pod<uid>.slice,
# kubepods-besteffort-pod<uid>.slice. cgroupfs: pod<uid> below kubepods[/qos].
_POD_SYSTEMD = re.compile(rf"^kubepods(?:-burstable|-besteffort)?-pod({_UID})\.slice$")
_POD_CGROUPFS = re.compile(rf"^pod({_UID})$")
_SLURM_JOB = re.compile(r"^job_(\d+)$")


@dataclass(frozen=True, slots=True)
class CgroupIdentity:
    """The identity fields a cgroup path reveals. Empty string means not present."""

    container_id: str = ""
    container_runtime: str = ""
    k8s_pod_uid: str = ""
    slurm_job_id: str = ""

    def fields(self) -> dict[str, str]:
        """The non-empty fields, keyed by attribution identity field name."""
        out = {
            "container_id": self.container_id,
            "container_runtime": self.container_runtime,
            "k8s_pod_uid": self.k8s_pod_uid,
            "slurm_job_id": self.slurm_job_id,
        }
        if self.slurm_job_id:
            # The Slurm job is the job when nothing more specific says otherwise.
            out["job"] = self.slurm_job_id
        return {k: v for k, v in out.items() if v}


def _parse_path(path: str) -> CgroupIdentity:
    parts = [p for p in path.split("/") if p]
    container_id = runtime = pod_uid = slurm_job = ""
    in_kubepods = in_slurm = False
    for i, part in enumerate(parts):
        if part.startswith("kubepods"):
            in_kubepods = True
        if part.startswith("slurm"):
            # /slurm/..., /slurm_<node>/... (v1) and slurmstepd.scope (v2)
            in_slurm = True
        if not container_id:
            for pattern, name in _SCOPE_RUNTIMES:
                m = pattern.match(part)
                if m:
                    container_id, runtime = m.group(1), name
                    break
        if not container_id and i > 0 and parts[i - 1] in _PARENT_RUNTIMES:
            pattern, name = _PARENT_RUNTIMES[parts[i - 1]]
            m = pattern.match(part)
            if m:
                container_id, runtime = m.group(1), name
        if in_kubepods and not pod_uid:
            m = _POD_SYSTEMD.match(part) or _POD_CGROUPFS.match(part)
            if m:
                pod_uid = m.group(1).replace("_", "-")
                continue
        if pod_uid and not container_id:
            # cgroupfs driver: /kubepods/<qos>/pod<uid>/<id>; the runtime is not named.
            m = _BARE_ID.match(part)
            if m:
                container_id = m.group(1)
        if in_slurm and not slurm_job:
            m = _SLURM_JOB.match(part)
            if m:
                slurm_job = m.group(1)
    return CgroupIdentity(container_id, runtime, pod_uid, slurm_job)


def parse_cgroup(text: str) -> CgroupIdentity:
    """Parse the contents of /proc/<pid>/cgroup (v1, v2 or hybrid).

    Each line is `hierarchy-id:controllers:path`. Fields are merged over all lines, the
    first line that reveals a field wins; in practice every v1 hierarchy carries the same
    path, and v2 has a single line.
    """
    container_id = runtime = pod_uid = slurm_job = ""
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        ident = _parse_path(fields[2].strip())
        if not container_id and ident.container_id:
            container_id, runtime = ident.container_id, ident.container_runtime
        pod_uid = pod_uid or ident.k8s_pod_uid
        slurm_job = slurm_job or ident.slurm_job_id
    return CgroupIdentity(container_id, runtime, pod_uid, slurm_job)
