"""Request migration: an answer whose decode worker failed goes on on another one.

The conductor keeps what it has streamed of each answer (`Progress`). When the stream from a
decode worker breaks (the connection lost, silence past the timeout, or an error event), the
request is placed again with the prompt plus the tokens already streamed as its new prompt: the
prefill there reuses every block the store holds (decode workers write generated blocks behind
their steps: `mooncake_cli.worker.writebehind`) and recomputes the rest, and the new decode
worker continues from the next token (`roles.Resume`: the earlier tokens count against
max_tokens and stop strings, and only text the client has not had is sent). The client sees
no error, no repeated and no missing token: a greedy answer is the uninterrupted one. (A
sampled answer goes on with a fresh draw from the same distribution: a seeded generator's
state does not move with it.)
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any

from mooncake_cli.api import roles
from mooncake_cli.engine.sampling import SamplingParams


class DecodeLost(Exception):
    """The stream from decode worker `name` ended without its answer's final event."""

    def __init__(self, name: str, url: str, reason: str) -> None:
        super().__init__(f"decode worker {name} failed: {reason}")
        self.name, self.url, self.reason = name, url, reason


@dataclass
class Progress:
    """What one answer has streamed so far, across the decode workers it ran on."""

    prompt: list[int]
    sampling: SamplingParams
    tokens: list[int] = field(default_factory=list)
    sent_chars: int = 0
    finished: bool = False  # the final event was seen
    moves: list[dict[str, Any]] = field(default_factory=list)  # one record per migration (the
    # ticket's own list, so the answer's headers count them)
    lost_at: float | None = None  # when the last stream broke (for the added latency)

    def saw(self, ev: dict[str, Any]) -> None:
        if "token" in ev:
            self.tokens.append(int(ev["token"]))
            self.sent_chars += len(ev.get("text", ""))
        if "finish_reason" in ev:
            self.finished = True

    def complete(self, stop_ids: Collection[int]) -> str | None:
        """The finish reason when nothing is left to generate although the final event was
        lost with its worker: max_tokens reached, or the last token was a stop token."""
        if self.tokens and self.tokens[-1] in stop_ids:
            return "stop"
        if len(self.tokens) >= self.sampling.max_tokens:
            return "length"
        return None

    @property
    def moved(self) -> int:
        return len(self.moves)

    def next_prompt(self) -> list[int]:
        return self.prompt + self.tokens

    def prefill_sampling(self) -> SamplingParams:
        """The sampling of the prefill that resumes: max_tokens is what is left."""
        return replace(self.sampling, max_tokens=max(1, self.sampling.max_tokens -
                                                     len(self.tokens)))

    def resume(self) -> roles.Resume | None:
        if not self.tokens:
            return None
        return roles.Resume(prompt_tokens=len(self.prompt), sent_chars=self.sent_chars)

    def record(self, lost: DecodeLost, alive: bool) -> dict[str, Any]:
        """Note a migration off `lost.name`; the record (for explain and the answer)."""
        self.lost_at = time.monotonic()
        move = {"from": lost.name, "reason": lost.reason, "worker_alive": alive,
                "streamed_tokens": len(self.tokens)}
        self.moves.append(move)
        return move

    def stop_ids(self, eos: Collection[int]) -> set[int]:
        p = self.sampling
        return set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos))
