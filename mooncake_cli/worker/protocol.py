"""Validating the bodies the workers accept; a bad field is an HTTP 400 naming it."""

from __future__ import annotations

from typing import Any

from mooncake_cli.engine import ModelError, SamplingParams
from mooncake_cli.jsonhttp import HTTPError


def bad(message: str, param: str | None = None) -> HTTPError:
    return HTTPError(400, message, param=param)


def request_id(body: dict[str, Any]) -> str:
    rid = body.get("request_id")
    if not isinstance(rid, str) or not rid or len(rid) > 256:
        raise bad("'request_id' must be a non-empty string (at most 256 characters)",
                  "request_id")
    return rid


def integer(body: dict[str, Any], name: str, lo: int, default: int | None = None) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise bad(f"'{name}' must be an integer >= {lo}", name)
    return value


def token_ids(value: Any, name: str = "token_ids") -> list[int]:
    if not isinstance(value, list) or not value or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
        raise bad(f"'{name}' must be a non-empty list of non-negative integers", name)
    return list(value)


def _number(raw: dict[str, Any], name: str, default: float) -> float:
    value = raw.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad(f"'sampling.{name}' must be a number", f"sampling.{name}")
    return float(value)


def sampling(body: dict[str, Any]) -> SamplingParams:
    """SamplingParams from the body's "sampling" object (the conductor's Sampling fields plus
    stop_token_ids); absent fields take the engine's defaults."""
    raw = body.get("sampling", {})
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise bad("'sampling' must be an object", "sampling")
    stop = raw.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise bad("'sampling.stop' must be a string or a list of strings", "sampling.stop")
    stop_ids = raw.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in stop_ids):
        raise bad("'sampling.stop_token_ids' must be a list of integers",
                  "sampling.stop_token_ids")
    seed = raw.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise bad("'sampling.seed' must be an integer or null", "sampling.seed")
    ignore_eos = raw.get("ignore_eos", False)
    if ignore_eos is None:
        ignore_eos = False
    if not isinstance(ignore_eos, bool):
        raise bad("'sampling.ignore_eos' must be true or false", "sampling.ignore_eos")
    ints = {}
    for name, default in (("max_tokens", 16), ("top_k", 0)):
        value = raw.get(name, default)
        if value is None:
            value = default
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad(f"'sampling.{name}' must be an integer", f"sampling.{name}")
        ints[name] = value
    try:
        return SamplingParams(
            max_tokens=ints["max_tokens"], temperature=_number(raw, "temperature", 0.0),
            top_p=_number(raw, "top_p", 1.0), top_k=ints["top_k"], seed=seed,
            stop_token_ids=tuple(stop_ids), stop=tuple(s for s in stop if s),
            ignore_eos=ignore_eos)
    except ModelError as e:
        raise bad(f"sampling: {e}", "sampling") from None


def sampling_json(p: SamplingParams) -> dict[str, Any]:
    return {"max_tokens": p.max_tokens, "temperature": p.temperature, "top_p": p.top_p,
            "top_k": p.top_k, "seed": p.seed, "stop": list(p.stop),
            "ignore_eos": p.ignore_eos, "stop_token_ids": list(p.stop_token_ids)}
