"""Which waiting jobs the scheduler may consider now, and why the others wait; which
jobs a retry brings back.

- `classify(store, now, waiting, gate)`: held jobs, jobs whose `after` jobs have not
  succeeded (naming each and its state), jobs in their retry backoff (until when, after
  what), jobs the gate holds back (replay's absent owners) get their reason
  (launcher/reasons.py); the rest go to the scheduler, which gives the reasons of those
  it cannot start.
- `retry_chain(store, job)`: a failed job and the jobs its failure cancelled, its
  dependents transitively, so a pipeline resumes from the step that failed.

It reads the store and never changes it: the engine stores what comes back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from launcher import reasons as r
from launcher.store import JobRecord, Store

Gate = Callable[[JobRecord, float], "tuple[str, str] | None"]


def classify(store: Store, now: float, waiting: Sequence[JobRecord], gate: Gate | None
             ) -> tuple[list[JobRecord], dict[int, tuple[str, str]]]:
    """(jobs the scheduler may consider now, the reason of each of the others)."""
    deps = store.states(i for j in waiting for i in j.after_ids)
    unmet_ids = {i for j in waiting for i in j.after_ids if deps.get(i) != "succeeded"}
    names = {i: v[2] for i, v in store.owners(unmet_ids).items()} if unmet_ids else {}
    ok: list[JobRecord] = []
    why: dict[int, tuple[str, str]] = {}
    for j in waiting:
        unmet = [i for i in j.after_ids if deps.get(i) != "succeeded"]
        if j.state == "held":
            why[j.id] = (r.HELD, f"held; `gpu-audit launcher release {j.id}` lets it run")
        elif unmet:
            why[j.id] = (r.DEPENDENCY, r.cut("waiting for job " + r.listed(
                [f"{i} ({names.get(i, '?')}: {deps.get(i, 'gone')})" for i in unmet])))
        elif j.backoff_until > now:
            why[j.id] = (r.BACKOFF, r.cut(f"backoff until {r.clock(j.backoff_until)} "
                                          f"after {j.reason or 'a failure'}"))
        elif gate is not None and (gated := gate(j, now)) is not None:
            why[j.id] = gated
        else:
            ok.append(j)
    return ok, why


def retry_chain(store: Store, job: JobRecord) -> list[JobRecord]:
    """`job` and the jobs cancelled because a job of the chain failed (their reason says
    so: the engine writes "dependency job N <state>"), in the order found."""
    chain = [job]
    ids = {job.id}
    i = 0
    while i < len(chain):
        for dep in store.dependents(chain[i].id):
            if dep.id not in ids and dep.state == "cancelled" \
                    and dep.reason.startswith("dependency job "):
                chain.append(dep)
                ids.add(dep.id)
        i += 1
    return chain
