"""The audit manifest beside every export, and `--replay`, which re-runs it.

`manifest.json` records everything a bill was made from: the request (period, source,
every option), every query the source issued, what it read with its fingerprint, the
rates and directory files (sha256 and their full content), the config file (sha256
only: it may hold sink credentials), the software version and the sha256 of each output.

Replay rebuilds the request from the manifest and runs it again through
`chargeback.run.run_chargeback`, with the rates and directory taken from the content
embedded in the manifest (checked against the recorded sha256), so a bill can be
re-derived after those files were edited or deleted; a file that changed since is
reported, not used. It then compares each output's sha256 with the manifest's and
says which differ (exit 1) or that all are byte-identical (exit 0); differences in the
source's inputs and queries are reported beside, but only the outputs decide. A
manifest that is not one, or whose embedded content does not match its own hash, is
refused (ConfigError, exit 2).

Like the outputs, the manifest holds no wall-clock time. Replay never writes into the
directory of the export it checks.
"""

from __future__ import annotations

import base64
import sys
import tempfile
from dataclasses import fields
from pathlib import Path
from typing import Any, TextIO

import orjson

from chargeback.model import Bill, Completeness, Request, SourceData
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
_TIME_FIELDS = ("start", "end")


def _request_json(req: Request) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(req):
        value = getattr(req, f.name)
        if f.name in _TIME_FIELDS:
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


# -- replay -----------------------------------------------------------------------------

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
                                "allow_gaps", "verify_records")]
    for key in _TIME_FIELDS:
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
            content = _embedded(entry)
        except (TypeError, ValueError, KeyError) as exc:
            problems.append(f"files.{name}: no usable embedded content ({exc})")
            continue
        if sha256_bytes(content) != entry.get("sha256"):
            problems.append(f"files.{name}: embedded content does not match its sha256 "
                            "(the manifest was altered)")
    if problems:
        raise ConfigError(str(path), problems)
    return doc


def _embedded(entry: dict[str, Any]) -> bytes:
    if "content" in entry:
        return str(entry["content"]).encode("utf-8")
    return base64.b64decode(entry["content_base64"], validate=True)


def _replay_request(doc: dict[str, Any], workdir: Path, out: Path,
                    say: TextIO) -> Request:
    request = dict(doc["request"])
    for key in _TIME_FIELDS:
        request[key] = parse_rfc3339(request[key])
    request["compare_with"] = tuple(request.get("compare_with", ()))
    for name in EMBEDDED_FILES:
        entry = doc["files"].get(name)
        if entry is None:
            continue
        content = _embedded(entry)
        original = Path(entry["path"])
        try:
            now = sha256_bytes(original.read_bytes())
        except OSError:
            say.write(f"note: the {name} file {original} is gone; using the copy in "
                      "the manifest\n")
        else:
            if now != entry["sha256"]:
                say.write(f"note: the {name} file {original} changed since the export "
                          f"(sha256 {now[:12]}, was {entry['sha256'][:12]}); using the "
                          "copy in the manifest\n")
        copy = workdir / f"{name}{original.suffix or '.yaml'}"
        copy.write_bytes(content)
        request[name] = str(copy)
    for name in HASHED_FILES:
        entry = doc["files"].get(name)
        if entry is None:
            continue
        try:
            now = sha256_bytes(Path(entry["path"]).read_bytes())
        except OSError as exc:
            raise ConfigError(str(entry["path"]), [
                f"the {name} file the export used cannot be read: {exc.strerror or exc}"
            ]) from exc
        if now != entry["sha256"]:
            say.write(f"note: the {name} file {entry['path']} changed since the export "
                      f"(sha256 {now[:12]}, was {entry['sha256'][:12]})\n")
    request["out"] = str(out)
    return Request(**request)


def _diff_lines(label: str, was: list[str], now: list[str]) -> list[str]:
    if was == now:
        return []
    gone = [q for q in was if q not in now]
    new = [q for q in now if q not in was]
    lines = [f"{label} differ ({len(was)} recorded, {len(now)} now)"]
    lines += [f"  - only recorded: {q}" for q in gone[:10]]
    lines += [f"  - only now: {q}" for q in new[:10]]
    if not gone and not new:
        lines.append("  - same entries, different order")
    return lines


def compare_outputs(doc: dict[str, Any], hashes: dict[str, str]) -> list[str]:
    """Each output whose sha256 differs from the manifest's (what makes replay fail)."""
    lines: list[str] = []
    for name in OUTPUT_NAMES:
        was, now = doc["outputs"].get(name), hashes.get(name)
        if was != now:
            lines.append(f"{name}: sha256 {now} differs from the manifest's {was}")
    return lines


def compare_sources(doc: dict[str, Any], data: SourceData) -> list[str]:
    """How what the source read and asked differs (context: an archive that grew past
    the period, or a Prometheus that compacted, may differ and still give the same bill)."""
    source = doc["source"]
    lines: list[str] = []
    inputs_was: dict[str, str] = source.get("inputs", {})
    for key in sorted(set(inputs_was) | set(data.inputs)):
        was, now = inputs_was.get(key), data.inputs.get(key)
        if was != now:
            lines.append(f"input {key}: {now!r} now, {was!r} in the manifest")
    lines += _diff_lines("queries", list(source.get("queries", [])), list(data.queries))
    compared = doc.get("compared_sources", {})
    for name, other in sorted(data.compared.items()):
        was = compared.get(name, {})
        lines += _diff_lines(f"--compare-with {name} queries", list(was.get("queries", [])),
                             list(other.queries))
    return lines


def run_request(req: Request) -> tuple[Bill, SourceData, dict[str, str]]:
    """The one way replay runs a request: `chargeback.run.run_chargeback`, imported when
    a replay needs it (run imports the outputs, which import this module)."""
    from chargeback.run import run_chargeback  # noqa: PLC0415

    result = run_chargeback(req, False)
    return result.bill, result.data, result.outputs


def replay(manifest_path: Path, out_dir: Path | None = None, *,
           say: TextIO | None = None) -> int:
    """Re-run the export `manifest_path` describes; 0 when every output is identical.

    `out_dir` keeps the re-run's files (it must not be the export's own directory);
    None writes them to a temporary directory that is removed afterwards.
    """
    say = say or sys.stdout
    doc = load_manifest(manifest_path)
    if out_dir is not None and out_dir.resolve() == manifest_path.parent.resolve():
        raise ConfigError("--out", [f"{out_dir} holds the export being checked: give "
                                    "replay another directory"])
    with tempfile.TemporaryDirectory(prefix="gpu-audit-replay-") as tmp:
        workdir = Path(tmp)
        out = out_dir if out_dir is not None else workdir / "out"
        req = _replay_request(doc, workdir, out, say)
        _bill, data, hashes = run_request(req)
    differ = compare_outputs(doc, hashes)
    context = compare_sources(doc, data)
    period = f"{doc['request']['start']} .. {doc['request']['end']}"
    if not differ:
        say.write(f"replay of {manifest_path} ({period}, {doc['request']['source']}): "
                  f"{len(OUTPUT_NAMES)} outputs byte-identical\n")
    else:
        say.write(f"replay of {manifest_path} ({period}) differs:\n")
        say.writelines(f"  {line}\n" for line in differ)
    if context:
        say.write("the source read differently this time:\n")
        say.writelines(f"  {line}\n" for line in context)
    return 1 if differ else 0
