"""TLS and basic auth for the HTTP endpoint, from a web-config file in the Prometheus
exporter-toolkit format (tls_server_config, http_server_config, basic_auth_users,
rate_limit), so operators reuse the file they already have for node_exporter.

Departures from the Go toolkit, each because Python's ssl module cannot do otherwise:
- `RequestClientCert` and `RequireAnyClientCert` (ask for a client certificate but do not
  verify it) are rejected: Python verifies every client certificate it asks for. Use
  `VerifyClientCertIfGiven` or `RequireAndVerifyClientCert` with a client CA.
- `curve_preferences` applies its first curve only (ssl.SSLContext.set_ecdh_curve).
- `http_server_config.http2` is accepted and ignored: the endpoint speaks HTTP/1.1.

This module must never log or keep a password in clear text: successful checks are cached
under a keyed hash of (user, password) only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import re
import ssl
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from gpu_audit.config_section import Section
from gpu_audit.errors import ConfigError
from gpu_audit.yamlload import load_yaml, read_text, validate

ClientAuthType = Literal["NoClientCert", "RequestClientCert", "RequireAnyClientCert",
                         "VerifyClientCertIfGiven", "RequireAndVerifyClientCert"]
TlsVersion = Literal["TLS10", "TLS11", "TLS12", "TLS13"]

_TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                 "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}

# Go crypto/tls cipher suite names (TLS <= 1.2) -> OpenSSL names.
_CIPHERS = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
}
_CURVES = {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1",
           "X25519": "X25519"}
log = logging.getLogger(__name__)

_HEADERS = ("Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options",
            "X-XSS-Protection", "Strict-Transport-Security")


class TlsServerConfig(Section):
    cert: str | None = None
    key: str | None = None
    client_ca: str | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    client_auth_type: ClientAuthType = "NoClientCert"
    client_ca_file: Path | None = None
    client_allowed_sans: list[str] = Field(default_factory=list)
    min_version: TlsVersion = "TLS12"
    max_version: TlsVersion = "TLS13"
    cipher_suites: list[str] = Field(default_factory=list)
    prefer_server_cipher_suites: bool = True
    curve_preferences: list[str] = Field(default_factory=list)

    @field_validator("client_auth_type")
    @classmethod
    def _auth_type(cls, v: str) -> str:
        if v in ("RequestClientCert", "RequireAnyClientCert"):
            raise ValueError(f"{v} is not supported: Python's ssl module verifies every client"
                             " certificate it asks for; use VerifyClientCertIfGiven or"
                             " RequireAndVerifyClientCert with client_ca_file")
        return v

    @field_validator("cipher_suites")
    @classmethod
    def _ciphers(cls, v: list[str]) -> list[str]:
        unknown = [c for c in v if c not in _CIPHERS]
        if unknown:
            raise ValueError(f"unknown cipher suite(s) {', '.join(unknown)}; known:"
                             f" {', '.join(sorted(_CIPHERS))}")
        return v

    @field_validator("curve_preferences")
    @classmethod
    def _curves(cls, v: list[str]) -> list[str]:
        unknown = [c for c in v if c not in _CURVES]
        if unknown:
            raise ValueError(f"unknown curve(s) {', '.join(unknown)}; known:"
                             f" {', '.join(sorted(_CURVES))}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> TlsServerConfig:
        problems = []
        if (self.cert is None) == (self.cert_file is None):
            problems.append("exactly one of cert and cert_file is required")
        if (self.key is None) == (self.key_file is None):
            problems.append("exactly one of key and key_file is required")
        has_ca = self.client_ca is not None or self.client_ca_file is not None
        if self.client_ca is not None and self.client_ca_file is not None:
            problems.append("client_ca and client_ca_file are mutually exclusive")
        if self.client_auth_type != "NoClientCert" and not has_ca:
            problems.append(f"client_auth_type {self.client_auth_type} needs client_ca_file")
        if has_ca and self.client_auth_type == "NoClientCert":
            problems.append("client CA configured without a client_auth_type")
        if self.client_allowed_sans and self.client_auth_type != "RequireAndVerifyClientCert":
            problems.append("client_allowed_sans needs client_auth_type"
                            " RequireAndVerifyClientCert")
        order = list(_TLS_VERSIONS)
        if order.index(self.min_version) > order.index(self.max_version):
            problems.append("min_version is above max_version")
        if problems:
            raise ValueError("; ".join(problems))
        return self


class HttpServerConfig(Section):
    http2: bool = True
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("headers")
    @classmethod
    def _headers(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [h for h in v if h not in _HEADERS]
        if bad:
            raise ValueError(f"header(s) {', '.join(bad)} cannot be set; allowed:"
                             f" {', '.join(_HEADERS)}")
        if v.get("X-Frame-Options", "deny").lower() not in ("deny", "sameorigin"):
            raise ValueError("X-Frame-Options must be deny or sameorigin")
        if v.get("X-Content-Type-Options", "nosniff").lower() != "nosniff":
            raise ValueError("X-Content-Type-Options must be nosniff")
        return v


class RateLimitConfig(Section):
    interval: float = Field(default=0.0, ge=0, description="Seconds between requests; 0 disables.")
    burst: int = Field(default=0, ge=0)

    @field_validator("interval", mode="before")
    @classmethod
    def _duration(cls, v: object) -> object:
        if isinstance(v, str):
            return _parse_duration(v)
        return v


def _parse_duration(text: str) -> float:
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    for suffix in ("ms", "s", "m", "h"):
        if text.endswith(suffix):
            number = text[: -len(suffix)]
            try:
                return float(number) * units[suffix]
            except ValueError:
                break
    raise ValueError(f"{text!r} is not a duration like 1s, 500ms, 2m")


# bcrypt's own alphabet; a hash is $2b$NN$ then 22 salt and 31 digest characters
_BCRYPT = re.compile(r"^\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}$")
# Cost bounds. 4 is bcrypt's own minimum. Each step doubles the work: cost 16 is about
# 4 s of one core per check here (BENCHMARKS-style measurement on the CI machine), under
# Prometheus' default 10 s scrape timeout for the first, uncached login; 17 would be ~8 s
# and anything higher turns every unknown user's login into a CPU-bound denial of service
# (cost 31 is days per check).
MIN_BCRYPT_COST = 4
MAX_BCRYPT_COST = 16


def _bcrypt_hash(value: str) -> str:
    """A bcrypt hash bcrypt can check in bounded time; the error never shows the hash."""
    if not value.startswith(("$2a$", "$2b$", "$2y$")):
        raise ValueError("not a bcrypt hash (one starting $2a$, $2b$ or $2y$, e.g. from "
                         "`htpasswd -nBC 10 USER`)")
    match = _BCRYPT.match(value)
    if match is None:
        raise ValueError("not a complete bcrypt hash: expected $2b$NN$ and 53 characters of "
                         "bcrypt's base-64 (was it truncated or quoted wrongly?)")
    cost = int(match.group(1))
    if not MIN_BCRYPT_COST <= cost <= MAX_BCRYPT_COST:
        raise ValueError(f"cost {cost} is outside {MIN_BCRYPT_COST}..{MAX_BCRYPT_COST}: above "
                         f"{MAX_BCRYPT_COST} one login takes longer than a scrape timeout")
    return value


BcryptHash = Annotated[str, AfterValidator(_bcrypt_hash)]


class WebConfig(Section):
    tls_server_config: TlsServerConfig | None = None
    http_server_config: HttpServerConfig = Field(default_factory=HttpServerConfig)
    basic_auth_users: dict[str, BcryptHash] = Field(default_factory=dict)
    rate_limit: RateLimitConfig = RateLimitConfig()



def load_web_config(path: Path) -> WebConfig:
    """Load and validate a web-config file; ConfigError lists every problem."""
    data, marks = load_yaml(read_text(path), str(path))
    cfg = validate(WebConfig, data, str(path), marks)
    tls = cfg.tls_server_config
    if tls is not None:
        # Relative paths are relative to the web-config file, as in the toolkit.
        missing = [f"tls_server_config.{name}: file {p} does not exist"
                   for name in ("cert_file", "key_file", "client_ca_file")
                   if (p := _resolve(path, getattr(tls, name))) is not None and not p.is_file()]
        if missing:
            raise ConfigError(str(path), missing)
        cfg = cfg.model_copy(update={"tls_server_config": tls.model_copy(update={
            name: _resolve(path, getattr(tls, name))
            for name in ("cert_file", "key_file", "client_ca_file")})})
    return cfg


def _resolve(base: Path, p: Path | None) -> Path | None:
    if p is None or p.is_absolute():
        return p
    return base.parent / p


def build_ssl_context(tls: TlsServerConfig) -> ssl.SSLContext:
    """A server-side SSLContext for the TLS settings. Raises ConfigError on bad files."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = _TLS_VERSIONS[tls.min_version]
    ctx.maximum_version = _TLS_VERSIONS[tls.max_version]
    try:
        if tls.cert_file is not None and tls.key_file is not None:
            ctx.load_cert_chain(str(tls.cert_file), str(tls.key_file))
        else:
            _load_inline_chain(ctx, tls.cert or "", tls.key or "")
        if tls.client_ca_file is not None:
            ctx.load_verify_locations(cafile=str(tls.client_ca_file))
        elif tls.client_ca is not None:
            ctx.load_verify_locations(cadata=tls.client_ca)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError("tls_server_config", [f"cannot load certificate or key: {exc}"]) \
            from None
    ctx.verify_mode = {"NoClientCert": ssl.CERT_NONE,
                       "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
                       "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}[tls.client_auth_type]
    if tls.cipher_suites:
        ctx.set_ciphers(":".join(_CIPHERS[c] for c in tls.cipher_suites))
    if tls.prefer_server_cipher_suites:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    if tls.curve_preferences:
        ctx.set_ecdh_curve(_CURVES[tls.curve_preferences[0]])
    return ctx


def _load_inline_chain(ctx: ssl.SSLContext, cert: str, key: str) -> None:
    # ssl can only load a chain from files; write them to a private temp dir and remove it.
    with tempfile.TemporaryDirectory() as tmp:
        cert_path, key_path = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
        cert_path.write_text(cert, encoding="utf-8")
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(key)
        ctx.load_cert_chain(str(cert_path), str(key_path))


def allowed_san(peer_cert: Mapping[str, Any] | None, allowed: list[str]) -> bool:
    """True when the verified client certificate has a SAN exactly in `allowed`."""
    if not allowed:
        return True
    if not peer_cert:
        return False
    sans = peer_cert.get("subjectAltName", ())
    values = {str(v) for _, v in sans} if isinstance(sans, tuple) else set()
    return bool(values.intersection(allowed))


def _bcrypt_cost(hashed: bytes) -> int:
    # $2b$10$... : the cost is the third field
    try:
        return int(hashed.split(b"$")[2])
    except (IndexError, ValueError):
        return 0


class BasicAuth:
    """Checks `Authorization: Basic` headers against bcrypt hashes, caching successes.

    bcrypt at cost 10 takes tens of ms, far above the scrape budget, so a verified
    (user, password) pair is remembered under an HMAC with a per-process random key; the
    password itself is never stored. Failures are not cached (a brute force pays bcrypt).
    """

    def __init__(self, users: dict[str, str]) -> None:
        self._users = {u: h.encode() for u, h in users.items()}
        self._key = os.urandom(32)
        self._ok: set[bytes] = set()
        self._lock = threading.Lock()
        # Unknown users are checked against the costliest configured hash (and refused
        # whatever the outcome), so timing does not tell which user names exist. Reusing
        # a configured hash, rather than computing a dummy one here, keeps start-up free
        # of bcrypt work: a slow hash cannot delay start-up or a SIGTERM during it.
        self._dummy = max(self._users.values(), key=_bcrypt_cost, default=b"")
        self._bcrypt: Any = None
        if self._users:
            # Imported only when basic auth is on: an exporter without it never keeps
            # bcrypt resident. Here, not at the first login, so no request
            # waits for the import.
            import bcrypt  # noqa: PLC0415

            self._bcrypt = bcrypt

    @property
    def enabled(self) -> bool:
        return bool(self._users)

    def check(self, header: str | None) -> bool:
        if not self._users:
            return True
        if not header or not header.startswith("Basic "):
            return False
        try:
            raw = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        user, sep, password = raw.partition(":")
        if not sep:
            return False
        tag = hmac.new(self._key, f"{user}\0{password}".encode(), hashlib.sha256).digest()
        with self._lock:
            cached = any(hmac.compare_digest(tag, t) for t in self._ok)
        if cached:
            return True
        hashed = self._users.get(user)
        try:
            ok = self._bcrypt.checkpw(password.encode(),
                                      hashed if hashed is not None else self._dummy)
        except ValueError:
            # a hash bcrypt cannot use (load-time validation was bypassed): refuse, as
            # for a wrong password; a 500 would tell the client more than a 401
            log.error("basic auth: the configured hash for a user is not a usable bcrypt "
                      "hash; refusing the login")
            return False
        if ok and hashed is not None:
            with self._lock:
                self._ok.add(tag)
            return True
        return False


class RateLimiter:
    """Token bucket from the toolkit's rate_limit (interval between requests, burst)."""

    def __init__(self, cfg: RateLimitConfig) -> None:
        self._interval = cfg.interval
        self._burst = max(1, cfg.burst)
        self._tokens = float(self._burst)
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def allow(self) -> bool:
        if self._interval <= 0:
            return True
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self._burst, self._tokens + (now - self._last) / self._interval)
            self._last = now
            if self._tokens >= 1:
                self._tokens -= 1
                return True
            return False
