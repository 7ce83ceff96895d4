"""The published JSON Schema of audit records (gpu_audit/schemas/audit-record-v1.json).

Loaded from package data so the schema that ships is the one tests check. This module
must never validate on the production path (the producer builds records that satisfy it
by construction; validating every record would cost more than building it).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

SCHEMA_FILE = "audit-record-v1.json"


@cache
def record_schema() -> dict[str, Any]:
    """The parsed JSON Schema (draft 2020-12) of version 1 audit records."""
    text = resources.files("gpu_audit").joinpath("schemas", SCHEMA_FILE).read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema
