"""Allow-listed identity from a /proc/<pid>/environ buffer.

The environment of another user's process is full of secrets (tokens, passwords, cloud
keys). This module looks only at the configured keys, maps them to identity fields, and
returns cleaned, length-capped values. It must never return, store or log any other key,
any value it was not asked for, or the raw buffer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from exporter.attribution.sanitize import clean_bytes

# key -> (primary field, fallback field or ""). A fallback applies only when no key gives
# that field as its primary: SLURM_JOB_ID is the job when JOB_ID is not set.
BUILTIN_KEY_FIELDS: Mapping[str, tuple[str, str]] = {
    "JOB_ID": ("job", ""),
    "USER": ("user", ""),
    "PROJECT_NAME": ("project", ""),
    "SLURM_JOB_ID": ("slurm_job_id", "job"),
    "SLURM_JOB_USER": ("slurm_user", "user"),
    "SLURM_JOB_ACCOUNT": ("slurm_account", "project"),
    "SLURM_JOB_PARTITION": ("slurm_partition", ""),
}


@dataclass(frozen=True, slots=True)
class EnvironMapping:
    """The compiled allow-list: which byte keys to look for and what they mean."""

    key_fields: Mapping[bytes, tuple[str, str]]
    max_length: int

    @classmethod
    def build(
        cls, keys: Iterable[str], extra_fields: Mapping[str, str], max_length: int
    ) -> EnvironMapping:
        """Compile `keys` (the allow-list) with the built-in and configured meanings.

        A key without a meaning is still allowed but contributes nothing; `extra_fields`
        (key -> identity field) gives site-specific keys a meaning and overrides a
        built-in one.
        """
        out: dict[bytes, tuple[str, str]] = {}
        for key in keys:
            if key in extra_fields:
                out[key.encode()] = (extra_fields[key], "")
            elif key in BUILTIN_KEY_FIELDS:
                out[key.encode()] = BUILTIN_KEY_FIELDS[key]
        return cls(out, max_length)

    def extract(self, buffer: bytes, *, complete: bool = True) -> dict[str, str]:
        """Identity fields from a NUL-separated environ buffer.

        When `complete` is False the buffer was cut at the read limit, so its last entry
        may be partial and is ignored rather than reported truncated.
        """
        entries = buffer.split(b"\0")
        if not complete:
            entries = entries[:-1]
        primary: dict[str, str] = {}
        fallback: dict[str, str] = {}
        wanted = self.key_fields
        for entry in entries:
            key, sep, value = entry.partition(b"=")
            if not sep or key not in wanted:
                continue
            main, alt = wanted[key]
            text = clean_bytes(value, self.max_length)
            if not text:
                continue
            # Later duplicates of a key never override the first (what getenv returns).
            primary.setdefault(main, text)
            if alt:
                fallback.setdefault(alt, text)
        for name, text in fallback.items():
            primary.setdefault(name, text)
        return primary
