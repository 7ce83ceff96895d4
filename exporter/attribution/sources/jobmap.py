"""The `jobmap` attribution source: the job-mapping directory written by the launcher and
Slurm prologs, read by exporter/attribution/jobmap.py's `JobMap`. It must never raise
for one process: an ambiguous answer is counted and left out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from exporter.attribution.config import AttributionConfig
from exporter.attribution.jobmap import JobMap
from exporter.attribution.sources.base import NO_ANSWER, Query
from gpu_audit.model.attribution import SOURCE_JOBMAP


class JobMapSource:
    """The job-mapping directory written by the launcher and Slurm prologs."""

    name = SOURCE_JOBMAP
    proc_needs: frozenset[str] = frozenset()

    def __init__(self, config: AttributionConfig, wall_clock: Callable[[], float]) -> None:
        self._jobmap = JobMap(
            config.jobmap_dir,
            max_file_bytes=config.jobmap_max_file_bytes,
            max_value_length=config.environ_value_max_length,
            wall_clock=wall_clock,
        )
        self._ambiguous = 0

    def begin_cycle(self) -> int:
        self._jobmap.refresh()
        return self._jobmap.generation

    def resolve(self, query: Query) -> Mapping[str, str]:
        record, ambiguous = self._jobmap.lookup(query.process.pid, query.uuids)
        if ambiguous:
            self._ambiguous += 1
        return record.fields if record is not None else NO_ANSWER

    def stats(self) -> Mapping[str, int]:
        return {
            "jobmap_errors": self._jobmap.errors,
            "jobmap_reloads": self._jobmap.reloads,
            "jobmap_ambiguous": self._ambiguous,
        }

    def close(self) -> None:
        return None
