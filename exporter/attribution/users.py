"""uid -> user name, from the system user database or a passwd-format file.

Lookups go through NSS (LDAP, SSSD) on real clusters and can be slow, so answers,
including "unknown", are cached. This module must never raise for an unknown uid or a
broken passwd file.
"""

from __future__ import annotations

import logging
import pwd
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

UserLookup = Callable[[int], "str | None"]

# Enough for every account on a node many times over; cleared whole when full so a
# stream of unknown uids cannot grow memory without bound.
_CACHE_LIMIT = 4096


def system_lookup(uid: int) -> str | None:
    """The name of `uid` in the system user database, or None."""
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return None


def passwd_file_lookup(path: Path) -> UserLookup:
    """A lookup over a passwd-format file (`name:x:uid:gid:...`), read once."""
    names: dict[int, str] = {}
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        log.warning("passwd file %s unreadable (errno %s); owners show as uid:<n>",
                    path, exc.errno)
        text = ""
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        parts = line.split(":")
        if len(parts) >= 3 and parts[2].isdigit():
            names.setdefault(int(parts[2]), parts[0])
    return names.get


class CachedLookup:
    """Memoises a UserLookup; 'unknown' is remembered too."""

    def __init__(self, lookup: UserLookup) -> None:
        self._lookup = lookup
        self._cache: dict[int, str | None] = {}

    def __call__(self, uid: int) -> str | None:
        try:
            return self._cache[uid]
        except KeyError:
            pass
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        try:
            name = self._lookup(uid)
        except Exception:  # a user-supplied lookup must not break a cycle
            log.debug("user lookup for uid %d failed", uid, exc_info=True)
            name = None
        self._cache[uid] = name
        return name
