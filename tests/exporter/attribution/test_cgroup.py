"""cgroup path parsing for every container runtime, Kubernetes QoS class and cgroup
driver, and Slurm, on cgroup v1 and v2 lines as the kernel writes them."""

from __future__ import annotations

import pytest

from exporter.attribution.cgroup import CgroupIdentity, parse_cgroup

CID = "0a1b22ec1361a97c3511db37a4bae932d41b22264e5b97611748f8b662312574"
POD = "fbc202d3-da21-11e8-ab5e-42010a80014b"
POD_SYSTEMD = POD.replace("-", "_")

CASES: list[tuple[str, str, CgroupIdentity]] = [
    # -- plain containers ------------------------------------------------------
    ("docker_v2_systemd", f"0::/system.slice/docker-{CID}.scope\n",
     CgroupIdentity(CID, "docker")),
    ("docker_v1_cgroupfs",
     f"12:memory:/docker/{CID}\n11:cpu,cpuacct:/docker/{CID}\n1:name=systemd:/docker/{CID}\n",
     CgroupIdentity(CID, "docker")),
    ("docker_v1_systemd",
     f"7:memory:/system.slice/docker-{CID}.scope\n1:name=systemd:/system.slice/docker-{CID}.scope\n",
     CgroupIdentity(CID, "docker")),
    ("docker_rootless_v2",
     f"0::/user.slice/user-1000.slice/user@1000.service/app.slice/docker-{CID}.scope\n",
     CgroupIdentity(CID, "docker")),
    ("podman_v2_systemd", f"0::/machine.slice/libpod-{CID}.scope/container\n",
     CgroupIdentity(CID, "podman")),
    ("podman_rootless_v2",
     f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope/container\n",
     CgroupIdentity(CID, "podman")),
    ("podman_v1_cgroupfs", f"4:memory:/libpod_parent/libpod-{CID}\n",
     CgroupIdentity(CID, "podman")),
    ("podman_conmon_is_not_the_container", f"0::/machine.slice/libpod-conmon-{CID}.scope\n",
     CgroupIdentity()),
    ("nerdctl_v2", f"0::/system.slice/nerdctl-{CID}.scope\n", CgroupIdentity(CID, "containerd")),
    # -- Kubernetes, systemd driver, every QoS class, every CRI runtime ------------
    ("k8s_guaranteed_containerd_v2",
     f"0::/kubepods.slice/kubepods-pod{POD_SYSTEMD}.slice/cri-containerd-{CID}.scope\n",
     CgroupIdentity(CID, "containerd", POD)),
    ("k8s_burstable_containerd_v2",
     "0::/kubepods.slice/kubepods-burstable.slice/"
     f"kubepods-burstable-pod{POD_SYSTEMD}.slice/cri-containerd-{CID}.scope\n",
     CgroupIdentity(CID, "containerd", POD)),
    ("k8s_besteffort_crio_v2",
     "0::/kubepods.slice/kubepods-besteffort.slice/"
     f"kubepods-besteffort-pod{POD_SYSTEMD}.slice/crio-{CID}.scope\n",
     CgroupIdentity(CID, "cri-o", POD)),
    ("k8s_crio_conmon_is_not_the_container",
     "0::/kubepods.slice/kubepods-besteffort.slice/"
     f"kubepods-besteffort-pod{POD_SYSTEMD}.slice/crio-conmon-{CID}.scope\n",
     CgroupIdentity("", "", POD)),
    ("k8s_burstable_docker_v1_systemd",
     "11:memory:/kubepods.slice/kubepods-burstable.slice/"
     f"kubepods-burstable-pod{POD_SYSTEMD}.slice/docker-{CID}.scope\n"
     "1:name=systemd:/kubepods.slice/kubepods-burstable.slice/"
     f"kubepods-burstable-pod{POD_SYSTEMD}.slice/docker-{CID}.scope\n",
     CgroupIdentity(CID, "docker", POD)),
    # -- Kubernetes, cgroupfs driver (runtime not named in the path) ---------------
    ("k8s_guaranteed_cgroupfs_v1", f"6:memory:/kubepods/pod{POD}/{CID}\n",
     CgroupIdentity(CID, "", POD)),
    ("k8s_burstable_cgroupfs_v1", f"6:memory:/kubepods/burstable/pod{POD}/{CID}\n",
     CgroupIdentity(CID, "", POD)),
    ("k8s_besteffort_cgroupfs_v2", f"0::/kubepods/besteffort/pod{POD}/{CID}\n",
     CgroupIdentity(CID, "", POD)),
    ("k8s_static_pod_hash_uid",
     "0::/kubepods.slice/kubepods-burstable.slice/"
     f"kubepods-burstable-pod5b4b8b3a0c2e4e5f9a1b2c3d4e5f6a7b.slice/cri-containerd-{CID}.scope\n",
     CgroupIdentity(CID, "containerd", "5b4b8b3a0c2e4e5f9a1b2c3d4e5f6a7b")),
    # -- Slurm ----------------------------------------------------------------------
    ("slurm_v1", "10:devices:/slurm/uid_1000/job_4242/step_0/task_0\n"
                 "4:memory:/slurm/uid_1000/job_4242/step_0/task_0\n1:name=systemd:/user.slice\n",
     CgroupIdentity(slurm_job_id="4242")),
    ("slurm_v1_multiple_slurmd", "4:memory:/slurm_node07/uid_1000/job_77/step_batch\n",
     CgroupIdentity(slurm_job_id="77")),
    ("slurm_v2", "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n",
     CgroupIdentity(slurm_job_id="4242")),
    ("slurm_v2_container_in_job",
     f"0::/system.slice/slurmstepd.scope/job_9/step_0/user/task_0/docker-{CID}.scope\n",
     CgroupIdentity(CID, "docker", "", "9")),
    # -- nothing to say -----------------------------------------------------------
    ("bare_process_v2", "0::/user.slice/user-1000.slice/session-3.scope\n", CgroupIdentity()),
    ("root_v2", "0::/\n", CgroupIdentity()),
    ("job_dir_outside_slurm_is_not_a_job", "0::/system.slice/job_12/step_0\n", CgroupIdentity()),
    ("garbage", "no colons here\n\x00\xff::\n", CgroupIdentity()),
    ("empty", "", CgroupIdentity()),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_cgroup_line_reveals_runtime_pod_and_job(text: str, expected: CgroupIdentity) -> None:
    """Each real-world cgroup layout yields exactly its container id, runtime, pod UID
    (dashes, even from the systemd driver's underscores) and Slurm job, and nothing else."""
    assert parse_cgroup(text) == expected


def test_slurm_cgroup_gives_job_field_too() -> None:
    """A Slurm job cgroup names the job (job field) as well as slurm_job_id."""
    fields = parse_cgroup("0::/system.slice/slurmstepd.scope/job_5/step_0\n").fields()
    assert fields == {"slurm_job_id": "5", "job": "5"}


def test_fields_omit_unknowns() -> None:
    """fields() lists only what the path revealed, so precedence can fall through."""
    assert parse_cgroup(f"0::/system.slice/docker-{CID}.scope").fields() == {
        "container_id": CID,
        "container_runtime": "docker",
    }
