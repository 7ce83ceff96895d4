"""Who owns a GPU, for the owner labels of hardware alerts (`gpu_owner_info`).

An owner is the (user, project, job, Slurm job) of an attributed process on the GPU. Alerts join
`gpu_owner_info` on (instance, uuid), so it must have exactly one series per GPU, or the
join would be many-to-many and the rule would fail: several owners are folded into one
label set, each label's distinct values sorted and comma-separated ("alice,bob").

While a GPU is up its owners are those of its processes now; while it is down (no
processes can be read), those it had when it was last read, which the GPU inventory
(exporter.inventory) keeps, across restarts too.

Pure functions: this module must never do I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpu_audit.model.attribution import AttributedProcess

Owner = tuple[str, str, str, str]
"""(user, project, job, slurm_job) of one identity; "" where unknown."""

OWNER_LABELS: tuple[str, str, str, str] = ("user", "project", "job", "slurm_job")


def owners_of(procs: Iterable[AttributedProcess]) -> tuple[Owner, ...]:
    """The distinct owners of these processes, sorted; identities that name none of
    user, project, job or Slurm job (a bare container id) are no owner anyone can be
    told about."""
    found: set[Owner] = set()
    for ap in procs:
        a = ap.attribution
        owner = (a.user, a.project, a.job, a.slurm_job_id)
        if any(owner):
            found.add(owner)
    return tuple(sorted(found))


def owner_label_values(owners: Iterable[Owner]) -> tuple[str, str, str, str] | None:
    """The label values of one `gpu_owner_info` series for these owners: each label's
    distinct non-empty values, sorted and comma-separated; None when there is no owner."""
    owners = tuple(owners)
    if not owners:
        return None
    columns = zip(*owners, strict=True)
    user, project, job, slurm_job = (",".join(sorted({v for v in column if v}))
                                     for column in columns)
    return user, project, job, slurm_job
