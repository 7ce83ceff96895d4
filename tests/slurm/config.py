"""The test cluster's configuration files, rendered from one layout: slurm.conf, gres.conf,
cgroup.conf, slurmdbd.conf and the Prolog/Epilog hooks. docs/SLURM.md shows the same
settings as the recipe for a staging cluster; a change here is a change there.

Pure: `render()` returns path -> (text, mode); tests/slurm/cluster.py writes them.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SLURM_DEPLOY = REPO / "deploy" / "slurm"

NODES = ("n1", "n2")
GPUS_PER_NODE = 2
CPUS_PER_NODE = 8
# The low partition's GraceTime: preempted jobs get SIGTERM (and --signal's signal) at
# once and SIGKILL this much later.
GRACE_SECONDS = 15
# How long a step credential lives, and so how long a requeued job waits before it may
# start again (120 s by default): short, so a requeue costs the suite seconds.
CRED_EXPIRE = 10
DB_NAME = "slurm_acct_db"
# slurmd runs the health check this often (it reads the node exporter's /metrics once)
HEALTH_CHECK_SECONDS = 5


def gpu_uuid(node: str, index: int) -> str:
    """The simulated GPU's UUID: stable, and naming its node and index for a reader."""
    number = NODES.index(node) * GPUS_PER_NODE + index
    return f"GPU-5107a000-0000-4000-8000-{number:012x}"


@dataclass(frozen=True)
class Layout:
    root: Path
    cluster_name: str
    host: str  # this machine's host name: every node's NodeHostname
    ports: Mapping[str, int]  # slurmctld, slurmdbd, mariadb, and one per node
    munge_socket: Path
    db_password: str
    accounting: bool = True

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def hooks(self) -> Path:
        return self.root / "hooks"


def render(layout: Layout) -> dict[Path, tuple[str, int]]:
    out = {
        layout.etc / "slurm.conf": (slurm_conf(layout), 0o644),
        layout.etc / "gres.conf": (gres_conf(layout), 0o644),
        # read by the cgroup plugins only; proctrack/linuxproc and task/none need none,
        # but slurmd looks for the file
        layout.etc / "cgroup.conf": ("CgroupPlugin=autodetect\n", 0o644),
        **{path: (text, 0o755) for path, text in hooks(layout).items()},
    }
    if layout.accounting:
        out[layout.etc / "slurmdbd.conf"] = (slurmdbd_conf(layout), 0o600)
    return out


def slurm_conf(layout: Layout) -> str:
    r, p = layout.root, layout.ports
    accounting = ""
    if layout.accounting:
        accounting = (
            "AccountingStorageType=accounting_storage/slurmdbd\n"
            "AccountingStorageHost=127.0.0.1\n"
            f"AccountingStoragePort={p['slurmdbd']}\n"
            # the munge socket of connections to slurmdbd (AuthInfo is not used there)
            f"AccountingStoragePass={layout.munge_socket}\n"
            # GPU-hours in sacct: AllocTRES gres/gpu=N
            "AccountingStorageTRES=gres/gpu\n"
            "JobAcctGatherType=jobacct_gather/none\n")
    node_lines = "".join(
        f"NodeName={n} NodeHostname={layout.host} NodeAddr=127.0.0.1 Port={p[n]} "
        f"CPUs={CPUS_PER_NODE} RealMemory=2000 Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN\n"
        for n in NODES)
    nodes = ",".join(NODES)
    return f"""# gpu-audit test cluster {layout.cluster_name} (tests/slurm; docs/SLURM.md)
ClusterName={layout.cluster_name}
SlurmctldHost={layout.host}(127.0.0.1)
SlurmctldPort={p['slurmctld']}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={layout.munge_socket},cred_expire={CRED_EXPIRE}
CredType=cred/munge
StateSaveLocation={r / 'state'}
SlurmdSpoolDir={r / 'spool'}/%n
SlurmctldPidFile={r / 'run'}/slurmctld.pid
SlurmdPidFile={r / 'run'}/slurmd-%n.pid
SlurmctldLogFile={r / 'log'}/slurmctld.log
SlurmdLogFile={r / 'log'}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# two slurmd on one host with made-up CPU counts
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
# the job's --signal (USR1 from sbatch-checkpoint.sh) at preemption too, not only
# before the time limit
SlurmctldParameters=preempt_send_user_signal
JobRequeue=1
ReturnToService=2
MinJobAge=300
KillWait=5
MessageTimeout=10
BatchStartTimeout=20
InactiveLimit=0
Waittime=0
UnkillableStepTimeout=30
PrologFlags=Alloc
Prolog={layout.hooks}/prolog.sh
Epilog={layout.hooks}/epilog.sh
HealthCheckProgram={layout.hooks}/healthcheck.sh
HealthCheckInterval={HEALTH_CHECK_SECONDS}
{accounting}{node_lines}PartitionName=low Nodes={nodes} Default=YES PriorityTier=1 \
PreemptMode=REQUEUE GraceTime={GRACE_SECONDS} MaxTime=INFINITE State=UP
PartitionName=high Nodes={nodes} PriorityTier=10 PreemptMode=OFF MaxTime=INFINITE State=UP
"""


def gres_conf(layout: Layout) -> str:
    last = GPUS_PER_NODE - 1
    return "".join(f"NodeName={n} Name=gpu File={layout.root / 'dev' / n}/nvidia[0-{last}]\n"
                   for n in NODES)


def slurmdbd_conf(layout: Layout) -> str:
    r, p = layout.root, layout.ports
    return f"""AuthType=auth/munge
AuthInfo=socket={layout.munge_socket}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={p['slurmdbd']}
SlurmUser=root
PidFile={r / 'run'}/slurmdbd.pid
LogFile={r / 'log'}/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={p['mariadb']}
StorageUser=slurm
StoragePass={layout.db_password}
StorageLoc={DB_NAME}
"""


def hooks(layout: Layout) -> dict[Path, str]:
    """Prolog/Epilog as slurm.conf names them: the shipped scripts with this cluster's
    per-node directories (a site keeps the defaults under /run and /var/lib/gpu-audit),
    and the simulated GPUs' index -> UUID table standing in for nvidia-smi."""
    smi_cases = "".join(
        f"  {n}) printf '%s\\n' "
        + " ".join(f"'{i}, {gpu_uuid(n, i)}'" for i in range(GPUS_PER_NODE)) + " ;;\n"
        for n in NODES)
    nodes = layout.root / "nodes"
    env = f"""export SLURM_CONF="{layout.etc / 'slurm.conf'}"
export GPU_AUDIT_JOBMAP_DIR="{layout.root / 'jobmap'}/$SLURMD_NODENAME"
export GPU_AUDIT_SLURM_EVENTS_DIR="{layout.root / 'events'}/$SLURMD_NODENAME"
export GPU_AUDIT_NVIDIA_SMI="{layout.hooks / 'nvidia-smi'}"
export GPU_AUDIT_BIN="{sys.executable} -m gpu_audit_app"
export GPU_AUDIT_SLURM_DIR="{nodes}/$SLURMD_NODENAME/slurm"
export GPU_AUDIT_SLURM_ADMIN_COMMENT=1
# the node's exporter configuration, once tests/slurm/conftest.py started it
if [ -f "{nodes}/$SLURMD_NODENAME/config.yaml" ]; then
  export GPU_AUDIT_CONFIG="{nodes}/$SLURMD_NODENAME/config.yaml"
fi
"""
    out = {layout.hooks / "nvidia-smi": f"""#!/bin/sh
# This node's simulated GPUs, as `nvidia-smi --query-gpu=index,uuid --format=csv,noheader`
case "$SLURMD_NODENAME" in
{smi_cases}  *) echo "no simulated GPUs for node '$SLURMD_NODENAME'" >&2; exit 9 ;;
esac
"""}
    # the health check needs the node's exporter, whose port is known once it runs
    # (tests/slurm/conftest.py writes it to nodes/<node>/exporter.url)
    log = layout.root / "log"
    out[layout.hooks / "healthcheck.sh"] = f"""#!/bin/sh
url_file="{nodes}/$SLURMD_NODENAME/exporter.url"
[ -f "$url_file" ] || exit 0
GPU_AUDIT_EXPORTER_URL=$(cat "$url_file")
export GPU_AUDIT_EXPORTER_URL
{env}exec "{SLURM_DEPLOY / 'healthcheck.sh'}" >>"{log}/healthcheck-$SLURMD_NODENAME.log" 2>&1
"""
    for hook in ("prolog", "epilog"):
        # what the scripts print goes to a log per node (slurmd keeps none of it)
        out[layout.hooks / f"{hook}.sh"] = f"""#!/bin/sh
{env}exec "{SLURM_DEPLOY / f'{hook}.sh'}" >>"{log}/{hook}-$SLURMD_NODENAME.log" 2>&1
"""
    return out
