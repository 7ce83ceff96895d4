"""The flag form of `gpu-audit chargeback` from before its actions (`chargeback --month
...`, `--simulate SCENARIO`, `--replay MANIFEST`), kept for one release: the command line
is rewritten to `chargeback bill|simulate|replay ...` before it is parsed, so both forms
run the same code and print the same, and a deprecation line on stderr says what to type
instead. Standard library only (the parser imports it); it must never run a bill itself.
Delete this module, and its call in cli.main, in the release after.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

ACTIONS = ("bill", "simulate", "replay")
# the old mode flags, each now an action whose positional argument is the flag's value
_MODES = {"--replay": "replay", "--simulate": "simulate"}


def _take(words: list[str], flag: str) -> tuple[str | None, list[str]] | None:
    """(the value of `flag` in `words`, the other words), or None when it is absent."""
    for i, word in enumerate(words):
        if word == flag:
            value = words[i + 1] if i + 1 < len(words) else None
            return value, words[:i] + words[i + 2:]
        if word.startswith(flag + "="):
            return word[len(flag) + 1:], words[:i] + words[i + 1:]
    return None


def modern_argv(argv: Sequence[str]) -> tuple[list[str], str | None]:
    """`argv` with an old-form `chargeback` rewritten to its action, and the deprecation
    line to print (None, and `argv` unchanged, when it is not the old form)."""
    words = list(argv)
    at = next((i for i, w in enumerate(words) if not w.startswith("-")), None)
    if at is None or words[at] != "chargeback":
        return words, None
    rest = words[at + 1:]
    if not rest or not rest[0].startswith("-") or rest[0] in ("-h", "--help"):
        return words, None  # an action, no arguments, or the group's help
    new = ["bill", *rest]
    for flag, action in _MODES.items():
        taken = _take(rest, flag)
        if taken is not None:
            value, others = taken
            new = [action, *([value] if value is not None else []), *others]
            break
    note = (f"gpu-audit chargeback: the flag form is deprecated and goes in the next "
            f"release; run `gpu-audit chargeback {shlex.join(new)}` instead (doing that now)")
    return [*words[:at + 1], *new], note
