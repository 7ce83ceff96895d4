"""The archive format: file naming, the order of parts, an ordered reader, seals and the
rollup a seal carries.

One place knows how an archive directory is laid out, so the archive sink (writing,
sealing and recovering), `audit verify` and chargeback (reading) cannot disagree about it.
"""

from gpu_audit.archive.layout import (
    ParsedName,
    Part,
    day_of,
    legacy_part_name,
    list_parts,
    parse_name,
    part_name,
    seal_name,
)
from gpu_audit.archive.reader import ArchiveLine, PartLines, read_lines, read_records

__all__ = [
    "ArchiveLine",
    "ParsedName",
    "Part",
    "PartLines",
    "day_of",
    "legacy_part_name",
    "list_parts",
    "parse_name",
    "part_name",
    "read_lines",
    "read_records",
    "seal_name",
]
