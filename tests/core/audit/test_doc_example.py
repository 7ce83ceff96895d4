"""The worked example in docs/AUDIT.md is true: its shell commands, run as written,
print the outputs the doc shows, and those are the hash, HMAC and id of the first
record of the golden v2 trail, whose canonical bytes the doc shows. So the example a
reader recomputes by hand with `sha256sum` cannot drift from the code."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest

from gpu_audit.audit.canonical import ZERO_HASH, canonical_bytes
from tests.core.audit import golden_input as gi

DOC = Path(__file__).resolve().parents[3] / "docs" / "AUDIT.md"


def _block(name: str) -> str:
    """The fenced code block right after `<!-- example:NAME -->` in docs/AUDIT.md."""
    text = DOC.read_text(encoding="utf-8")
    m = re.search(rf"<!-- example:{name} -->\n```[a-z]*\n(.*?)\n```", text, re.DOTALL)
    assert m is not None, f"docs/AUDIT.md has no example block {name!r}"
    return m.group(1)


def _run(command: str) -> str:
    out = subprocess.run(["bash", "-c", command], capture_output=True, check=True,
                         timeout=30)
    return out.stdout.decode().strip()


def _first_golden() -> dict[str, object]:
    with open(gi.GOLDEN_DIR / "trail-v2.jsonl", "rb") as f:
        rec: dict[str, object] = orjson.loads(f.readline())
    return rec


def test_doc_canonical_bytes_are_those_of_the_golden_record() -> None:
    """The bytes the doc shows are the canonical bytes of golden record 1 without its
    hash, and the shell command hashes exactly prev_hash (64 zeros) + those bytes."""
    rec = _first_golden()
    body = {k: v for k, v in rec.items() if k != "hash"}
    assert _block("canonical").encode() == canonical_bytes(body)
    assert f"printf '%s' '{ZERO_HASH}{_block('canonical')}' | sha256sum" == _block(
        "sha256-command")


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="no sha256sum on PATH")
def test_doc_sha256_command_prints_the_doc_hash_and_the_golden_hash() -> None:
    """Running the doc's `sha256sum` command prints the output the doc shows, which is
    the golden record's `hash`."""
    shown = _block("sha256-output")
    assert _run(_block("sha256-command")) == shown
    assert shown.split()[0] == _first_golden()["hash"]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl on PATH")
def test_doc_hmac_command_prints_the_keyed_golden_hash() -> None:
    """The doc's HMAC command (with the golden key) prints what the doc shows: the hash
    of record 1 of the HMAC golden trail."""
    shown = _block("hmac-output")
    assert _run(_block("hmac-command")) == shown
    with open(gi.GOLDEN_DIR / "trail-v2-hmac.jsonl", "rb") as f:
        keyed = orjson.loads(f.readline())
    assert shown.split()[-1] == keyed["hash"]
    assert gi.golden_key().decode() in _block("hmac-command")


@pytest.mark.skipif(shutil.which("b2sum") is None, reason="no b2sum on PATH")
def test_doc_id_command_prints_the_golden_id() -> None:
    """The doc's `b2sum` command prints the golden record's id."""
    shown = _block("id-output")
    assert _run(_block("id-command")) == shown
    assert shown.split()[0] == _first_golden()["id"]
