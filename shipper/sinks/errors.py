"""Errors a sink raises outside the per-record outcome model.

Must never be used to signal a delivery failure: those are ItemResult / SinkError.
"""

from __future__ import annotations

from gpu_audit.errors import GpuAuditError


class ReadBackUnsupported(GpuAuditError, NotImplementedError):
    """This backend cannot give the records back (a router, or a store without strings)."""
