"""Configuration of the shipper and its sinks."""

from __future__ import annotations

from pydantic import Field

from gpu_audit.model_base import Section


class ShipperConfig(Section):
    enabled: bool = Field(True, description="Run the shipper beside the exporter in `run`.")
