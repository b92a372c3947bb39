"""The OpenAI requests this server accepts, and the validated `Completion` they become.

`parse_completion` / `parse_chat` read a body into a `Completion` or raise a `ServingError` 400
whose `param` names the field: an unknown field, a wrong type, a value out of range, or a
parameter this server cannot honour (logprobs, echo, suffix, best_of > 1, tools, a non-text
response_format, n > 1, non-zero presence/frequency penalties, a logit_bias), never silently
ignored.

Output length: a completion without `max_tokens` gets OpenAI's default of 16 tokens; a chat
completion without `max_completion_tokens` / `max_tokens` may run to the end of the context,
`max_context - prompt tokens` (see `fit_output`), as vLLM's does; decode workers allocate its KV
as it grows, so the cap books nothing. An OpenAI seed
is a signed 64-bit integer; the engine's is its two's-complement bit pattern in [0, 2**64).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from mooncake_cli.api.errors import ErrorCode, ServingError
from mooncake_cli.api.schema import Message, parse
from mooncake_cli.engine.sampling import SamplingParams

MAX_STOP = 4
Seed = Annotated[int, Field(ge=-(1 << 63), lt=1 << 63)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
Bias = Annotated[int, Field(ge=-100, le=100)]


class StreamOptions(Message):
    include_usage: bool = False


class ResponseFormat(Message):
    type: str
    json_schema: dict[str, Any] | None = None


class _Request(Message):
    """The fields completions and chat completions share."""

    model: Annotated[str, Field(min_length=1)]
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None  # vLLM's extension
    n: Annotated[int, Field(ge=1)] | None = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP)] | None = None
    seed: Seed | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    ignore_eos: bool = False  # vLLM's extension
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, Bias] | None = None
    user: Annotated[str, Field(max_length=256)] | None = None

    @model_validator(mode="after")
    def _honourable(self) -> _Request:
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise _unsupported(f"'{name}' other than 0 is not supported by this server",
                                   name)
        if self.logit_bias:
            raise _unsupported("'logit_bias' is not supported by this server", "logit_bias")
        if self.n not in (None, 1):
            raise _unsupported("only n=1 is supported", "n")
        return self

    def sampling(self, max_tokens: int | None) -> SamplingParams:
        """The engine's parameters (max_tokens: the one the request asked for, if any)."""
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        try:
            return SamplingParams(
                max_tokens=max_tokens or 1,
                temperature=1.0 if self.temperature is None else self.temperature,
                top_p=1.0 if self.top_p is None else self.top_p, top_k=self.top_k or 0,
                seed=None if self.seed is None else self.seed % (1 << 64),
                stop=tuple(s for s in stops if s), ignore_eos=self.ignore_eos)
        except Exception as e:  # the engine's own bounds (ModelError), e.g. temperature 1e-9
            raise ServingError(ErrorCode.INVALID_REQUEST, str(e),
                               str(e).split(" ", 1)[0]) from None


def _unsupported(message: str, param: str) -> ServingError:
    return ServingError(ErrorCode.UNSUPPORTED_PARAMETER, message, param)


class CompletionRequest(_Request):
    prompt: str | list[str] | list[Annotated[int, Field(ge=0)]] | list[list[int]]
    logprobs: Annotated[int, Field(ge=0)] | None = None
    echo: bool | None = None
    suffix: str | None = None
    best_of: Annotated[int, Field(ge=1)] | None = None

    @model_validator(mode="after")
    def _completion_only(self) -> CompletionRequest:
        for name in ("logprobs", "suffix"):
            if getattr(self, name) not in (None, 0, ""):
                raise _unsupported(f"'{name}' is not supported by this server", name)
        if self.echo:
            raise _unsupported("'echo' is not supported by this server", "echo")
        if self.best_of not in (None, 1):
            raise _unsupported("only best_of=1 is supported", "best_of")
        return self


class TextPart(Message):
    type: Literal["text"]
    text: str


class OtherPart(Message):
    """A content part of another type (image_url, ...): accepted, its content not read."""

    model_config = Message.model_config | {"extra": "allow"}
    type: str

    @model_validator(mode="after")
    def _not_text(self) -> OtherPart:
        if self.type == "text":
            raise ValueError("a text part needs a string 'text'")
        return self


class ChatMessage(Message):
    role: Annotated[str, Field(min_length=1)]
    content: str | list[TextPart | OtherPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content if isinstance(p, TextPart))
        return self.content or ""


class ChatRequest(_Request):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0)] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    response_format: ResponseFormat | None = None
    parallel_tool_calls: bool | None = None

    @model_validator(mode="after")
    def _chat_only(self) -> ChatRequest:
        for name in ("logprobs", "top_logprobs", "tools", "functions", "tool_choice",
                     "function_call"):
            if getattr(self, name) not in (None, False, 0, [], "none"):
                raise _unsupported(f"'{name}' is not supported by this server", name)
        fmt = self.response_format
        if fmt is not None and fmt.type != "text":
            raise _unsupported("only response_format {'type': 'text'} is supported",
                               "response_format")
        return self


@dataclass(frozen=True)
class Completion:
    """One validated request: `prompt` text or `token_ids`, or chat `messages`. Until
    `fit_output`, `sampling.max_tokens` is final only when `open_ended` is False."""

    model: str
    chat: bool
    stream: bool
    sampling: SamplingParams
    open_ended: bool = False
    prompt: str | None = None
    token_ids: tuple[int, ...] | None = None
    messages: tuple[dict[str, str], ...] = ()
    include_usage: bool = False
    created: int = field(default_factory=lambda: int(time.time()))


def fit_output(req: Completion, prompt_tokens: int, max_context: float) -> Completion:
    """`req` with its output length settled: a chat request that set none gets what is left
    of the context (the model's, or the largest decode cache's when smaller; at least 1, so
    that a full context is reported as such)."""
    if not req.open_ended:
        return req
    n = int(max(1, max_context - prompt_tokens))
    return replace(req, open_ended=False, sampling=replace(req.sampling, max_tokens=n))


def _usage(r: _Request) -> bool:
    return bool(r.stream_options and r.stream_options.include_usage)


def parse_completion(raw: bytes | str) -> Completion:
    r = parse(CompletionRequest, raw)
    prompt: Any = r.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, list) and (not prompt or not all(
            isinstance(t, int) and t >= 0 for t in prompt)):
        raise ServingError(ErrorCode.INVALID_REQUEST, "'prompt' must be a string or a "
                           "non-empty list of token ids (one prompt per request)", "prompt")
    text, ids = (prompt, None) if isinstance(prompt, str) else (None, tuple(prompt))
    max_tokens = 16 if r.max_tokens is None else r.max_tokens
    return Completion(model=r.model, chat=False, stream=r.stream, include_usage=_usage(r),
                      sampling=r.sampling(max_tokens), prompt=text, token_ids=ids)


def parse_chat(raw: bytes | str) -> Completion:
    r = parse(ChatRequest, raw)
    max_tokens = r.max_completion_tokens or r.max_tokens
    return Completion(model=r.model, chat=True, stream=r.stream, include_usage=_usage(r),
                      sampling=r.sampling(max_tokens), open_ended=max_tokens is None,
                      messages=tuple({"role": m.role, "content": m.text()}
                                     for m in r.messages))
