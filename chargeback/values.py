"""How every value in a chargeback export is written: numbers, times, hashes, file names.

One place, so the CSV, JSON, HTML and manifest agree to the byte: numbers rounded once
to `DECIMALS` places (-0.0 written as 0.0, NaN and infinity refused), times as RFC 3339
UTC with seconds and `Z`, and the software version as the only provenance text. Nothing
here reads the clock: an export is a function of its inputs.
"""

from __future__ import annotations

import hashlib
import math
from datetime import UTC, datetime

from chargeback.model import Owner
from gpu_audit import __version__

CSV_NAME = "chargeback.csv"
LINES_CSV_NAME = "chargeback-lines.csv"  # GPU cost per row and GPU model
JSON_NAME = "chargeback.json"
HTML_NAME = "report.html"
MANIFEST_NAME = "manifest.json"
OUTPUT_NAMES = (CSV_NAME, LINES_CSV_NAME, JSON_NAME, HTML_NAME)

DECIMALS = 6
SECONDS_PER_HOUR = 3600.0
JOULES_PER_KWH = 3.6e6


def rounded(value: float) -> float:
    """The one rounding of every number written."""
    if not math.isfinite(value):
        raise ValueError(f"not a finite number: {value!r}")
    out = round(value, DECIMALS)
    return 0.0 if out == 0 else out


def fmt_number(value: float) -> str:
    return f"{rounded(value):.{DECIMALS}f}"


def rfc3339(moment: datetime) -> str:
    """UTC, seconds precision, `Z` (a naive time is taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str) -> datetime:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone")
    return moment.astimezone(UTC)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def software_version() -> str:
    return f"gpu-audit {__version__}"


def owner_sort_key(owner: Owner) -> tuple[str, str]:
    """Owners in a stable order: by user, then project (unknown as "")."""
    user, project = owner
    return (user or "", project or "")
