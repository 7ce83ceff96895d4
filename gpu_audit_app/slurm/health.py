"""`gpu-audit slurm health`: a node health check for GPUs that fall off (XID 79 and the
like). deploy/slurm/healthcheck.sh (Slurm's HealthCheckProgram) runs it when the node's
exporter reports a GPU down.

For every GPU the node's exporter reports down (`gpu_up == 0`), it drains the node
(`scontrol update NodeName=... State=DRAIN Reason="gpu-audit: GPU 0 (GPU-...) lost:
XID 79"`) so nothing new lands there, then requeues the jobs the job-mapping files say
hold that GPU (`scontrol requeue`): Slurm signals them (gpu_audit_ckpt checkpoints on
the signal where it still can) and they start again on another node, from their newest
checkpoint. Jobs on the node's healthy GPUs keep running; resuming the node after the
repair is the admin's (`scontrol update NodeName=... State=RESUME`).

It never drains on a guess: an exporter it cannot read is reported and nothing is done.
Like every command that changes a system, it only prints what it would do unless
`--apply` (healthcheck.sh passes it).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from prometheus_client.parser import text_string_to_metric_families

from gpu_audit import slurmcmd
from gpu_audit.errors import EXIT_FAILURE, EXIT_OK

DEFAULT_EXPORTER = "http://127.0.0.1:9945"
REASON_PREFIX = "gpu-audit:"
_MAX_METRICS_BYTES = 64 * 1024 * 1024


@dataclass
class LostGpu:
    index: str
    uuid: str
    xids: list[int] = field(default_factory=list)

    def reason(self) -> str:
        xid = f": XID {', '.join(str(x) for x in sorted(self.xids))}" if self.xids else ""
        return f"{REASON_PREFIX} GPU {self.index} ({self.uuid}) lost{xid}"


def lost_gpus(metrics: str) -> list[LostGpu]:
    """The GPUs an exposition reports down, with the XIDs seen on them."""
    lost: dict[str, LostGpu] = {}
    xids: dict[str, list[int]] = {}
    for family in text_string_to_metric_families(metrics):
        if family.name == "gpu_up":
            for s in family.samples:
                if s.value == 0 and s.labels.get("uuid"):
                    lost[s.labels["uuid"]] = LostGpu(s.labels.get("gpu", "?"), s.labels["uuid"])
        elif family.name == "gpu_xid_errors":  # the parser drops _total from counters
            for s in family.samples:
                if s.name.endswith("_total") and s.value > 0 and s.labels.get("xid", "").isdigit():
                    xids.setdefault(s.labels.get("uuid", ""), []).append(int(s.labels["xid"]))
    for uuid, gpu in lost.items():
        gpu.xids = xids.get(uuid, [])
    return sorted(lost.values(), key=lambda g: g.index)


def jobs_on(jobmap_dir: Path, uuids: set[str]) -> dict[str, set[str]]:
    """Slurm job id -> the lost GPUs it holds, from the prolog's job-mapping files."""
    out: dict[str, set[str]] = {}
    try:
        names = sorted(os.listdir(jobmap_dir))
    except OSError:
        return out
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            fd = os.open(jobmap_dir / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as fh:
                doc = orjson.loads(fh.read(64 * 1024))
        except (OSError, ValueError):
            continue
        if not isinstance(doc, Mapping):
            continue
        job = doc.get("slurm_job_id")
        held = {g for g in doc.get("gpus", []) if isinstance(g, str)} & uuids
        if isinstance(job, str | int) and str(job).isdigit() and held and doc.get(
                "end_time") is None:
            out.setdefault(str(job), set()).update(held)
    return out


def _fetch(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"{url!r} is not an http(s) URL")
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=10) as resp:  # noqa: S310
        return str(resp.read(_MAX_METRICS_BYTES).decode("utf-8", errors="replace"))


def health(args: argparse.Namespace) -> int:
    env = os.environ
    url = args.exporter or env.get("GPU_AUDIT_EXPORTER_URL") or DEFAULT_EXPORTER
    node = args.node or env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    jobmap_dir = Path(args.jobmap_dir or env.get("GPU_AUDIT_JOBMAP_DIR")
                      or "/run/gpu-audit/jobs")
    try:
        lost = lost_gpus(_fetch(url))
    except (OSError, urllib.error.URLError, ValueError) as exc:
        print(f"gpu-audit slurm health: cannot read {url}/metrics ({exc}); node {node} "
              "left as it is", file=sys.stderr)
        return EXIT_FAILURE
    if args.dry_run:
        print("gpu-audit slurm health: --dry-run is deprecated (a dry run is the default; "
              "--apply acts)", file=sys.stderr)
    if not lost:
        return EXIT_OK
    dry_run = not args.apply
    act = "would" if dry_run else "will"
    ok = True
    reason = "; ".join(g.reason() for g in lost)
    print(f"node {node}: {reason}")
    try:
        current = slurmcmd.key_values(slurmcmd.run("scontrol", ["-o", "show", "node", node]))
    except slurmcmd.SlurmCommandError as exc:
        print(f"gpu-audit slurm health: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    drained = "DRAIN" in current.get("State", "") and current.get("Reason", "").startswith(
        REASON_PREFIX)
    if drained:
        print(f"node {node}: already drained ({current.get('Reason')})")
    else:
        print(f"node {node}: {act} drain")
        if not dry_run:
            try:
                slurmcmd.run("scontrol", ["update", f"NodeName={node}", "State=DRAIN",
                                          f"Reason={reason}"])
            except slurmcmd.SlurmCommandError as exc:
                ok = False
                print(f"gpu-audit slurm health: drain failed: {exc}", file=sys.stderr)
    if not args.no_requeue:
        for job, uuids in sorted(jobs_on(jobmap_dir, {g.uuid for g in lost}).items()):
            print(f"job {job} holds {', '.join(sorted(uuids))}: {act} requeue")
            if dry_run:
                continue
            try:
                slurmcmd.run("scontrol", ["requeue", job])
            except slurmcmd.SlurmCommandError as exc:
                ok = False
                print(f"gpu-audit slurm health: requeue of job {job} failed: {exc}",
                      file=sys.stderr)
    if dry_run:
        print("dry run: nothing changed (--apply acts)", file=sys.stderr)
    return EXIT_OK if ok else EXIT_FAILURE
