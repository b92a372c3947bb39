"""A decode worker's token events -> the OpenAI answer: the whole object (`collect`) or its
server-sent chunks (`sse`), timing every token for the conductor's TTFT and TBT metrics."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from mooncake_cli.api import openai_answers as out
from mooncake_cli.api.errors import ErrorCode, ServingError
from mooncake_cli.api.openai import Completion
from mooncake_cli.conductor.live_metrics import ConductorMetrics

log = logging.getLogger(__name__)


async def timed(events: AsyncIterator[dict[str, Any]], start: float,
                metrics: ConductorMetrics) -> AsyncIterator[dict[str, Any]]:
    """`events` unchanged; the time to the first token and between tokens go to `metrics`.
    However it ends, `events` is closed (its booking released) before this returns."""
    last, gaps, ttft, tokens = start, [], None, 0
    try:
        async for ev in events:
            if "token" in ev:
                now = time.monotonic()
                if ttft is None:
                    ttft = now - start
                else:
                    gaps.append(now - last)
                last = now
                tokens += 1
            yield ev
    finally:
        await events.aclose()  # type: ignore[attr-defined]
        if tokens:
            metrics.add("completion_tokens_total", tokens)
        metrics.observe(ttft, gaps)


async def collect(req: Completion, rid: str, events: AsyncIterator[dict[str, Any]],
                  start: float, metrics: ConductorMetrics, prompt_tokens: int,
                  cached: int) -> dict[str, Any]:
    """The whole answer; a `ServingError` of the decode side propagates."""
    texts, finish, n = [], "length", 0
    async for ev in timed(events, start, metrics):
        if "token" in ev:
            texts.append(ev.get("text", ""))
            n += 1
        if ev.get("finish_reason"):
            finish = ev["finish_reason"]
    return out.answer(req, rid, "".join(texts), finish, prompt_tokens, n, cached)


async def sse(req: Completion, rid: str, events: AsyncIterator[dict[str, Any]], start: float,
              metrics: ConductorMetrics, prompt_tokens: int,
              cached: int) -> AsyncIterator[dict[str, Any] | str]:
    """The answer's chunks ending in [DONE]; a decode failure becomes an `error` event."""
    n, first = 0, True
    stream = timed(events, start, metrics)
    try:
        async for ev in stream:
            if "token" in ev:
                n += 1
                yield out.chunk(req, rid, ev.get("text", ""), None, first=first)
                first = False
            if ev.get("finish_reason"):
                yield out.chunk(req, rid, None, ev["finish_reason"])
    except ServingError as e:
        yield {"error": e.body()["error"]}
    except Exception as e:  # a bug: the client still gets an error event, not a cut stream
        log.exception("request %s: the answer's stream failed", rid)
        metrics.add("errors_total")
        yield {"error": ServingError(ErrorCode.INTERNAL, f"the conductor failed: "
                                     f"{type(e).__name__}: {e}").body()["error"]}
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    if req.include_usage:
        yield out.usage_chunk(req, rid, prompt_tokens, n, cached)
    yield "[DONE]"
