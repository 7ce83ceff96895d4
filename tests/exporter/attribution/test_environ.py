"""Allow-listed environ parsing and label-value sanitising."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from exporter.attribution.config import DEFAULT_ENVIRON_KEYS
from exporter.attribution.environ import EnvironMapping
from exporter.attribution.sanitize import clean_bytes, clean_text

MAPPING = EnvironMapping.build(DEFAULT_ENVIRON_KEYS, {}, 32)


def test_builtin_keys_map_to_identity_fields() -> None:
    """Each default key lands in its field; Slurm keys fill job/user/project only as
    fallbacks when the primary keys are absent."""
    buf = b"JOB_ID=j1\0USER=alice\0PROJECT_NAME=vision\0SLURM_JOB_ID=42\0"
    buf += b"SLURM_JOB_USER=alice2\0SLURM_JOB_ACCOUNT=acct\0"
    assert MAPPING.extract(buf) == {
        "job": "j1", "user": "alice", "project": "vision",
        "slurm_job_id": "42", "slurm_user": "alice2", "slurm_account": "acct",
    }  # fmt: skip
    slurm_only = b"SLURM_JOB_ID=42\0SLURM_JOB_USER=carol\0SLURM_JOB_ACCOUNT=physics\0"
    assert MAPPING.extract(slurm_only) == {
        "slurm_job_id": "42", "job": "42", "slurm_user": "carol", "user": "carol",
        "slurm_account": "physics", "project": "physics",
    }  # fmt: skip


def test_only_exact_allowed_keys_are_read() -> None:
    """Keys that merely share a prefix or suffix with an allowed key are ignored, and a
    key absent from the allow-list is never read even if it has a built-in meaning."""
    buf = b"USERNAME=x\0XUSER=y\0USER_TOKEN=z\0JOB_ID_SECRET=s\0user=lower\0"
    assert MAPPING.extract(buf) == {}
    narrow = EnvironMapping.build(("USER",), {}, 32)
    assert narrow.extract(b"USER=a\0JOB_ID=j\0") == {"user": "a"}


def test_configured_key_meanings_override_builtin() -> None:
    """environ_fields gives a site key a meaning (TEAM -> project) and wins over the
    built-in meaning of a key it redefines."""
    m = EnvironMapping.build(("TEAM", "USER"), {"TEAM": "project", "USER": "slurm_user"}, 32)
    assert m.extract(b"TEAM=nlp\0USER=al\0") == {"project": "nlp", "slurm_user": "al"}


def test_first_occurrence_of_a_key_wins_and_empty_values_are_skipped() -> None:
    """Duplicate keys resolve like getenv (first), and an empty value is no answer."""
    assert MAPPING.extract(b"USER=\0USER=first\0USER=second\0") == {"user": "first"}


def test_non_utf8_and_control_characters_are_removed() -> None:
    """Undecodable bytes and control characters never reach a label value."""
    buf = b"USER=al\xff\xfeice\0PROJECT_NAME=a\x1b[31mb\nc\tq\0"
    assert MAPPING.extract(buf) == {"user": "alice", "project": "a[31mbcq"}


def test_values_are_length_capped() -> None:
    """A huge value is cut to environ_value_max_length characters."""
    assert MAPPING.extract(b"USER=" + b"a" * 100_000 + b"\0") == {"user": "a" * 32}


def test_partial_last_entry_of_a_cut_buffer_is_ignored() -> None:
    """When the read stopped at the size limit, the last (partial) entry is dropped."""
    assert MAPPING.extract(b"JOB_ID=j\0USER=trunc", complete=False) == {"job": "j"}
    assert MAPPING.extract(b"JOB_ID=j\0USER=whole", complete=True) == {"job": "j", "user": "whole"}


def test_entries_without_equals_are_ignored() -> None:
    """Garbage entries (no '=') do not break parsing of the rest."""
    assert MAPPING.extract(b"\0\0garbage\0=\0USER=ok\0") == {"user": "ok"}


@given(st.text(), st.integers(min_value=1, max_value=64))
def test_clean_text_is_always_a_valid_label_value(value: str, cap: int) -> None:
    """Any input, surrogates included, becomes valid UTF-8 of printable characters
    within the cap and without surrounding whitespace."""
    out = clean_text(value, cap)
    out.encode("utf-8")  # raises on lone surrogates
    assert len(out) <= cap
    assert out.isprintable()
    assert out == out.strip()


@given(st.binary(), st.integers(min_value=1, max_value=64))
def test_clean_bytes_is_always_a_valid_label_value(value: bytes, cap: int) -> None:
    """Any byte string becomes valid, printable UTF-8 within the cap."""
    out = clean_bytes(value, cap)
    out.encode("utf-8")
    assert len(out) <= cap
    assert out.isprintable()
    assert "\ufffd" not in out


def test_slurm_partition_is_read_from_the_jobs_environment() -> None:
    """SLURM_JOB_PARTITION (set by Slurm in every job step) is on the default allow-list
    and gives slurm_partition, which no other key fills."""
    assert "SLURM_JOB_PARTITION" in DEFAULT_ENVIRON_KEYS
    buf = b"SLURM_JOB_ID=42\0SLURM_JOB_ACCOUNT=physics\0SLURM_JOB_PARTITION=low\0"
    assert MAPPING.extract(buf)["slurm_partition"] == "low"
