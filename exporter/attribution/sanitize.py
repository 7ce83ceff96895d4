"""Turning untrusted bytes and strings into safe label values.

Every value attribution hands out ends up as a Prometheus label value and in audit
records. Prometheus accepts any valid UTF-8, so the rules here are ours: valid UTF-8 (no
lone surrogates, undecodable bytes dropped), printable characters only (no control
characters, no line breaks that could break log lines or CSV exports), no surrounding
whitespace, and a length cap. This module must never log or keep the input it cleans:
it is called on raw environment bytes.
"""

from __future__ import annotations

import re

DEFAULT_MAX_LENGTH = 128

# Surrogates (from JSON "\ud800" escapes) are not valid UTF-8; U+FFFD is what decoding
# with errors="replace" puts where an undecodable byte was: drop both.
_UNSAFE = re.compile("[\ud800-\udfff\ufffd]")


def clean_text(value: str, max_length: int = DEFAULT_MAX_LENGTH) -> str:
    """`value` made safe to use as a label value: printable, valid UTF-8, capped."""
    if value.isascii() and value.isprintable():
        # The common case (ids, user names) skips the per-character scan.
        return value.strip()[:max_length].strip()
    kept = "".join(ch for ch in _UNSAFE.sub("", value) if ch.isprintable())
    return kept.strip()[:max_length].strip()


def clean_bytes(value: bytes, max_length: int = DEFAULT_MAX_LENGTH) -> str:
    """Raw bytes decoded as UTF-8 (bad bytes dropped) and cleaned like clean_text."""
    # Decode no more than the cap could keep (4 bytes per character at most), so a huge
    # value costs nothing; a character split by the cut is dropped as an undecodable byte.
    return clean_text(value[: max_length * 4].decode("utf-8", errors="replace"), max_length)
