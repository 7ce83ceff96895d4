"""The audit manifest beside every export: what a bill was made from, and how a
manifest is read back.

`manifest.json` records everything a bill was made from: the request (period, source,
every option), every query the source issued, what it read with its fingerprint, the
rates and directory files (sha256 and their full content), the config file (sha256
only: it may hold sink credentials), the software version and the sha256 of each output.
`load_manifest` reads one back and refuses (ConfigError, exit 2) a file that is not a
manifest or whose embedded content does not match its own hash;
`chargeback.replay` re-runs it.

Like the outputs, the manifest holds no wall-clock time. This module never runs a bill.
"""

from __future__ import annotations

import base64
from dataclasses import fields
from pathlib import Path
from typing import Any

import orjson

from chargeback.model import Completeness, Request, SourceData
from chargeback.values import (
    MANIFEST_NAME,
    OUTPUT_NAMES,
    parse_rfc3339,
    rfc3339,
    rounded,
    sha256_bytes,
    software_version,
)
from gpu_audit.errors import ConfigError

MANIFEST_FORMAT = "gpu-audit-chargeback-manifest/1"
EMBEDDED_FILES = ("rates", "directory")  # Request fields whose file content is embedded
HASHED_FILES = ("config",)  # Request fields whose file is hashed, not embedded
TIME_FIELDS = ("start", "end")


def _request_json(req: Request) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(req):
        value = getattr(req, f.name)
        if f.name in TIME_FIELDS:
            value = rfc3339(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(MANIFEST_NAME, [f"cannot read the {what} file {path}: "
                                          f"{exc.strerror or exc}"]) from exc


def _file_entry(path: str | None, what: str, *, embed: bool) -> dict[str, Any] | None:
    if path is None:
        return None
    data = _read(path, what)
    entry: dict[str, Any] = {"path": path, "sha256": sha256_bytes(data)}
    if embed:
        try:
            entry["content"] = data.decode("utf-8")
        except UnicodeDecodeError:
            entry["content_base64"] = base64.b64encode(data).decode("ascii")
    return entry


def _source_json(data: SourceData) -> dict[str, Any]:
    return {
        "name": data.source,
        "period": {"start": rfc3339(data.start), "end": rfc3339(data.end)},
        "queries": list(data.queries),
        "inputs": dict(sorted(data.inputs.items())),
        "verified": data.verified,
        "verification_problems": list(data.verification_problems),
        "simulated_excluded": data.simulated_excluded,
        "simulated_included": data.simulated_included,
        "notes": list(data.notes),
        "completeness": completeness_json(data.completeness),
    }


def completeness_json(c: Completeness | None) -> dict[str, Any] | None:
    """The proof of completeness as the manifest and the JSON bill write it."""
    if c is None:
        return None
    return {"status": c.status, "allowed": c.allowed, "chains": list(c.chains),
            "gaps": list(c.gaps), "silent": list(c.silent),
            "inventory_gpus": c.inventory_gpus, "inventory_hosts": c.inventory_hosts,
            "expected_gpu_hours": rounded(c.expected_gpu_hours),
            "observed_gpu_hours": rounded(c.observed_gpu_hours)}


def build_manifest(req: Request, data: SourceData, outputs: dict[str, str]) -> dict[str, Any]:
    files: dict[str, Any] = {}
    for name in EMBEDDED_FILES:
        files[name] = _file_entry(getattr(req, name), name, embed=True)
    for name in HASHED_FILES:
        files[name] = _file_entry(getattr(req, name), name, embed=False)
    return {
        "format": MANIFEST_FORMAT,
        "software": software_version(),
        "request": _request_json(req),
        "files": files,
        "source": _source_json(data),
        # --compare-with: each other source's queries and inputs, as for the source
        "compared_sources": {name: _source_json(d)
                             for name, d in sorted(data.compared.items())},
        "outputs": dict(sorted(outputs.items())),
    }


def render_manifest(req: Request, data: SourceData, outputs: dict[str, str]) -> bytes:
    return orjson.dumps(build_manifest(req, data, outputs),
                        option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2) + b"\n"


# -- reading a manifest back ------------------------------------------------------------

def load_manifest(path: Path) -> dict[str, Any]:
    """Read and check a manifest; every problem found is reported at once."""
    try:
        doc = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read: {exc.strerror or exc}"]) from exc
    except orjson.JSONDecodeError as exc:
        raise ConfigError(str(path), [f"not JSON: {exc}"]) from exc
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise ConfigError(str(path), [f"not a chargeback manifest (format {got!r}, "
                                      f"expected {MANIFEST_FORMAT!r})"])
    problems: list[str] = []
    for key, kind in (("request", dict), ("files", dict), ("source", dict),
                      ("outputs", dict)):
        if not isinstance(doc.get(key), kind):
            problems.append(f"{key}: missing or not an object")
    if problems:
        raise ConfigError(str(path), problems)
    outputs = doc["outputs"]
    for name in OUTPUT_NAMES:
        if not isinstance(outputs.get(name), str):
            problems.append(f"outputs.{name}: missing sha256")
    names = {f.name for f in fields(Request)}
    request = doc["request"]
    problems += [f"request.{key}: unknown option" for key in sorted(set(request) - names)]
    problems += [f"request.{key}: missing" for key in sorted(names - set(request))
                 if key not in ("include_simulated", "allow_unverified", "compare_with",
                                "allow_gaps", "verify_records", "csv_totals", "excel",
                                "witness", "trust_unkeyed_seals")]
    for key in TIME_FIELDS:
        if isinstance(request.get(key), str):
            try:
                parse_rfc3339(request[key])
            except ValueError as exc:
                problems.append(f"request.{key}: {exc}")
        elif key in request:
            problems.append(f"request.{key}: not an RFC 3339 time")
    for name in EMBEDDED_FILES:
        entry = doc["files"].get(name)
        if entry is None:
            if request.get(name) is not None:
                problems.append(f"files.{name}: missing while request.{name} is set")
            continue
        try:
            content = embedded(entry)
        except (TypeError, ValueError, KeyError) as exc:
            problems.append(f"files.{name}: no usable embedded content ({exc})")
            continue
        if sha256_bytes(content) != entry.get("sha256"):
            problems.append(f"files.{name}: embedded content does not match its sha256 "
                            "(the manifest was altered)")
    if problems:
        raise ConfigError(str(path), problems)
    return doc


def embedded(entry: dict[str, Any]) -> bytes:
    """The bytes of an embedded file entry (UTF-8 text, or base64 for other bytes)."""
    if "content" in entry:
        return str(entry["content"]).encode("utf-8")
    return base64.b64decode(entry["content_base64"], validate=True)
