"""Capacity figures from Slurm alone (`gpu-audit capacity --source slurm`): what Slurm
knows, and a plain statement of what it does not.

- allocated: sacct's runs (chargeback.sources.slurm.read_sacct: AllocTRES gres/gpu x
  the run's time), cut into the bins;
- installed: the GPUs (`Gres=gpu[:type]:N`) of the nodes `scontrol show node -o` lists
  *now*, taken as installed over the whole period (Slurm keeps no history of a node's
  Gres that this reads);
- down: not known over the period (node down/drain history is not read); the nodes
  DOWN, DRAIN or FAIL *now* and their GPUs are said in a note;
- busy and held idle: not known (Slurm schedules GPUs; it does not measure them: the
  archive or Prometheus do).

Pure: the app layer runs sacct (chargeback.sources.slurm.read_sacct) and scontrol
(chargeback.sources.slurm.read_nodes) and hands their output here; never writes to Slurm.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from chargeback.capacity.model import Bin, Figures
from chargeback.sources.slurm import SacctData
from gpu_audit import slurmcmd

# figures a Slurm-only report cannot give (written empty, named in the sentence)
NOT_KNOWN = ("busy", "held_idle", "down")
# one gres entry: gpu:N or gpu:TYPE:N, then an optional (S:0-1) or (IDX:...) suffix
_GRES = re.compile(r"^gpu(?::([^:(]+))?:(\d+)(?:\(.*\))?$")
_DOWN = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "MAINT")


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    gpus: int
    gpu_type: str  # the gres type, "" when untyped
    state: str

    @property
    def down(self) -> bool:
        words = re.split(r"[+*~#$@%!^-]", self.state.upper())
        return any(w.startswith(_DOWN) for w in words)


def node_gpus(gres: str) -> tuple[int, str]:
    """GPUs and their type from a node's Gres (`gpu:a100:4(S:0-1),shard:8` -> 4, a100);
    (0, "") without GPUs."""
    total, kind = 0, ""
    for entry in (gres or "").split(","):
        m = _GRES.match(entry.strip())
        if m:
            total += int(m.group(2))
            kind = kind or (m.group(1) or "")
    return total, kind


def parse_nodes(text: str) -> list[Node]:
    """Every node of `scontrol show node -o` output with its GPUs and state."""
    nodes = []
    for line in text.splitlines():
        if not line.strip():
            continue
        kv = slurmcmd.key_values(line)
        if "NodeName" not in kv:
            continue
        gpus, kind = node_gpus(kv.get("Gres", ""))
        nodes.append(Node(kv["NodeName"], gpus, kind, kv.get("State", "")))
    return nodes


def model_name(nodes: Sequence[Node]) -> str:
    """The report's one GPU model: the gres type when every GPU node names the same one,
    else a name saying the GPUs are Slurm's gres/gpu of mixed or no type."""
    kinds = {n.gpu_type for n in nodes if n.gpus}
    if len(kinds) == 1 and "" not in kinds:
        return f"gres/gpu:{kinds.pop()}"
    return "gres/gpu (all types)"


def slurm_bins(start: datetime, end: datetime, bin_seconds: float, sacct: SacctData, *,
               nodes: Sequence[Node], now: float) -> tuple[list[Bin], list[str]]:
    """Bins of [start, end): installed = the nodes' GPUs now x the bin's time inside
    [start, min(end, now)) (a bin reaching past now is that long); allocated = sacct's
    runs inside the bin (capped at installed, said when it was). A bin after now is
    None (not known yet). Notes say what is assumed and what is not known."""
    gpus = sum(n.gpus for n in nodes)
    model = model_name(nodes)
    step = int(bin_seconds)
    lo, hi = start.timestamp(), end.timestamp()
    edges: list[tuple[float, float]] = []
    t = lo
    while t < hi:
        u = min((int(t) // step + 1) * step, hi)
        edges.append((t, u))
        t = u
    alloc = [0.0] * len(edges)
    for r in sacct.runs:
        for i, (a, b) in enumerate(edges):
            if r.end <= a:
                break
            overlap = min(b, r.end) - max(a, r.start)
            if overlap > 0:
                alloc[i] += r.gpus * overlap
    bins: list[Bin] = []
    capped = 0
    for (a, b), held in zip(edges, alloc, strict=True):
        known = min(b, now) - a
        when = datetime.fromtimestamp(a, tz=UTC)
        if known <= 0 or gpus == 0:
            bins.append(Bin(when, b - a, None))
            continue
        installed = gpus * known
        allocated = held
        if held > installed * (1 + 1e-9):
            capped += 1
            allocated = installed
        # a bin that reaches past now counts its known part only (its length included)
        bins.append(Bin(when, min(known, b - a),
                        {model: Figures(installed=installed, allocated=allocated)}))
    down = [n for n in nodes if n.down]
    notes = [
        f"Slurm: installed is the {gpus} GPU(s) of the {sum(1 for n in nodes if n.gpus)} "
        "node(s) `scontrol show node` lists now, taken as installed over the whole "
        "period (Slurm keeps no history of a node's Gres that this reads); allocated is "
        "sacct's AllocTRES gres/gpu x run time",
        "Slurm: busy and held-idle time are not known (Slurm allocates GPUs, it does not "
        "measure them: --source archive or prometheus do), nor down time over the period "
        "(node down/drain history is not read): written empty, not 0",
    ]
    if down:
        notes.append("Slurm now: " + ", ".join(
            f"{n.name} {n.state} ({n.gpus} GPU(s))" for n in down)
            + f": {sum(n.gpus for n in down)} of {gpus} GPU(s) on nodes down or drained now")
    if capped:
        notes.append(f"Slurm: {capped} bin(s) had more GPUs allocated than the nodes have "
                     "now (nodes removed or shrunk since?): capped at installed")
    if sacct.unstarted:
        notes.append(f"Slurm: {len(sacct.unstarted)} run(s) with GPUs have no start time "
                     "in sacct and count 0 GPU-hours: " + ", ".join(
                         j for j, _ in sacct.unstarted[:10]))
    return bins, notes
