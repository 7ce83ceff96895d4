"""`gpu-audit chargeback replay MANIFEST`: re-run a recorded export and check it.

Replay rebuilds the request from the manifest (chargeback.manifest) and runs it again
through `chargeback.run.run_chargeback`, with the rates and directory taken from the
content embedded in the manifest (checked against the recorded sha256), so a bill can be
re-derived after those files were edited or deleted; a file that changed since is
reported, not used. It then compares each output's sha256 with the manifest's and says
which differ (exit 1) or that all are byte-identical (exit 0); differences in the
source's inputs and queries are reported beside, but only the outputs decide.

The readers are the caller's (the app layer's, as for a run): replay reads the source
the manifest names the way a run would. It sits above run.py (run never imports it) and
never writes into the directory of the export it checks.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from chargeback.manifest import EMBEDDED_FILES, HASHED_FILES, TIME_FIELDS, embedded, load_manifest
from chargeback.model import Bill, Request, SourceData
from chargeback.run import Reader, run_chargeback
from chargeback.values import OUTPUT_NAMES, parse_rfc3339, sha256_bytes
from gpu_audit.errors import ConfigError


def _replay_request(doc: dict[str, Any], workdir: Path, out: Path,
                    say: TextIO) -> Request:
    request = dict(doc["request"])
    for key in TIME_FIELDS:
        request[key] = parse_rfc3339(request[key])
    request["compare_with"] = tuple(request.get("compare_with", ()))
    for name in EMBEDDED_FILES:
        entry = doc["files"].get(name)
        if entry is None:
            continue
        content = embedded(entry)
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


def run_request(req: Request, readers: Mapping[str, Reader]
                ) -> tuple[Bill, SourceData, dict[str, str]]:
    """The one way replay runs a request: `chargeback.run.run_chargeback`."""
    result = run_chargeback(req, readers=readers)
    return result.bill, result.data, result.outputs


def replay(manifest_path: Path, out_dir: Path | None = None, *,
           readers: Mapping[str, Reader], say: TextIO | None = None) -> int:
    """Re-run the export `manifest_path` describes; 0 when every output is identical.

    `readers` are the source readers a run gets (gpu_audit_app.chargeback.main's).
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
        _bill, data, hashes = run_request(req, readers)
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
