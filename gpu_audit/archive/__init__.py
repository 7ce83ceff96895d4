"""The archive format: file naming, the order of parts, and an ordered reader.

One place knows how an archive directory is laid out, so the archive sink (writing and
recovering), `audit verify` and chargeback (reading) cannot disagree about it.
"""

from gpu_audit.archive.layout import Part, day_of, list_parts, parse_name, part_name
from gpu_audit.archive.reader import ArchiveLine, read_lines, read_records

__all__ = [
    "ArchiveLine",
    "Part",
    "day_of",
    "list_parts",
    "parse_name",
    "part_name",
    "read_lines",
    "read_records",
]
