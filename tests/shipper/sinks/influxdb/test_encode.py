"""Line-protocol encoding: escaping round-trips, series key, types, NaN policy."""

from __future__ import annotations

import math

import orjson
from hypothesis import given
from hypothesis import strategies as st

from shipper.sinks.influxdb.encode import (
    EncodeError,
    encode_record,
    escape_key,
    escape_measurement,
    escape_string_field,
)
from tests.shipper.sinks.influxdb.lp_parser import parse_line, split_lines
from tests.shipper.sinks.records import make_doc, make_record

_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)),
                min_size=1, max_size=30)
_safe_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc"),
                           exclude_characters="\\"), min_size=1, max_size=30)


@given(_safe_text)
def test_tag_values_without_backslash_or_controls_round_trip_exactly(value: str) -> None:
    """Commas, equals signs, spaces, quotes, unicode in a tag value come back unchanged."""
    line = f"m,t={escape_key(value)} f=1 1"
    assert parse_line(line).tags["t"] == value


@given(_text)
def test_any_tag_value_stays_on_one_line_and_parses(value: str) -> None:
    """No input string can break the line: it parses as one point with the tag present."""
    line = f"m,t={escape_key(value)} f=1 1"
    assert len(split_lines(line + "\n" + line)) == 2
    parsed = parse_line(line).tags["t"]
    assert len(parsed) == len(value)  # one character out per character in
    for got, orig in zip(parsed, value, strict=True):
        assert got in (orig, "_")


@given(_safe_text)
def test_measurement_and_field_keys_round_trip(name: str) -> None:
    """Measurement names and field keys with delimiters round-trip exactly."""
    line = f"{escape_measurement(name)} {escape_key(name)}=1 1"
    point = parse_line(line)
    assert point.measurement == name
    assert list(point.fields) == [name]


@given(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",))))
def test_string_fields_round_trip_including_quotes_backslashes_newlines(value: str) -> None:
    """String field values keep every character, newlines included."""
    line = f"m f={escape_string_field(value)} 1"
    assert split_lines(line) == [line]
    assert parse_line(line).fields["f"] == value


@given(st.dictionaries(_safe_text, st.floats(allow_nan=False, allow_infinity=False),
                       max_size=5),
       st.text(max_size=20), st.text(max_size=20))
def test_record_round_trips_through_the_encoder(
        values: dict[str, float], user: str, job: str) -> None:
    """Any record encodes to one line whose `record` field is the exact raw JSON and whose
    values come back as floats."""
    doc = make_doc(5, values=values, attribution={"user": user, "job": job})
    raw = orjson.dumps(doc)
    point = parse_line(encode_record(doc, raw, doc["id"]).decode())
    assert point.fields["record"] == raw.decode()
    assert point.fields["record_id"] == doc["id"]
    assert point.fields["seq"] == 5
    assert point.time == doc["time_ns"] + 5  # seq 5: 5 ns after the record (one point each)
    for name, value in values.items():
        key = f"value_{name}" if name in {"seq", "record_id", "record", "nonfinite_fields",
                                          "unwritable_fields", "gpu_index", "xid"} else name
        if key not in ("gpu_seconds", "energy_joules"):
            assert point.fields[key] == value


def test_series_key_holds_host_gpu_pid_event() -> None:
    """Tags are host, gpu_uuid, pid, stream, identity (and event for events); sorted."""
    rec = make_record(3)
    point = parse_line(encode_record(rec.doc, rec.raw, rec.record_id).decode())
    assert point.measurement == "gpu_audit_process"
    assert point.tags == {"host": "node-1", "gpu_uuid": "GPU-00000003-aaaa", "pid": "1003",
                          "stream": "node-1/exporter", "user": "alice", "project": "vision",
                          "job": "j-17"}
    ev = make_record(4, kind="event")
    ev_point = parse_line(encode_record(ev.doc, ev.raw, ev.record_id).decode())
    assert ev_point.tags["event"] == "xid" and ev_point.fields["xid"] == 79
    no_ident = parse_line(encode_record(rec.doc, rec.raw, rec.record_id,
                                        identity_tags=False).decode())
    assert "user" not in no_ident.tags


def test_empty_tag_values_are_omitted() -> None:
    """Line protocol forbids empty tag values: an empty user is left out, not sent as ''."""
    rec = make_record(1, attribution={"user": "", "project": "p"})
    point = parse_line(encode_record(rec.doc, rec.raw, rec.record_id).decode())
    assert "user" not in point.tags and point.tags["project"] == "p"


def test_ints_in_values_are_floats_and_counters_are_integers() -> None:
    """A whole-number sample is written as a float (no type conflicts); seq/gpu_index as i."""
    rec = make_record(2, values={"memory_bytes": 1024, "util": 0.5})
    line = encode_record(rec.doc, rec.raw, rec.record_id).decode()
    assert "memory_bytes=1024.0" in line
    assert "seq=2i" in line and "gpu_index=2i" in line


def test_nonfinite_values_are_omitted_and_named() -> None:
    """NaN/inf fields are not written, and `nonfinite_fields` names them: never silent."""
    doc = make_doc(1, values={"a": math.nan, "b": math.inf, "c": 2.0})
    raw = b'{"values":{"a":NaN}}'  # whatever the spool holds is kept as the record text
    point = parse_line(encode_record(doc, raw, "id1").decode())
    assert "a" not in point.fields and "b" not in point.fields
    assert point.fields["c"] == 2.0
    assert point.fields["nonfinite_fields"] == "a,b"


def test_oversized_record_and_missing_time_raise() -> None:
    """Records over 64 KiB or without time_ns cannot be encoded (caller dead-letters)."""
    big = make_record(1, pad=66 * 1024)
    try:
        encode_record(big.doc, big.raw, big.record_id)
        raise AssertionError("expected EncodeError")
    except EncodeError as exc:
        assert "65536" in str(exc)
    try:
        encode_record({"kind": "gpu"}, b"{}", "x")
        raise AssertionError("expected EncodeError")
    except EncodeError as exc:
        assert "time_ns" in str(exc)


def test_value_names_that_sanitise_alike_are_named_not_lost() -> None:
    """Two value names that become the same field key: the second is named in
    `unwritable_fields` (never silently overwritten)."""
    doc = make_doc(1, values={"a\x01": 1.0, "a\x02": 2.0})
    point = parse_line(encode_record(doc, orjson.dumps(doc), "id").decode())
    assert point.fields["a_"] == 1.0
    assert point.fields["unwritable_fields"] == "a\x02"
