"""The published JSON Schemas of audit records (gpu_audit/schemas/audit-record-v*.json).

Version 3 is the interval usage record (and `chain_restart`), version 2 the per-cycle
records and every other event; the producer writes both. Version 1 is kept because
archives and sinks hold v1 records that `audit verify` still reads.

Loaded from package data so the schema that ships is the one tests check. This module
must never validate on the production path (the producer builds records that satisfy it
by construction; validating every record would cost more than building it).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

SCHEMA_FILE = "audit-record-v2.json"
SCHEMA_FILES = {1: "audit-record-v1.json", 2: SCHEMA_FILE, 3: "audit-record-v3.json"}


@cache
def record_schema(version: int = 2) -> dict[str, Any]:
    """The parsed JSON Schema (draft 2020-12) of audit records of `version` (1, 2 or 3)."""
    name = SCHEMA_FILES[version]
    text = resources.files("gpu_audit").joinpath("schemas", name).read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema
