"""Error codes of the serving roles, and the one domain exception that carries them.

Domain code raises `ServingError(ErrorCode.X, message, param=...)`; the HTTP edge answers it
with the code's status and OpenAI-style body `{"error": {"message", "type", "param", "code"}}`.
A peer's error body is read back into a `ServingError` with `from_answer`.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from mooncake_cli.interfaces import MooncakeError


class ErrorCode(str, Enum):
    """Each code has one HTTP status and one OpenAI error type."""

    def __new__(cls, code: str, status: int, kind: str) -> ErrorCode:
        member = str.__new__(cls, code)
        member._value_ = code
        member.status = status
        member.kind = kind
        return member

    status: int
    kind: str

    INVALID_REQUEST = ("invalid_request", 400, "invalid_request_error")
    UNKNOWN_PARAMETER = ("unknown_parameter", 400, "invalid_request_error")
    UNSUPPORTED_PARAMETER = ("unsupported_parameter", 400, "invalid_request_error")
    CONTEXT_LENGTH_EXCEEDED = ("context_length_exceeded", 400, "invalid_request_error")
    UNAUTHORIZED = ("unauthorized", 401, "authentication_error")
    INVALID_API_KEY = ("invalid_api_key", 401, "invalid_request_error")
    FORBIDDEN = ("forbidden", 403, "permission_error")
    MODEL_NOT_FOUND = ("model_not_found", 404, "invalid_request_error")
    NOT_FOUND = ("not_found", 404, "not_found")
    METHOD_NOT_ALLOWED = ("method_not_allowed", 405, "invalid_request_error")
    REQUEST_TIMEOUT = ("request_timeout", 408, "invalid_request_error")
    CONFLICT = ("conflict", 409, "invalid_request_error")
    BLOCK_MISMATCH = ("block_mismatch", 409, "upstream_error")
    PAYLOAD_TOO_LARGE = ("payload_too_large", 413, "invalid_request_error")
    DECODE_TOO_LARGE = ("decode_too_large", 413, "invalid_request_error")
    UNSUPPORTED_MEDIA = ("unsupported_media_type", 415, "invalid_request_error")
    SLO = ("slo", 429, "rate_limit_exceeded")
    DECODE_FULL = ("decode_full", 429, "rate_limit_exceeded")
    INTERNAL = ("internal_error", 500, "server_error")
    UPSTREAM_MALFORMED = ("upstream_malformed", 502, "upstream_error")
    DECODE_UNREACHABLE = ("decode_unreachable", 502, "upstream_error")
    DECODE_REFUSED = ("decode_refused", 502, "upstream_error")
    PREFILL_FAILED = ("prefill_failed", 502, "server_error")
    KV_FULL = ("kv_full", 503, "unavailable")
    UNAVAILABLE = ("unavailable", 503, "unavailable")
    QUEUE_FULL = ("queue_full", 503, "unavailable")
    NO_INSTANCE = ("no_instance", 503, "server_error")
    UPSTREAM_FAILED = ("upstream_failed", 503, "server_error")


class ServingError(MooncakeError):
    """A request that cannot be served: its `code`, a message saying why, the request field it
    is about (`param`) and, for codes a client may retry, `retry_after` seconds."""

    def __init__(self, code: ErrorCode, message: str, param: str | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.retry_after = retry_after

    @property
    def status(self) -> int:
        return self.code.status

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.code.kind,
                          "param": self.param, "code": self.code.value}}

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)} if self.retry_after is not None else {}


def peer_code(body: dict[str, Any]) -> tuple[str, ErrorCode | None]:
    """(message, code) of a peer's error body; the code is None when absent or unknown."""
    raw = body.get("error")
    err: dict[str, Any] = raw if isinstance(raw, dict) else {}
    message = err.get("message")
    code = err.get("code")
    known = {c.value: c for c in ErrorCode}
    return (message if isinstance(message, str) else str(body),
            known.get(code) if isinstance(code, str) else None)


def bad(message: str, param: str | None = None) -> ServingError:
    """A 400 invalid request about field `param`."""
    return ServingError(ErrorCode.INVALID_REQUEST, message, param)
