"""Attribution sources by name: the one place a source is added.

`SOURCES` maps every name `attribution.sources` may list to the builder of its source;
`build_sources(config)` builds the configured names in their order of precedence. The
resolver never dispatches on names: it asks the list it is given.

To add a source (docs/CONTRIBUTING.md has the recipe): write a class implementing
`AttributionSource` (exporter/attribution/sources/base.py) in a module of its own under
exporter/attribution/sources/ (as `jobmap.py`'s `JobMapSource`), add its name to
`gpu_audit.model.attribution.ALL_SOURCES` (records and labels carry it, and the
configuration accepts only those names), and add one line to `SOURCES` here.
tests/exporter/attribution/test_registry.py fails while the two lists disagree.

A builder returns None when its source could never answer under this configuration
(the kubelet source while `kubelet.enabled` is off). This module reads nothing itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from exporter.attribution.config import AttributionConfig
from exporter.attribution.sources.base import AttributionSource
from exporter.attribution.sources.cgroup import CgroupSource
from exporter.attribution.sources.environ import EnvironSource
from exporter.attribution.sources.jobmap import JobMapSource
from exporter.attribution.sources.kubelet import KubeletSource
from exporter.attribution.sources.owner import OwnerSource
from exporter.attribution.users import CachedLookup, UserLookup, passwd_file_lookup, system_lookup
from gpu_audit.model.attribution import (
    SOURCE_CGROUP,
    SOURCE_ENVIRON,
    SOURCE_JOBMAP,
    SOURCE_KUBELET,
    SOURCE_OWNER,
)


@dataclass(frozen=True)
class SourceContext:
    """What a builder may use: the attribution configuration, the clocks (monotonic for
    refresh periods, wall for job start and end times) and the uid -> name lookup."""

    config: AttributionConfig
    clock: Callable[[], float]
    wall_clock: Callable[[], float]
    users: UserLookup


SourceBuilder = Callable[[SourceContext], AttributionSource | None]

SOURCES: Mapping[str, SourceBuilder] = {
    SOURCE_JOBMAP: lambda ctx: JobMapSource(ctx.config, ctx.wall_clock),
    SOURCE_ENVIRON: lambda ctx: EnvironSource(),
    SOURCE_CGROUP: lambda ctx: CgroupSource(),
    SOURCE_OWNER: lambda ctx: OwnerSource(CachedLookup(ctx.users),
                                          ctx.config.environ_value_max_length),
    SOURCE_KUBELET: lambda ctx: (KubeletSource(ctx.config, ctx.clock)
                                 if ctx.config.kubelet.enabled else None),
}


def build_sources(
    config: AttributionConfig,
    *,
    clock: Callable[[], float] = time.monotonic,
    user_lookup: UserLookup | None = None,
    wall_clock: Callable[[], float] = time.time,
) -> list[AttributionSource]:
    """The sources named in `config.sources`, in that order of precedence (a name whose
    builder returns None is left out)."""
    if user_lookup is None:
        user_lookup = (
            passwd_file_lookup(config.passwd_file) if config.passwd_file else system_lookup
        )
    ctx = SourceContext(config, clock, wall_clock, user_lookup)
    built = (SOURCES[name](ctx) for name in config.sources)
    return [source for source in built if source is not None]
