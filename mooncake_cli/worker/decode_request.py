"""DecodeRequest: one request in a decode worker, and the server-sent events it streams.

Events are made on the decode loop's thread and read by the HTTP event loop that created the
request: each is handed over with `call_soon_threadsafe`, so no thread waits per stream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from mooncake_cli.engine import Sequence


@dataclass
class Reservation:
    request_id: str
    blocks: list[int]
    num_tokens: int
    created: float = field(default_factory=time.monotonic)


@dataclass
class DecodeRequest:
    """A request decoding (or waiting to): its sequence, admission order and event queue."""

    request_id: str
    seq: Sequence
    order: int
    events: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)
    cancelled: bool = False
    done: bool = False
    preemptions: int = 0
    sent_text: str = ""

    def _put(self, event: dict[str, Any] | None) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is gone (server shut down): nobody listens
            self.cancelled = True

    def token(self, token: int, decode: Callable[[list[int]], str]) -> None:
        """Queue the event of a new token with the text it adds (held back while the text
        ends inside a multi-byte character)."""
        full = self.seq.text if self.seq.finished and self.seq.params.stop else \
            decode(self.seq.output_ids)
        delta = ""
        if full.startswith(self.sent_text) and (self.seq.finished or
                                                not full.endswith("\ufffd")):
            delta = full[len(self.sent_text):]
            self.sent_text = full
        self._put({"token": token, "text": delta})

    def finish(self, error: str | None = None) -> None:
        """Queue the final event (unless nobody listens any more) and end the stream."""
        if self.done:
            return
        self.done = True
        if not self.cancelled:
            final: dict[str, Any] = {
                "finish_reason": "error" if error else self.seq.finish_reason,
                "completion_tokens": len(self.seq.output_ids)}
            if error:
                final["error"] = error
            self._put(final)
        self._put(None)

    async def stream(self, on_cancel: Callable[[], None]) -> AsyncIterator[dict[str, Any] | str]:
        """The events until the final one, then `[DONE]`; a client that leaves cancels."""
        try:
            while (event := await self.events.get()) is not None:
                yield event
            yield "[DONE]"
        finally:
            if not self.done:
                self.cancelled = True
                on_cancel()
