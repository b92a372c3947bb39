"""The live conductor: one OpenAI request -> tokens -> block keys -> a scheduled (prefill,
decode) pair -> prefill over HTTP -> tokens streamed back from the decode worker.

Scheduling runs the same `Scheduler` as the simulator, against a `Cluster` that `Instances`
keeps current. A prefill worker that cannot be reached is marked dead and the request is placed
again (up to `retries` times); no admissible pair answers 429 with Retry-After.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from mooncake_cli import jsonhttp
from mooncake_cli.conductor import openai_api as oa
from mooncake_cli.conductor.bookings import Bookings
from mooncake_cli.conductor.chat import ChatTemplate
from mooncake_cli.conductor.instances import Instances
from mooncake_cli.conductor.live_metrics import ConductorMetrics
from mooncake_cli.conductor.scheduler import Decision, Scheduler
from mooncake_cli.conductor.state import Request
from mooncake_cli.jsonhttp import HTTPError
from mooncake_cli.kvkeys import KVNamespace, block_keys

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedModel:
    """What the conductor needs of the model: its name, tokenizer, KV namespace, context."""

    name: str
    tokenizer: Any  # encode(str, add_special_tokens) -> list[int], decode(list[int]) -> str
    ns: KVNamespace
    max_context: int
    chat: ChatTemplate = field(default_factory=lambda: ChatTemplate(None))

    def chat_tokens(self, messages: tuple[dict[str, str], ...]) -> list[int]:
        """The prompt of a chat request: the model's template when it has one (its special
        tokens written by the template), else the plain rendering."""
        text = self.chat.render(messages)
        return list(self.tokenizer.encode(text, add_special_tokens=not self.chat.native))


@dataclass
class Placed:
    decision: Decision
    prefill_url: str
    decode_url: str
    answer: dict[str, Any]


class Conductor:
    def __init__(self, model: ServedModel, scheduler: Scheduler, instances: Instances,
                 metrics: ConductorMetrics, retries: int = 2, timeout: float = 300.0,
                 explain_path: str = "") -> None:
        self.model = model
        self.scheduler = scheduler
        self.instances = instances
        self.metrics = metrics
        self.retries = retries
        self.timeout = timeout
        self.bookings = Bookings(scheduler, instances, metrics, explain_path)

    # -- request path ---------------------------------------------------------------------
    def tokens(self, req: oa.Completion) -> list[int]:
        if req.token_ids is not None:
            vocab = getattr(self.model.tokenizer, "vocab_size", None)
            if vocab is not None and any(t >= vocab for t in req.token_ids):
                raise HTTPError(400, f"token ids must be below the vocabulary size {vocab}",
                                param="prompt")
            return list(req.token_ids)
        ids = self.model.chat_tokens(req.messages) if req.chat else \
            list(self.model.tokenizer.encode(req.prompt or ""))
        if not ids:
            raise HTTPError(400, "the prompt is empty", param="prompt")
        return ids

    def complete(self, req: oa.Completion) -> dict[str, Any] | Iterator[dict[str, Any] | str]:
        """The answer object, or (stream=true) an iterator of SSE events ending in [DONE]."""
        if req.model != self.model.name:
            raise HTTPError(404, f"the model '{req.model}' does not exist; this conductor "
                                 f"serves '{self.model.name}'", kind="invalid_request_error",
                            param="model", code="model_not_found")
        if req.sampling.max_tokens < 1:
            raise HTTPError(400, "max_tokens must be >= 1", param="max_tokens")
        ids = self.tokens(req)
        if len(ids) + req.sampling.max_tokens > self.model.max_context:
            raise HTTPError(400, f"this model's maximum context length is "
                                 f"{self.model.max_context} tokens; the prompt has {len(ids)} "
                                 f"and max_tokens asks for {req.sampling.max_tokens}",
                            param="messages" if req.chat else "prompt",
                            code="context_length_exceeded")
        start = time.monotonic()
        rid = ("chatcmpl-" if req.chat else "cmpl-") + uuid.uuid4().hex
        self.metrics.add("requests_total")
        placed = self._place(rid, ids, req)
        tokens = self._decode(placed, rid, ids, req)
        cached = int(placed.answer.get("cached_tokens", 0) or 0)
        if req.stream:
            return self._stream(req, rid, len(ids), cached, tokens, start)
        texts, finish, n = [], "length", 0
        for ev in self._timed(tokens, start):
            if "token" in ev:
                texts.append(ev.get("text", ""))
                n += 1
            if ev.get("finish_reason"):
                finish = ev["finish_reason"]
        return oa.answer(req, rid, "".join(texts), finish, len(ids), n, cached)

    def _place(self, rid: str, ids: list[int], req: oa.Completion) -> Placed:
        keys = block_keys(ids, self.model.ns)
        sreq = Request(rid, len(ids), req.sampling.max_tokens, keys)
        tried: list[str] = []
        for _attempt in range(self.retries + 1):
            decision = self.bookings.decide(sreq)
            pname, dname = decision.prefill, decision.decode
            if dname is None:
                self.bookings.unbook(decision, sreq)
                raise HTTPError(503, "no live decode instance", kind="server_error")
            try:
                purl, durl = self.instances.url(pname), self.instances.url(dname)
                chosen = decision.placement.chosen
                body = {"request_id": rid, "token_ids": ids, "decode": durl,
                        "sampling": self._sampling(req),
                        # reuse only what the instance holds, unless the policy chose to fetch
                        "reuse": "any" if chosen.fetch_blocks > chosen.local_blocks else "local"}
                ans = jsonhttp.call(purl + "/v1/prefill", body, timeout=self.timeout)
            except (OSError, KeyError) as e:
                self.bookings.unbook(decision, sreq)
                self.instances.mark_dead(pname, f"prefill request failed: {e}")
                self.metrics.add("rerouted_total")
                tried.append(pname)
                continue
            self.bookings.unbook(decision, sreq, prefill_only=ans.status == 200)
            if ans.status != 200:
                raw = ans.body.get("error")
                err: dict[str, Any] = raw if isinstance(raw, dict) else {}
                msg, code = err.get("message", str(ans.body)), err.get("code")
                if code == "decode_unreachable":  # the decode worker died: place it again
                    self.instances.mark_dead(dname, msg)
                    self.metrics.add("rerouted_total")
                    tried.append(dname)
                    continue
                if code == "decode_full":  # no KV room left on the decode side: come back
                    self.metrics.add("rejected_total")
                    retry = max(1, math.ceil(self.scheduler.decode_retry()))
                    raise HTTPError(429, f"decode instance {dname} has no KV room: {msg}",
                                    kind="rate_limit_exceeded", code="decode_full",
                                    headers={"Retry-After": str(retry)})
                raise HTTPError(503 if ans.status >= 500 else ans.status,
                                f"prefill on {pname} failed: {msg}", kind="server_error")
            self.bookings.learn(pname, keys, ans.body, decision)
            return Placed(decision, purl, durl, ans.body)
        raise HTTPError(503, f"no instance could take the request (tried "
                             f"{', '.join(tried)})", kind="server_error")

    def _decode(self, placed: Placed, rid: str, ids: list[int],
                req: oa.Completion) -> Iterator[dict[str, Any]]:
        body = {"request_id": rid, "token_ids": ids, "sampling": self._sampling(req),
                "first_token": placed.answer.get("first_token")}
        sreq = Request(rid, len(ids), req.sampling.max_tokens, ())
        try:
            stream = jsonhttp.events(placed.decode_url + "/v1/generate", body,
                                     timeout=self.timeout)
            yield from stream
        except OSError as e:
            self.instances.mark_dead(placed.decision.decode or "", f"generate failed: {e}")
            self.metrics.add("errors_total")
            raise HTTPError(503, f"decode worker failed: {e}", kind="server_error") from None
        finally:
            self.bookings.release_decode(placed.decision.decode, sreq)

    def _timed(self, events: Iterator[dict[str, Any]],
               start: float) -> Iterator[dict[str, Any]]:
        last, gaps, ttft = start, [], None
        for ev in events:
            if "token" in ev:
                now = time.monotonic()
                if ttft is None:
                    ttft = now - start
                else:
                    gaps.append(now - last)
                last = now
                self.metrics.add("completion_tokens_total")
            yield ev
        self.metrics.observe(ttft, gaps)

    def _stream(self, req: oa.Completion, rid: str, prompt_tokens: int, cached: int,
                events: Iterator[dict[str, Any]],
                start: float) -> Iterator[dict[str, Any] | str]:
        n, first = 0, True
        try:
            for ev in self._timed(events, start):
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

    @staticmethod
    def _sampling(req: oa.Completion) -> dict[str, Any]:
        return req.sampling.to_json() | {"stop_token_ids": []}

    def close(self) -> None:
        self.bookings.close()
