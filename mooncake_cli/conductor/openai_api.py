"""The OpenAI wire format: validating completion requests and shaping their answers.

`parse_completion` and `parse_chat` turn a request body into a `Completion` or raise `HTTPError`
400 with an OpenAI-style error (`param` names the offending field). The answer builders produce
the `text_completion` / `chat.completion` objects and their streaming chunks.

Output length: a completion without `max_tokens` gets OpenAI's default of 16 tokens; a chat
completion without `max_completion_tokens` / `max_tokens` may run to the end of the context,
`max_context - prompt tokens`, capped at `CHAT_MAX_TOKENS` (see `fit_output`). Parameters this
server cannot honour (logprobs, echo, suffix, best_of > 1, tools, a non-text response_format,
n > 1) are refused with 400 naming them, never silently ignored.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from mooncake_cli.jsonhttp import HTTPError

MAX_STOP = 4
CHAT_MAX_TOKENS = 4096  # a chat answer's length when the request sets none
SEED_RANGE = (-(1 << 63), 1 << 63)  # a signed 64-bit seed


@dataclass(frozen=True)
class Sampling:
    max_tokens: int | None = 16  # None: as many as the context holds (see `fit_output`)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"max_tokens": self.max_tokens, "temperature": self.temperature,
                "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed,
                "stop": list(self.stop), "ignore_eos": self.ignore_eos}


@dataclass(frozen=True)
class Completion:
    """One validated request: `prompt` text or `token_ids`, or chat `messages`."""

    model: str
    chat: bool
    stream: bool
    sampling: Sampling
    prompt: str | None = None
    token_ids: tuple[int, ...] | None = None
    messages: tuple[dict[str, str], ...] = ()
    include_usage: bool = False
    created: int = field(default_factory=lambda: int(time.time()))


def fit_output(req: Completion, prompt_tokens: int, max_context: float) -> Completion:
    """`req` with its output length settled: a chat request that set none gets what is left
    of the context (the model's, or the largest decode cache's when smaller), at most
    CHAT_MAX_TOKENS (at least 1, so that a full context is reported as such)."""
    if req.sampling.max_tokens is not None:
        return req
    n = int(max(1, min(max_context - prompt_tokens, CHAT_MAX_TOKENS)))
    return replace(req, sampling=replace(req.sampling, max_tokens=n))


def _bad(message: str, param: str) -> HTTPError:
    return HTTPError(400, message, param=param)


def _number(body: dict[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(f"'{name}' must be a number", name)
    if not lo <= value <= hi:
        raise _bad(f"'{name}' must be between {lo} and {hi}, got {value}", name)
    return float(value)


def _integer(body: dict[str, Any], name: str, default: int | None, lo: int) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"'{name}' must be an integer", name)
    if value < lo:
        raise _bad(f"'{name}' must be >= {lo}, got {value}", name)
    return value


def _unsupported(body: dict[str, Any]) -> None:
    """400 for an OpenAI parameter this server would otherwise silently ignore."""
    for name in ("logprobs", "top_logprobs", "suffix", "tools", "functions", "tool_choice",
                 "function_call"):
        if body.get(name) not in (None, False, [], "none"):
            raise _bad(f"'{name}' is not supported by this server", name)
    if body.get("echo") not in (None, False):
        raise _bad("'echo' is not supported by this server", "echo")
    if _integer(body, "best_of", 1, 1) != 1:
        raise _bad("only best_of=1 is supported", "best_of")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise _bad("only response_format {'type': 'text'} is supported", "response_format")


def _sampling(body: dict[str, Any], max_name: str, default_max: int | None) -> Sampling:
    _unsupported(body)
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        if len(stop) > MAX_STOP:
            raise _bad(f"'stop' takes at most {MAX_STOP} strings", "stop")
        stops = tuple(s for s in stop if s)
    else:
        raise _bad("'stop' must be a string or a list of strings", "stop")
    if _integer(body, "n", 1, 1) != 1:
        raise _bad("only n=1 is supported", "n")
    max_tokens = _integer(body, max_name, None, 0)
    if max_tokens is None and max_name == "max_completion_tokens":
        max_tokens = _integer(body, "max_tokens", None, 0)
    seed = _integer(body, "seed", None, SEED_RANGE[0])
    if seed is not None and seed >= SEED_RANGE[1]:
        raise _bad(f"'seed' must be below 2**63, got {seed}", "seed")
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0:
        raise _bad("'top_p' must be > 0 (use temperature 0 for greedy decoding)", "top_p")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise _bad("'ignore_eos' must be a boolean", "ignore_eos")
    return Sampling(
        max_tokens=default_max if max_tokens is None else max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=top_p, top_k=_integer(body, "top_k", 0, 0) or 0,
        seed=seed, stop=stops, ignore_eos=ignore_eos)


def _common(body: dict[str, Any]) -> tuple[str, bool, bool]:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required and must be a string", "model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("'stream' must be a boolean", "stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise _bad("'stream_options' must be an object", "stream_options")
    return model, stream, bool(opts.get("include_usage", False))


def parse_completion(body: dict[str, Any]) -> Completion:
    model, stream, usage = _common(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    text, ids = None, None
    if isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
        ids = tuple(prompt)
    else:
        raise _bad("'prompt' must be a string or a non-empty list of token ids "
                   "(one prompt per request)", "prompt")
    return Completion(model=model, chat=False, stream=stream, include_usage=usage,
                      sampling=_sampling(body, "max_tokens", 16), prompt=text, token_ids=ids)


def parse_chat(body: dict[str, Any]) -> Completion:
    model, stream, usage = _common(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' must be a non-empty list", "messages")
    parsed = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _bad(f"messages[{i}] needs a 'role'", f"messages[{i}]")
        content = m.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            texts = [p.get("text") for p in content
                     if isinstance(p, dict) and p.get("type") == "text"]
            if not all(isinstance(t, str) for t in texts):
                raise _bad(f"messages[{i}].content: a text part needs a string 'text'",
                           f"messages[{i}].content")
            content = "".join(t for t in texts if isinstance(t, str))
        if not isinstance(content, str):
            raise _bad(f"messages[{i}].content must be a string", f"messages[{i}].content")
        parsed.append({"role": m["role"], "content": content})
    return Completion(model=model, chat=True, stream=stream, include_usage=usage,
                      sampling=_sampling(body, "max_completion_tokens", None),
                      messages=tuple(parsed))


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage object; `prompt_tokens_details.cached_tokens` are the prompt tokens whose
    KV was reused from the cache instead of computed."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def answer(req: Completion, rid: str, text: str, finish: str, prompt_tokens: int,
           completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """The whole (non-streaming) answer object."""
    if req.chat:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None,
                                  "message": {"role": "assistant", "content": text}}
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
    return {"id": rid, "object": "chat.completion" if req.chat else "text_completion",
            "created": req.created, "model": req.model, "choices": [choice],
            "usage": usage(prompt_tokens, completion_tokens, cached_tokens)}


def chunk(req: Completion, rid: str, text: str | None, finish: str | None,
          first: bool = False) -> dict[str, Any]:
    """One streaming chunk: a text delta, or the final one with `finish` set."""
    if req.chat:
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text:
            delta["content"] = text
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish,
                                  "logprobs": None}
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
    return {"id": rid, "object": "chat.completion.chunk" if req.chat else "text_completion",
            "created": req.created, "model": req.model, "choices": [choice]}


def usage_chunk(req: Completion, rid: str, prompt_tokens: int, completion_tokens: int,
                cached_tokens: int = 0) -> dict[str, Any]:
    return {"id": rid, "object": "chat.completion.chunk" if req.chat else "text_completion",
            "created": req.created, "model": req.model, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens, cached_tokens)}
