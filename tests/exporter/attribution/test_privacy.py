"""Privacy: environment secrets never leave the environ reader."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.exporter.attribution.helpers import GPU0, config, gpu, make_tree, proc, resolver

SECRETS = ("supersecret123", "neighbour-secret-456", "prefix-secret-789", "tail-secret-000")


def test_secrets_in_environ_appear_nowhere(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A secret next to allowed keys, in a key sharing an allowed key's prefix, and in a
    value glued to an allowed key (no NUL) never shows in any Attribution field, any
    log record at DEBUG, the resolver's repr or its stats, even across cycles, a cut
    buffer and a denied-to-allowed change."""
    caplog.set_level(logging.DEBUG)
    root = tmp_path / "proc"
    p = proc(31)
    make_tree(root, p)
    (root / "31" / "environ").write_bytes(
        b"AWS_SECRET_ACCESS_KEY=" + SECRETS[0].encode() + b"\0"
        b"USER=alice\0"
        b"USER_PASSWORD=" + SECRETS[1].encode() + b"\0"
        b"JOB_IDX=" + SECRETS[2].encode() + b"\0"
        b"PROJECT_NAME=vision\0"
        b"GITHUB_TOKEN=" + SECRETS[3].encode() + b"\0"
    )
    r = resolver(config(tmp_path, sources=("environ", "owner", "cgroup", "jobmap")))
    results = [r.attribute([gpu(GPU0, p)]) for _ in range(2)]
    dumped = repr(results) + repr(r) + repr(dict(r.stats()))
    dumped += repr(r.__dict__)  # the resolver's own state, cache included
    dumped += "\n".join(rec.getMessage() + repr(rec.args) for rec in caplog.records)
    for secret in SECRETS:
        assert secret not in dumped
    a = results[0][GPU0][0].attribution
    assert (a.user, a.project) == ("alice", "vision")
    assert "AWS_SECRET_ACCESS_KEY" not in dumped and "GITHUB_TOKEN" not in dumped


def test_cache_holds_only_allowlisted_values(tmp_path: Path) -> None:
    """What the resolver keeps per pid is the cleaned allow-listed fields, never the
    raw buffer or other keys."""
    root = tmp_path / "proc"
    p = proc(32, environ={"USER": "alice", "DB_PASSWORD": SECRETS[0]})
    make_tree(root, p)
    r = resolver(config(tmp_path, sources=("environ",)))
    r.attribute([gpu(GPU0, p)])
    (entry,) = r._cache.values()
    assert entry.environ == {"user": "alice"}
    assert SECRETS[0] not in repr(entry)
