"""PromQL building blocks shared by the recording and alerting rules.

The label sets every rule aggregates by, the idle threshold and the rules a bill reads are
gpu_audit.rules' (one definition for every component). The exporter's
`job` label is the workload's job (Prometheus must scrape it with `honor_labels: true`,
see alerts/README.md); `instance` is the node.
"""

from __future__ import annotations

from alerts.params import Params
from gpu_audit.rules import promql_number


def sel(p: Params, *matchers: str) -> str:
    """A series selector's matchers, with `simulated!="true"` unless the params count
    simulated data (it also matches series that have no such label)."""
    parts = list(matchers)
    if not p.include_simulated:
        parts.insert(0, 'simulated!="true"')
    return "{" + ", ".join(parts) + "}" if parts else ""


def alternation(values: list[str] | list[int]) -> str:
    """A regex matching exactly these values."""
    return "|".join(str(v) for v in values)


num = promql_number  # a number as PromQL and people read it, exactly


def indent(expr: str, by: str = "  ") -> str:
    """Each line of `expr` indented (a sub-expression of a multi-line rule)."""
    return "\n".join(by + line for line in expr.splitlines())


def owners(p: Params, lookback: str | None = None) -> str:
    """One series per GPU naming who holds (or last held) it: `gpu_owner_info`, which the
    exporter keeps for a GPU that is down (the owners when it was last read, across
    restarts). With `lookback`, the most recent owners seen within it, for a GPU that is
    no longer reported at all."""
    info = f"gpu_owner_info{sel(p)}"
    if lookback is None:
        return info
    # the owner label set seen last in the lookback: one per GPU, as the join needs
    return (f"(topk by (instance, uuid) (1, "
            f"max_over_time(timestamp({info})[{lookback}:{p.alerting_interval}])) * 0 + 1)")


def with_owner(p: Params, expr: str, lookback: str | None = None) -> str:
    """`expr` (one series per GPU, or per GPU and reason/xid...) with the owner's `user`,
    `project` and `job` joined on where the GPU has an owner, and unchanged where it has
    none. gpu_owner_info has exactly one series per GPU (several owners' values are
    comma-separated), so the join can never be many-to-many."""
    owner = owners(p, lookback)
    body = f"(\n{indent(expr)}\n)"
    return (f"{body}\n* on (instance, uuid) group_left ({OWNER_LABELS}) {owner}\n"
            f"or\n{body}\nunless on (instance, uuid) {owner}")


OWNER_LABELS = "user, project, job, slurm_job"
"""The owner labels hardware alerts carry (from gpu_owner_info)."""
