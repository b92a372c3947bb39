"""Encryption in transit for the store RPC: CurveZMQ (which pyzmq ships), keyed by the secret.

Off by default; on with `encrypt` ([store] encrypt, MOONCAKE_STORE_ENCRYPT=1) on the master and
its clients alike (zmq does not negotiate: both sides must agree). The master's Curve25519 key
pair is derived from the cluster secret, so only a holder of the secret knows the master's
public key and can complete the handshake: a stranger is dropped before the master reads one
message of its (no memory for its frames), and every byte on the wire is encrypted and
authenticated. Clients use a fresh key pair per connection. The same-host lane stays a Unix
socket: nothing crosses a network there.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Any

import zmq
import zmq.utils.z85

from mooncake_cli.interfaces import ConfigError

ENV = "MOONCAKE_STORE_ENCRYPT"


def wanted(flag: bool | None) -> bool:
    """`flag`, or MOONCAKE_STORE_ENCRYPT when it is None."""
    if flag is not None:
        return flag
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _server_keys(secret: bytes) -> tuple[bytes, bytes]:
    """(public, secret) z85 keys of the master, derived from the cluster secret."""
    raw = hmac.new(secret, b"mooncake-store-curve-server", hashlib.sha256).digest()
    private = zmq.utils.z85.encode(raw)
    return zmq.curve_public(private), private


def require(secret: bytes | None) -> bytes:
    """`secret`, or ConfigError saying why encryption cannot be had."""
    if not zmq.has("curve"):
        raise ConfigError("this libzmq has no CURVE support: store encryption is unavailable")
    if not secret:
        raise ConfigError("store encryption needs the cluster secret (--secret or "
                          "MOONCAKE_SECRET)")
    return secret


def secure_server(sock: zmq.Socket[Any], secret: bytes | None) -> None:
    public, private = _server_keys(require(secret))
    sock.curve_secretkey = private
    sock.curve_publickey = public
    sock.curve_server = True


def secure_client(sock: zmq.Socket[Any], secret: bytes | None) -> None:
    server_public, _ = _server_keys(require(secret))
    public, private = zmq.curve_keypair()
    sock.curve_serverkey = server_public
    sock.curve_publickey = public
    sock.curve_secretkey = private
