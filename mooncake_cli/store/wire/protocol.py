"""The master's wire protocol: msgspec Structs encoded with msgpack.

A request is one of the `Request` structs (requests.py, re-exported here), tagged by its `op`
field ("put_start", "exists" ...). Each struct knows how to run itself against a StoreMaster
(`call`). Every reply is a `Reply`, encoded as the array [ok, code, message, result]: `ok`, an
upstream-compatible `code` (0 or negative), a `message`, and `result`, the msgpack of the
operation's value (decoded by the client with the type it expects). A batch operation's result
is a list of `Reply`, one per key, which a client may decode at once as (ok, code, message,
value) tuples (`batch`, `each`). Masters and clients run the same mooncake-cli version.

Framing over zmq: [body] or [body, mac], where mac is the HMAC-SHA256 of body keyed by the shared
secret (required when the master has one). A REQ peer's empty delimiter frame is accepted too.
Decoding is strict: anything malformed, truncated, wrongly typed, with a key over MAX_KEY_BYTES or
a size outside [1, MAX_OBJECT_SIZE] is answered with INVALID_PARAMS and never reaches the master.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from typing import Any, Optional

import msgspec

from mooncake_cli.store.errors import InvalidParams, StoreCode, StoreError, error_from_code
from mooncake_cli.store.master import StoreMaster
from mooncake_cli.store.wire import incoming
from mooncake_cli.store.wire.requests import *  # noqa: F403  (every request, for callers)
from mooncake_cli.store.wire.requests import BATCHES, BatchGetReplicaList, BatchPutStart, Request
from mooncake_cli.store.wire.short import Found, Run


class Reply(msgspec.Struct, frozen=True, array_like=True):
    ok: bool
    code: int = 0
    message: str = ""
    result: msgspec.Raw = msgspec.Raw(b"\xc0")  # msgpack nil


_ENCODER = msgspec.msgpack.Encoder()
_BATCHES = frozenset(BATCHES)  # a set of the types: isinstance on a Struct costs 0.15 µs a class
_REQUEST = msgspec.msgpack.Decoder(Request)
_REPLY = msgspec.msgpack.Decoder(Reply)


def encode(obj: Any) -> bytes:
    return _ENCODER.encode(obj)


def decode_request(body: bytes) -> Request:
    """The request in `body`; InvalidParams saying what is wrong with it otherwise."""
    try:
        return _REQUEST.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise InvalidParams(f"malformed request: {e}") from None
    except (TypeError, ValueError, OverflowError, RecursionError) as e:
        raise InvalidParams(f"malformed request: {type(e).__name__}: {e}") from None


def ok(value: Any = None) -> Reply:
    return Reply(True, 0, "", msgspec.Raw(encode(value)))


def error(e: StoreError) -> Reply:
    return Reply(False, int(e.code), str(e))


def replies(values: Sequence[Any]) -> Reply:
    """The reply to a batch: per key a Reply of its value or its StoreError. Encoded in one go,
    each key's Reply as the array it encodes to (no Reply or Raw made per key)."""
    return Reply(True, 0, "", msgspec.Raw(_ENCODER.encode(
        [[False, int(v.code), str(v), None] if isinstance(v, StoreError) else [True, 0, "", v]
         for v in values])))


def run(master: StoreMaster, req: Request) -> Reply:
    """Run `req` against `master`; StoreErrors become error replies."""
    try:
        value: Any = req.call(master)
    except StoreError as e:
        return error(e)
    if type(req) not in _BATCHES:
        return ok(value)
    if type(req) is BatchPutStart and req.runs and (run := Run.of(value)) is not None:
        return ok(run)
    if type(req) is BatchGetReplicaList and req.runs and (found := Found.of(value)) is not None:
        return ok(found)
    return replies(value)


def decode_reply(body: bytes) -> Reply:
    try:
        return _REPLY.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise StoreError(f"malformed reply from the master: {e} (a master of another "
                         "mooncake-cli version? masters and clients run the same one)",
                         StoreCode.RPC_FAIL) from None


# by kind: the types the client asks (records that replies carry many of: incoming.py)
_DECODERS: dict[Any, Any] = dict(incoming.DECODERS)


def _decoder(kind: Any) -> Any:
    """A Decoder of `kind`, made once (a third of a batch reply's per-key decoding was
    `decode(type=...)` looking its type up again)."""
    dec = _DECODERS.get(kind)
    if dec is None:
        dec = _DECODERS[kind] = msgspec.msgpack.Decoder(kind)
    return dec


def error_of(reply: Reply) -> StoreError:
    """The StoreError a refusal carries."""
    return error_from_code(reply.code, reply.message)


def result(reply: Reply, kind: Any, decoder: Any = None) -> Any:
    """The reply's value as `kind` (None: no value wanted), or the StoreError it carries."""
    if not reply.ok:
        raise error_of(reply)
    if kind is None:
        return None
    try:
        return (decoder or _decoder(kind)).decode(reply.result)
    except (msgspec.DecodeError, msgspec.ValidationError, StoreError) as e:  # StoreError: a
        # record's own checks refused it
        raise StoreError(f"unexpected result from the master: {e}", StoreCode.RPC_FAIL) from None


_BATCH: dict[Any, Any] = {}


def batch(kind: Any) -> Any:
    """The kind to ask a batch request's reply as: per key a (ok, code, message, value as
    `kind`) tuple, decoded in one go (see `each`)."""
    k = _BATCH.get(kind)
    if k is None:
        k = _BATCH[kind] = list[tuple[bool, int, str, Optional[kind]]]  # noqa: UP045
    return k


def each(items: Sequence[tuple[bool, int, str, Any]]) -> list[Any]:
    """Per key of a reply asked as `batch(kind)`: its value, or the StoreError it carries."""
    return [v if ok else error_from_code(code, msg) for ok, code, msg, v in items]


def results(replies: Sequence[Reply], kind: Any,
            failed: Any = None) -> tuple[list[Any], list[StoreError | None]]:
    """Per reply of a batch: its value as `kind` and None, or `failed` and its StoreError."""
    values: list[Any] = []
    errors: list[StoreError | None] = []
    decoder = None if kind is None else _decoder(kind)
    for reply in replies:
        try:
            values.append(result(reply, kind, decoder))
            errors.append(None)
        except StoreError as e:
            values.append(failed)
            errors.append(e)
    return values, errors


def mac(secret: bytes, body: bytes) -> bytes:
    return hmac.new(secret, body, hashlib.sha256).digest()


def mac_ok(secret: bytes, body: bytes, tag: bytes) -> bool:
    return hmac.compare_digest(mac(secret, body), tag)
