"""The OpenAI answers: whole `text_completion` / `chat.completion` objects, their streaming
chunks and the usage object, for a validated `Completion`."""

from __future__ import annotations

from typing import Any

from mooncake_cli.api.openai import Completion


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
