"""What every schema model shares: strict types, unknown fields refused, and a pydantic
validation error turned into one `ServingError` naming the field."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from mooncake_cli.api.errors import ErrorCode, ServingError
from mooncake_cli.interfaces import ConfigError

M = TypeVar("M", bound=BaseModel)


class Message(BaseModel):
    """A message between roles or from a client: strict types, no unknown fields."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


NESTED = {("sampling",), ("load",), ("stream_options",), ("response_format",), ("timing",),
          ("kv_events",)}


def param_of(loc: tuple[int | str, ...]) -> str:
    """The request field an error is about: "stop", "messages[0].content", "sampling.seed"."""
    depth = 3 if loc[:1] == ("messages",) else 2 if loc[:1] in NESTED else 1
    out = ""
    for part in loc[:depth]:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else part
    return out


def refusal(e: ValidationError) -> ServingError:
    """The first problem of `e` as a 400 naming its field."""
    err = e.errors(include_url=False)[0]
    loc = tuple(err.get("loc", ()))
    param = param_of(loc) or None
    if err["type"] == "json_invalid":
        return ServingError(ErrorCode.INVALID_REQUEST, f"body is not valid JSON: {err['msg']}")
    if err["type"] == "model_type" or (not loc and err["type"].endswith("_type")):
        return ServingError(ErrorCode.INVALID_REQUEST, "body must be a JSON object")
    if err["type"] == "extra_forbidden":
        return ServingError(ErrorCode.UNKNOWN_PARAMETER,
                            f"Unrecognized request argument supplied: {param}", param)
    if err["type"] == "missing":
        return ServingError(ErrorCode.INVALID_REQUEST, f"'{param}' is required", param)
    ctx = err.get("ctx") or {}
    reason = str(ctx.get("error")) if err["type"] == "value_error" and "error" in ctx else \
        err["msg"]
    return ServingError(ErrorCode.INVALID_REQUEST, f"'{param}': {reason}", param)


def parse(model: type[M], raw: bytes | str) -> M:
    """Validate a JSON body; any problem is a `ServingError` 400 naming the field (deep
    nesting and lone surrogates are invalid JSON to pydantic's parser)."""
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as e:
        raise refusal(e) from None
    except ConfigError as e:  # the engine's own bounds on sampling parameters
        raise ServingError(ErrorCode.INVALID_REQUEST, f"sampling: {e}", "sampling") from None


def validate(model: type[M], data: Any) -> M:
    """`parse` for an already decoded object (a peer's answer)."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise refusal(e) from None
    except ConfigError as e:
        raise ServingError(ErrorCode.INVALID_REQUEST, f"sampling: {e}", "sampling") from None
