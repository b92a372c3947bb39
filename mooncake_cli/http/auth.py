"""The cluster secret between the roles' HTTP endpoints, and the OpenAI API key.

    secret = resolve_secret(flag, file)            # --secret / --secret-file / MOONCAKE_SECRET
    require_secret(host, secret, "the conductor")  # refuses beyond loopback without one
    signer = Signer(secret)                        # the caller's side (jsonhttp signs with it)
    gate = Gate(secret, api_key, openai_paths)     # the edge's side (`edge_app(guard=gate)`)

A signed request carries `X-Mooncake-Auth: v1 TS NONCE BODY-DIGEST MAC`, where MAC is an
HMAC-SHA256 keyed by the secret over the method, path, TS, NONCE and the body's BLAKE2b: the
secret never travels, a request is refused more than `WINDOW` seconds from its TS or when its
NONCE was seen, and the body is checked against its digest as it is read. The OpenAI routes
take `Authorization: Bearer KEY` instead, as vLLM's --api-key does.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import Collection
from typing import Any

from starlette.requests import Request
from starlette.types import Message, Receive

from mooncake_cli.api.errors import ErrorCode, ServingError
from mooncake_cli.interfaces import ConfigError

log = logging.getLogger("mooncake.auth")
HEADER = "x-mooncake-auth"
WINDOW = 60.0  # seconds a signed request stays valid (clock skew between hosts included)
MAX_NONCES = 1_000_000  # nonces remembered within the window
PUBLIC = frozenset({"/health", "/metrics"})
INSECURE_ENV = "MOONCAKE_INSECURE"
HOW = "give the cluster secret with --secret-file FILE, MOONCAKE_SECRET or --secret"


def new_secret() -> str:
    """A fresh cluster secret (256 random bits)."""
    return secrets.token_urlsafe(32)


def resolve_secret(secret: str | None, secret_file: str | None) -> str:
    """The cluster secret of `--secret` or the first line of `--secret-file` ("" for none)."""
    if secret_file:
        try:
            with open(secret_file, encoding="utf-8") as fh:
                text = fh.readline().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"--secret-file {secret_file}: cannot read it: {e}") from None
        if not text:
            raise ConfigError(f"--secret-file {secret_file} is empty")
        if os.stat(secret_file).st_mode & 0o077:
            log.warning("--secret-file %s can be read by other users: chmod 600 it",
                        secret_file)
        if secret and secret != text:
            raise ConfigError("--secret and --secret-file disagree: give one of them")
        return text
    return secret or ""


def env_secret() -> str:
    """The cluster secret a process was given through its environment (MOONCAKE_SECRET, or the
    file MOONCAKE_SECRET_FILE names; "" for none): how the upstream-compatible APIs, whose
    signatures have no place for it, learn it (a vLLM role passes it to its engine cores)."""
    return resolve_secret(os.environ.get("MOONCAKE_SECRET") or None,
                          os.environ.get("MOONCAKE_SECRET_FILE") or None)


def is_loopback(host: str) -> bool:
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name may resolve anywhere


def require_secret(host: str, secret: str, role: str) -> None:
    """ConfigError when `role` would listen on `host`, beyond loopback, without a secret
    (unless MOONCAKE_INSECURE=1)."""
    if secret or is_loopback(host) or os.environ.get(INSECURE_ENV) == "1":
        return
    raise ConfigError(f"{role} would listen on {host}, beyond loopback, without a cluster "
                      f"secret: {HOW} (every role of the cluster the same), or set "
                      f"{INSECURE_ENV}=1 to serve without one")


def body_digest(data: bytes = b"") -> Any:
    """The body's digest: BLAKE2b-256 (here ~5x the speed of SHA-256 in software)."""
    return hashlib.blake2b(data, digest_size=32)


def _mac(key: bytes, method: str, path: str, ts: str, nonce: str, digest: str) -> str:
    msg = "\n".join((method.upper(), path, ts, nonce, digest)).encode()
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


class Signer:
    """Signs requests with the cluster secret."""

    def __init__(self, secret: str) -> None:
        if not secret:
            raise ValueError("a Signer needs a secret")
        self._key = secret.encode()

    def header(self, method: str, path: str, body: bytes) -> tuple[bytes, bytes]:
        ts, nonce = f"{time.time():.3f}", secrets.token_hex(12)
        digest = body_digest(body).hexdigest()
        mac = _mac(self._key, method, path, ts, nonce, digest)
        return HEADER.encode(), f"v1 {ts} {nonce} {digest} {mac}".encode()


def signer(secret: str) -> Signer | None:
    return Signer(secret) if secret else None


