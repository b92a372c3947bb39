"""A decode worker's token events -> the OpenAI answer: the whole object (`collect`) or its
server-sent chunks (`sse`), timing every token for the conductor's TTFT and TBT metrics."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from mooncake_cli.conductor import openai_api as oa
from mooncake_cli.conductor.live_metrics import ConductorMetrics
from mooncake_cli.jsonhttp import HTTPError


def timed(events: Iterator[dict[str, Any]], start: float,
          metrics: ConductorMetrics) -> Iterator[dict[str, Any]]:
    """`events` unchanged; the time to the first token and between tokens go to `metrics`."""
    last, gaps, ttft = start, [], None
    for ev in events:
        if "token" in ev:
            now = time.monotonic()
            if ttft is None:
                ttft = now - start
            else:
                gaps.append(now - last)
            last = now
            metrics.add("completion_tokens_total")
        yield ev
    metrics.observe(ttft, gaps)


def collect(req: oa.Completion, rid: str, events: Iterator[dict[str, Any]], start: float,
            metrics: ConductorMetrics, prompt_tokens: int, cached: int) -> dict[str, Any]:
    """The whole answer; an `HTTPError` of the decode side propagates."""
    texts, finish, n = [], "length", 0
    for ev in timed(events, start, metrics):
        if "token" in ev:
            texts.append(ev.get("text", ""))
            n += 1
        if ev.get("finish_reason"):
            finish = ev["finish_reason"]
    return oa.answer(req, rid, "".join(texts), finish, prompt_tokens, n, cached)


def sse(req: oa.Completion, rid: str, events: Iterator[dict[str, Any]], start: float,
        metrics: ConductorMetrics, prompt_tokens: int,
        cached: int) -> Iterator[dict[str, Any] | str]:
    """The answer's chunks ending in [DONE]; a decode failure becomes an `error` event."""
    n, first = 0, True
    try:
        for ev in timed(events, start, metrics):
            if "token" in ev:
                n += 1
                yield oa.chunk(req, rid, ev.get("text", ""), None, first=first)
                first = False
            if ev.get("finish_reason"):
                yield oa.chunk(req, rid, None, ev["finish_reason"])
    except HTTPError as e:
        yield {"error": e.body["error"]}
    if req.include_usage:
        yield oa.usage_chunk(req, rid, prompt_tokens, n, cached)
    yield "[DONE]"
