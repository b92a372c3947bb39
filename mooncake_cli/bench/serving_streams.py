"""Concurrent greedy streaming completions through the OpenAI API, each token's arrival timed.

    streams = run_streams(url, model, prompts(100), max_tokens=64, progress=print)

Every request is `/v1/completions` with temperature 0, ignore_eos and stream=true, all sent at
once from one event loop (httpx). A stream records its request id (the chunks' `id`), its text,
the arrival time of each token's chunk, its finish reason, and an error when the response was
not 200, carried an error event, broke, or ended without a finish reason.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

PREFIX = ("You are a careful assistant of a lunar bakery. The bakery sells mooncakes with lotus "
          "seed paste, red bean paste, five kernels and salted egg yolk; it opens at dawn and "
          "closes when the moon rises. Customers ask about fillings, prices, the festival, "
          "storage and delivery. Answer each question in plain sentences, with the facts first "
          "and no lists. Keep a friendly tone, mention the festival when it fits, and never "
          "invent an opening hour. A mooncake keeps for two weeks in a cool and dry place and "
          "for a month in the refrigerator; the salted egg yolk ones should be eaten first. "
          "Gift boxes hold four or eight cakes, and delivery within the city takes one day, "
          "two during the festival week. The bakery takes orders by telephone and at the "
          "counter, never by letter. If a customer asks something the bakery cannot know, say "
          "so briefly. The question follows.\n")
TOPICS = ["lotus seed paste", "red bean paste", "salted egg yolks", "the festival", "storage",
          "delivery", "prices", "five kernels", "the moon", "gift boxes", "tea", "dough"]


def prompts(n: int) -> list[str]:
    """`n` distinct prompts sharing PREFIX (its blocks reused from the store after the first)."""
    return [f"{PREFIX}Question {i}: tell me about {TOPICS[i % len(TOPICS)]}.\nAnswer:"
            for i in range(n)]


@dataclass
class Stream:
    index: int
    rid: str = ""
    text: str = ""
    times: list[float] = field(default_factory=list)  # perf_counter of each token's chunk
    started: float = 0.0
    finish: str | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.finish is not None

    def max_gap(self) -> float | None:
        """The largest time between two consecutive tokens (None below two tokens)."""
        if len(self.times) < 2:
            return None
        return max(b - a for a, b in zip(self.times, self.times[1:], strict=False))


def _chunk(s: Stream, event: dict[str, Any]) -> None:
    if event.get("error"):
        s.error = str(event["error"])[:300]
        return
    s.rid = s.rid or str(event.get("id", ""))
    for choice in event.get("choices") or []:
        if choice.get("finish_reason"):  # the final chunk carries no token
            s.finish = str(choice["finish_reason"])
        elif choice.get("text") is not None:
            s.times.append(time.perf_counter())
            s.text += choice["text"]


async def _one(client: httpx.AsyncClient, url: str, body: dict[str, Any], s: Stream) -> None:
    s.started = time.perf_counter()
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                s.error = f"{r.status_code}: {(await r.aread()).decode(errors='replace')[:300]}"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line[6:] == "[DONE]":
                    break
                _chunk(s, json.loads(line[6:]))
    except httpx.HTTPError as e:
        s.error = f"{type(e).__name__}: {e}"
    if not s.error and s.finish is None:
        s.error = "the stream ended without a finish reason"


async def _all(url: str, model: str, texts: list[str], max_tokens: int,
               progress: Callable[[int, int], None]) -> list[Stream]:
    streams = [Stream(i) for i in range(len(texts))]
    limits = httpx.Limits(max_connections=len(texts), max_keepalive_connections=0)
    done = 0
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(900.0, connect=60.0)
                                 ) as client:
        async def run(s: Stream) -> None:
            nonlocal done
            body = {"model": model, "prompt": texts[s.index], "max_tokens": max_tokens,
                    "temperature": 0, "ignore_eos": True, "stream": True}
            await _one(client, url, body, s)
            done += 1
            progress(done, len(texts))

        await asyncio.gather(*(run(s) for s in streams))
    return streams


def run_streams(url: str, model: str, texts: list[str], max_tokens: int,
                progress: Callable[[int, int], None]) -> list[Stream]:
    """All `texts` streamed at once; the streams in the order of `texts`."""
    return asyncio.run(_all(url, model, texts, max_tokens, progress))


def throughput(streams: list[Stream]) -> dict[str, float]:
    """Tokens/s of a run: all tokens over its whole time, and decode tokens/s (the tokens after
    each stream's first, over the span from the run's first token to its last)."""
    times = [t for s in streams for t in s.times]
    if not times:
        return {"tokens": 0, "tokens_per_s": 0.0, "decode_tokens_per_s": 0.0}
    start = min(s.started for s in streams)
    firsts = [s.times[0] for s in streams if s.times]
    decode_span = max(times) - min(firsts)
    later = len(times) - len(firsts)
    return {"tokens": len(times), "seconds": max(times) - start,
            "tokens_per_s": len(times) / max(max(times) - start, 1e-9),
            "decode_tokens": later, "decode_seconds": decode_span,
            "decode_tokens_per_s": later / max(decode_span, 1e-9)}