def sign_record(secret: str, record: dict[str, Any]) -> dict[str, Any]:
    """`record` with `signed_at` and a `mac` over both (for records kept where others may
    write, such as registrations in etcd)."""
    body = {**record, "signed_at": round(time.time(), 3)}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return {**body, "mac": hmac.new(secret.encode(), canonical, hashlib.sha256).hexdigest()}


def verify_record(secret: str, record: dict[str, Any],
                  max_age: float | None = WINDOW) -> dict[str, Any]:
    """The record `sign_record` signed, without `mac` and `signed_at`; ValueError when its
    MAC is missing or wrong, or it was signed more than `max_age` seconds ago (None: any age,
    for records that are bound to something a replay cannot reuse, such as an etcd lease)."""
    body = {k: v for k, v in record.items() if k != "mac"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    mac = record.get("mac")
    expected = hmac.new(secret.encode(), canonical, hashlib.sha256).hexdigest()
    if not isinstance(mac, str) or not hmac.compare_digest(mac, expected):
        raise ValueError("unsigned, or not signed with this cluster's secret")
    age = time.time() - float(body.pop("signed_at", 0))
    if max_age is not None and not -max_age <= age <= max_age:
        raise ValueError(f"signed {age:.0f} s ago (a replayed record?)")
    return body


def _refused(why: str) -> ServingError:
    return ServingError(ErrorCode.UNAUTHORIZED, f"{why}: this endpoint requires the cluster "
                        "secret (give every role the same --secret-file or MOONCAKE_SECRET)")


class Gate:
    """The edge's guard: /health and /metrics are open; `openai_paths` need the API key (when
    there is one); every other path needs a request signed with the secret (when there is
    one). Awaited before each route; returns the `receive` that checks the body's digest."""

    def __init__(self, secret: str, api_key: str = "",
                 openai_paths: Collection[str] = ()) -> None:
        self._key = secret.encode() if secret else None
        self._api_key = api_key.encode() if api_key else None
        self._openai = frozenset(openai_paths)
        self._nonces: OrderedDict[str, float] = OrderedDict()

    async def __call__(self, request: Request) -> Receive | None:
        path = request.scope["path"]
        if path in PUBLIC:
            return None
        if path in self._openai:
            self._check_api_key(request)
            return None
        if self._key is None:
            return None
        digest = self._check_signature(request)
        return _digest_checked(request.receive, digest)

    def _check_api_key(self, request: Request) -> None:
        if self._api_key is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(),
                                                                 self._api_key):
            raise ServingError(ErrorCode.INVALID_API_KEY, "Incorrect or missing API key: "
                               "send 'Authorization: Bearer <the conductor's --api-key>'")

    def _check_signature(self, request: Request) -> str:
        assert self._key is not None
        parts = request.headers.get(HEADER, "").split(" ")
        if len(parts) != 5 or parts[0] != "v1":
            raise _refused("unsigned request")
        _, ts, nonce, digest, mac = parts
        path = request.scope.get("raw_path", b"").decode("latin-1") or request.url.path
        query = request.scope.get("query_string", b"").decode("latin-1")
        if query:
            path += "?" + query
        expected = _mac(self._key, request.method, path, ts, nonce, digest)
        if not hmac.compare_digest(expected.encode(), mac.encode("latin-1")):
            raise _refused("bad signature (wrong secret?)")
        try:
            skew = abs(time.time() - float(ts))
        except ValueError:
            raise _refused("bad timestamp") from None
        if not skew <= WINDOW:
            raise _refused(f"signed {skew:.0f} s away from this host's clock (more than "
                           f"{WINDOW:g} s: replayed, or clocks apart)")
        self._remember(nonce)
        return digest

    def _remember(self, nonce: str) -> None:
        now = time.monotonic()
        while self._nonces and next(iter(self._nonces.values())) < now:
            self._nonces.popitem(last=False)
        if nonce in self._nonces:
            raise _refused("replayed request (its nonce was seen)")
        if len(self._nonces) >= MAX_NONCES:
            raise ServingError(ErrorCode.UNAVAILABLE, "too many signed requests within "
                               f"{WINDOW:g} s", retry_after=1)
        self._nonces[nonce] = now + 2 * WINDOW


def _digest_checked(receive: Receive, digest: str) -> Receive:
    """`receive`, refusing the body at its end unless its digest is `digest`."""
    h = body_digest()

    async def checked() -> Message:
        message = await receive()
        if message["type"] == "http.request":
            h.update(message.get("body", b""))
            if not message.get("more_body", False) and \
                    not hmac.compare_digest(h.hexdigest().encode(), digest.encode("latin-1")):
                raise _refused("the body does not match its signature")
        return message

    return checked
