"""Property tests: any single deletion (but the last), duplication, adjacent swap or
field edit anywhere in a trail is found; the untouched trail always verifies."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_audit.audit.canonical import load_hmac_key
from gpu_audit.audit.verify import verify_records, verify_spool
from tests.core.audit.fakes import MemorySpool
from tests.core.audit.trails import producer_trail

TRAIL = producer_trail()
N = len(TRAIL)
positions = st.integers(min_value=0, max_value=N - 1)


@given(i=st.integers(min_value=0, max_value=N - 2))
@settings(max_examples=40, deadline=None)
def test_any_deletion_but_the_last_is_found(i: int) -> None:
    """Deleting any record that has a successor leaves a gap."""
    report = verify_records([*TRAIL[:i], *TRAIL[i + 1 :]], hmac_key=None)
    assert report.counts["gap"] == 1


@given(i=positions, j=positions)
@settings(max_examples=40, deadline=None)
def test_any_duplication_is_found(i: int, j: int) -> None:
    """Inserting a copy of any record anywhere after it is a duplicate seq."""
    at = max(i, j) + 1
    report = verify_records([*TRAIL[:at], TRAIL[i], *TRAIL[at:]], hmac_key=None)
    assert report.counts["duplicate_seq"] == 1


@given(i=st.integers(min_value=0, max_value=N - 2))
@settings(max_examples=40, deadline=None)
def test_any_adjacent_swap_is_found(i: int) -> None:
    """Swapping any two neighbours is reported as reordered, and nothing else."""
    t = list(TRAIL)
    t[i], t[i + 1] = t[i + 1], t[i]
    assert verify_records(t, hmac_key=None).counts == {"reordered": 1}


@given(i=positions, data=st.data())
@settings(max_examples=60, deadline=None)
def test_any_field_edit_is_found(i: int, data: st.DataObject) -> None:
    """Changing any top-level field of any record (other than its hash) is found."""
    rec = orjson.loads(TRAIL[i])
    key = data.draw(st.sampled_from(sorted(k for k in rec if k != "hash")))
    values = st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=5), st.none())
    rec[key] = data.draw(values.filter(lambda v: v != rec[key]))
    t = [*TRAIL[:i], orjson.dumps(rec), *TRAIL[i + 1 :]]
    assert not verify_records(t, hmac_key=None).ok


def test_clean_trail_through_a_reader() -> None:
    """verify_spool reads every record through a spool reader and passes a clean trail."""
    spool = MemorySpool(payloads=list(TRAIL))
    report = verify_spool(spool, None, complete=True)
    assert report.ok and report.records == N


def test_hmac_key_file_rules(tmp_path: Path) -> None:
    """The key is the file's bytes minus one trailing newline (LF or CRLF); an empty key
    is refused without echoing anything of the file."""
    f = tmp_path / "k"
    f.write_bytes(b"abc\r\n")
    assert load_hmac_key(f) == b"abc"
    f.write_bytes(b"abc\n\n")
    assert load_hmac_key(f) == b"abc\n"
    f.write_bytes(b"\n")
    with pytest.raises(ValueError, match="empty"):
        load_hmac_key(f)
