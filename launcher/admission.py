"""What a valid submission (launcher/spec.py) must also satisfy to be queued: the admin's
policy and this node. Every problem is returned at once, each naming the job, the
numbers and the limit (its configuration key), so the client can print them all and
exit 2:

- at most `quotas.max_jobs_per_submission` jobs;
- each job's project is one its user may use: with `projects` (core.projects) configured,
  a listed project by its members only and no unlisted project but `default`; without,
  any name (a free label);
- each job's urgency is a level of `policy.urgency_levels` its user may use (the
  level's `groups`; admins may use every level);
- it can run on this node at all: no more GPUs than the node has, no more memory per GPU
  than its largest GPU ("needs 500 GiB, the largest GPU here has 80 GiB: it can never
  run"), no more running GPUs than its user's or project's limit allows;
- its user and project stay within `max_queued_jobs`;
- `after` ids name earlier jobs of the same owner that did not fail.

This module must never change anything: the engine queues the jobs only when it
returns no problem.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence

from launcher import reasons as r
from launcher.config import PolicyConfig, ProjectMembers, QuotaConfig
from launcher.spec import JobSpec, expansion_problems
from launcher.store import Store

FAILED_STATES = frozenset({"failed", "cancelled", "timed_out"})


def urgency_problems(specs: Sequence[JobSpec], policy: PolicyConfig,
                     groups: Collection[str], is_admin: bool) -> list[str]:
    out = []
    levels = policy.urgency_levels
    for s in specs:
        level = s.urgency or policy.default_urgency
        found = levels.get(level)
        if found is None:
            out.append(f"{s.name}: urgency {level!r} is not a level here (one of "
                       f"{', '.join(levels)}; policy.urgency_levels)")
        elif found.groups is not None and not is_admin and not set(found.groups) & set(groups):
            out.append(f"{s.name}: urgency {level!r} is for members of "
                       f"{', '.join(found.groups) or 'no group'} "
                       f"(policy.urgency_levels.{level}.groups)")
    return out


DEFAULT_PROJECT = "default"


def project_problems(specs: Sequence[JobSpec], owner: str, groups: Collection[str],
                     is_admin: bool, projects: Mapping[str, ProjectMembers]) -> list[str]:
    """Jobs naming a project their user may not use. With no membership configured
    (`projects` empty) every project is a free label; otherwise only listed projects
    (and `default`, unless listed) may be named, each by its members."""
    if not projects or is_admin:
        return []
    out = []
    mine = set(groups)
    for name in sorted({s.project for s in specs}):
        members = projects.get(name)
        if members is None:
            if name == DEFAULT_PROJECT:
                continue
            listed = ", ".join(sorted(projects)[:20])
            out.append(f"project {name!r} is not a project here (core.projects lists "
                       f"{listed}); leave `project:` out for the project "
                       f"{DEFAULT_PROJECT!r}, or ask the node's admin to add it")
        elif owner not in members.users and not mine & set(members.groups):
            out.append(f"project {name!r} is for {members.describe()} (core.projects."
                       f"{name}); {owner} is not a member: ask the node's admin to add "
                       "you to one of its groups or to its users")
    return out


def node_problems(specs: Sequence[JobSpec], node: Sequence[int]) -> list[str]:
    """Jobs that can never run on GPUs with these memory totals (bytes each)."""
    if not node:
        return []  # the GPUs were never read: nothing to compare with yet
    out = []
    largest = max(node)
    for s in specs:
        if s.gpus > len(node):
            out.append(f"{s.name}: needs {s.gpus} GPUs; this node has {len(node)}: it can "
                       "never run")
            continue
        m = s.gpu_memory_bytes
        if m is None or (m <= largest and (s.gpu_fraction is not None or s.gpus <= 1)):
            continue
        if s.gpu_fraction is not None or s.gpus <= 1:
            what = f"{r.gib(m)} on one GPU" + (f" for {s.gpu_fraction:g} of it"
                                               if s.gpu_fraction is not None else "")
            out.append(f"{s.name}: needs {what}; the largest GPU here has {r.gib(largest)}: "
                       "it can never run")
            continue
        enough = sum(1 for total in node if total >= m)
        if enough < s.gpus:
            out.append(f"{s.name}: needs {s.gpus} GPUs with {r.gib(m)} each; "
                       f"{enough} here have that much: it can never run")
    return out


def quota_problems(specs: Sequence[JobSpec], owner: str, quotas: QuotaConfig,
                   store: Store) -> list[str]:
    out = []
    for s in specs:
        for kind, who in (("user", owner), ("project", s.project)):
            limits = quotas.limits_for(kind, who)
            if limits.max_running_gpus is not None and s.gpu_share > limits.max_running_gpus:
                out.append(f"{s.name}: needs {s.gpu_share:g} GPUs; {kind} {who} may hold at "
                           f"most {limits.max_running_gpus:g} "
                           f"({quotas.key(kind, who, 'max_running_gpus')}): it can never run")
            elif limits.max_gpu_hours == 0 and s.gpu_share > 0:
                out.append(f"{s.name}: {kind} {who} has no GPU-hours "
                           f"({quotas.key(kind, who, 'max_gpu_hours')}): it can never run")
    return out + queued_problems(
        {"user": Counter({owner: len(specs)}), "project": Counter(s.project for s in specs)},
        quotas, store)


def queued_problems(new: Mapping[str, Counter[str]], quotas: QuotaConfig,
                    store: Store) -> list[str]:
    """The `max_queued_jobs` limits `new` more waiting jobs ({"user": {name: n},
    "project": {name: n}}) would pass."""
    waiting = store.waiting_counts()
    out = []
    for kind in ("user", "project"):
        for who, n in sorted(new.get(kind, Counter()).items()):
            limit = quotas.limits_for(kind, who).max_queued_jobs
            have = waiting[kind].get(who, 0)
            if limit is not None and have + n > limit:
                out.append(f"{kind} {who} has {have} jobs waiting; {n} more would pass the "
                           f"limit of {limit} ({quotas.key(kind, who, 'max_queued_jobs')})")
    return out


def dependency_problems(specs: Sequence[JobSpec], owner: str, store: Store) -> list[str]:
    wanted = sorted({i for s in specs for i in s.after_ids})
    if not wanted:
        return []
    known = store.owners(wanted)
    out = []
    for s in specs:
        for dep in s.after_ids:
            found = known.get(dep)
            if found is None:
                out.append(f"{s.name}: after: there is no job {dep}")
            elif found[0] != owner:
                out.append(f"{s.name}: after: job {dep} belongs to {found[0]}; `after` names "
                           "only your own jobs")
            elif found[1] in FAILED_STATES:
                out.append(f"{s.name}: after: job {dep} {found[1]}; retry it first "
                           f"(gpu-audit launcher retry {dep})")
    return out


def submission_problems(specs: Sequence[JobSpec], *,
                        owner: str, groups: Collection[str], is_admin: bool,
                        policy: PolicyConfig, quotas: QuotaConfig, node: Sequence[int],
                        store: Store,
                        projects: Mapping[str, ProjectMembers] | None = None) -> list[str]:
    """Every reason this submission may not be queued (empty: it may)."""
    if len(specs) > quotas.max_jobs_per_submission:
        return [f"{len(specs)} jobs in one submission; at most "
                f"{quotas.max_jobs_per_submission} (quotas.max_jobs_per_submission)"]
    expanded = expansion_problems(specs, quotas.max_expanded_bytes)
    if expanded:
        return expanded
    refused = project_problems(specs, owner, groups, is_admin, projects or {})
    if refused:  # quotas of a project one may not use are nobody's business
        return refused
    return [*urgency_problems(specs, policy, groups, is_admin),
            *node_problems(specs, node),
            *quota_problems(specs, owner, quotas, store),
            *dependency_problems(specs, owner, store)]
