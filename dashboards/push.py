"""`gpu-audit dashboards push`: upload the committed Grafana dashboards into a folder
(through grafana-client, overwriting by uid) and import the Kibana saved objects
(through Kibana's saved-objects import API, overwriting by id).

Credentials come from the environment or from files, never from the command line (where
`ps` shows them) and never into a log line or an error message:
  Grafana: GRAFANA_TOKEN / --grafana-token-file (a service-account token, Bearer), or
           GRAFANA_USER + GRAFANA_PASSWORD / --grafana-password-file (basic auth).
  Kibana:  KIBANA_API_KEY / --kibana-api-key-file (ApiKey), or
           KIBANA_USER + KIBANA_PASSWORD / --kibana-password-file (basic auth).
A file's content minus one trailing newline is the secret. User info in a URL
(http://user:pass@host) is accepted and stripped from every message.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import niquests
import urllib3
from grafana_client.api import GrafanaApi
from grafana_client.client import GrafanaClientError, GrafanaException, TokenAuth

from dashboards.build import GRAFANA_DIR
from dashboards.defaults import DEFAULT_FOLDER, DEFAULT_FOLDER_UID
from dashboards.kibana import NDJSON
from gpu_audit.errors import GpuAuditError

TIMEOUT_S = 30.0


class PushError(GpuAuditError):
    """A push failed; the message names what and never holds a secret."""


@dataclass(frozen=True)
class Target:
    url: str  # without user info
    username: str | None = None
    password: str | None = None
    token: str | None = None

    @property
    def basic(self) -> bool:
        return self.username is not None and self.password is not None


def _read_secret(path: Path | None, what: str) -> str | None:
    if path is None:
        return None
    try:
        text = path.read_text()
    except OSError as exc:
        raise PushError(f"cannot read {what} file {path}: {exc.strerror}") from None
    return text[:-1] if text.endswith("\n") else text


def _split_url(url: str) -> tuple[str, str | None, str | None]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PushError(f"not an http(s) URL: {redact(url)}")
    netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
    clean = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    return clean, parts.username, parts.password


def redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    netloc = "***@" + (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


def target(url: str, env: Mapping[str, str], *, prefix: str, key_var: str,
           token_file: Path | None, password_file: Path | None) -> Target:
    clean, user, password = _split_url(url)
    token = _read_secret(token_file, f"{prefix.lower()} token") or env.get(key_var)
    user = user or env.get(f"{prefix}_USER")
    password = (password or _read_secret(password_file, f"{prefix.lower()} password")
                or env.get(f"{prefix}_PASSWORD"))
    return Target(clean, user, password, token)


# --- Grafana ----------------------------------------------------------------------


def load_dashboards(directory: Path = GRAFANA_DIR) -> list[dict[str, Any]]:
    models = [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]
    if not models:
        raise PushError(f"no dashboard JSON in {directory}")
    return models


def push_grafana(tgt: Target, folder: str = DEFAULT_FOLDER,
                 folder_uid: str = DEFAULT_FOLDER_UID,
                 directory: Path = GRAFANA_DIR) -> list[str]:
    """Create the folder unless it exists, then POST every dashboard with overwrite=true.
    Returns the uids pushed."""
    models = load_dashboards(directory)
    parts = urlsplit(tgt.url)
    auth: Any = None
    # grafana-client's methods carry no type hints: used through Any, so mypy --strict
    # accepts the calls (their shapes are pinned by tests/dashboards/test_push.py)
    token_auth: Any = TokenAuth
    if tgt.token:
        auth = token_auth(tgt.token)
    elif tgt.basic:
        auth = (tgt.username, tgt.password)
    prefix = parts.path.strip("/")
    api: Any = GrafanaApi(auth, host=parts.hostname, port=parts.port, protocol=parts.scheme,
                     url_path_prefix=f"{prefix}/" if prefix else "", timeout=TIMEOUT_S)
    try:
        try:
            api.folder.get_folder(folder_uid)
        except GrafanaClientError as exc:
            if exc.status_code != 404:
                raise
            api.folder.create_folder(folder, uid=folder_uid)
        pushed = []
        for model in models:
            body = {"dashboard": {**model, "id": None}, "folderUid": folder_uid,
                    "overwrite": True, "message": "gpu-audit dashboards push"}
            api.dashboard.update_dashboard(body)
            pushed.append(model["uid"])
    except GrafanaException as exc:
        # the exception's text is the server's message; it never holds our credentials
        body = exc.response
        detail = body.get("message") if isinstance(body, dict) else None
        raise PushError(f"Grafana at {tgt.url}: HTTP {exc.status_code or 'error'}: "
                        f"{detail or exc.message}") from None
    except niquests.exceptions.RequestException as exc:
        # no URL or request in the message: only the kind of failure
        raise PushError(f"Grafana at {tgt.url}: {type(exc).__name__}") from None
    return pushed


# --- Kibana -----------------------------------------------------------------------


def push_kibana(tgt: Target, space: str | None = None, ndjson: Path = NDJSON,
                http: urllib3.PoolManager | None = None) -> dict[str, Any]:
    """POST the NDJSON to /api/saved_objects/_import?overwrite=true (multipart, with the
    kbn-xsrf header Kibana requires). Fails unless Kibana reports success for all."""
    body_bytes = ndjson.read_bytes()
    boundary = uuid.uuid5(uuid.NAMESPACE_URL, "gpu-audit-kibana").hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"{ndjson.name}\"\r\nContent-Type: application/ndjson\r\n\r\n"
            ).encode() + body_bytes + f"\r\n--{boundary}--\r\n".encode()
    headers = {"kbn-xsrf": "true",
               "Content-Type": f"multipart/form-data; boundary={boundary}"}
    if tgt.token:
        headers["Authorization"] = f"ApiKey {tgt.token}"
    elif tgt.basic:
        pair = f"{tgt.username}:{tgt.password}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
    base = tgt.url + (f"/s/{space}" if space else "")
    pool = http or urllib3.PoolManager()
    try:
        resp = pool.request("POST", f"{base}/api/saved_objects/_import?overwrite=true",
                            body=body, headers=headers, timeout=TIMEOUT_S, retries=False)
    except urllib3.exceptions.HTTPError as exc:
        raise PushError(f"Kibana at {tgt.url}: {type(exc).__name__}") from None
    try:
        result: dict[str, Any] = json.loads(resp.data)
    except ValueError:
        result = {}
    if resp.status != 200 or not result.get("success"):
        errors = [f"{e.get('type')}/{e.get('id')}: {e.get('error', {}).get('type')}"
                  for e in result.get("errors", [])]
        detail = "; ".join(errors) or str(result.get("message", resp.data[:200]))
        raise PushError(f"Kibana at {tgt.url}: HTTP {resp.status}: {detail}")
    return result


# --- command line -----------------------------------------------------------------


def run(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> list[str]:
    """Push what was asked for; returns one line per thing done."""
    env = os.environ if env is None else env
    if not args.grafana and not args.kibana:
        raise PushError("nothing to push: give --grafana URL and/or --kibana URL")
    done = []
    if args.grafana:
        tgt = target(args.grafana, env, prefix="GRAFANA", key_var="GRAFANA_TOKEN",
                     token_file=args.grafana_token_file,
                     password_file=args.grafana_password_file)
        uids = push_grafana(tgt, args.grafana_folder, args.grafana_folder_uid)
        done.append(f"grafana {tgt.url}: {len(uids)} dashboards into folder "
                    f"{args.grafana_folder_uid}: {', '.join(uids)}")
    if args.kibana:
        tgt = target(args.kibana, env, prefix="KIBANA", key_var="KIBANA_API_KEY",
                     token_file=args.kibana_api_key_file,
                     password_file=args.kibana_password_file)
        result = push_kibana(tgt, args.kibana_space)
        done.append(f"kibana {tgt.url}: {result.get('successCount', 0)} saved objects imported")
    return done
