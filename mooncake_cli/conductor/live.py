"""The live conductor: one OpenAI request -> tokens -> block keys -> a scheduled (prefill,
decode) pair -> prefill over HTTP -> tokens streamed back from the decode worker.

Scheduling runs the same `Scheduler` as the simulator, against a `Cluster` that `Instances`
keeps current. A prefill worker that cannot be reached is marked dead and the request is placed
again (up to `retries` times); no admissible pair answers 429 with Retry-After.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from mooncake_cli import jsonhttp
from mooncake_cli.conductor import openai_api as oa
from mooncake_cli.conductor.chat import ChatTemplate
from mooncake_cli.conductor.instances import Instances
from mooncake_cli.conductor.live_metrics import ConductorMetrics
from mooncake_cli.conductor.online_cost import OnlineCostModel
from mooncake_cli.conductor.scheduler import Decision, Scheduler
from mooncake_cli.conductor.state import Request
from mooncake_cli.interfaces import ConfigError
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
        self._explain = open(explain_path, "a", encoding="utf-8") if explain_path else None
        self._explain_lock = threading.Lock()
        self._queued: dict[str, dict[str, float]] = {}  # prefill instance -> rid -> estimate

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
            decision = self._decide(sreq)
            pname, dname = decision.prefill, decision.decode
            if dname is None:
                self._unbook(decision, sreq)
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
                self._unbook(decision, sreq)
                self.instances.mark_dead(pname, f"prefill request failed: {e}")
                self.metrics.add("rerouted_total")
                tried.append(pname)
                continue
            self._unbook(decision, sreq, prefill_only=ans.status == 200)
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
            self._learn(pname, keys, ans.body, decision)
            return Placed(decision, purl, durl, ans.body)
        raise HTTPError(503, f"no instance could take the request (tried "
                             f"{', '.join(tried)})", kind="server_error")

    def _decide(self, sreq: Request) -> Decision:
        with self.instances.lock:
            now = time.monotonic()
            try:
                decision = self.scheduler.schedule(sreq, now,
                                                   explain=self._explain is not None)
            except ConfigError as e:  # no live prefill instance
                self.metrics.add("errors_total")
                raise HTTPError(503, str(e), kind="server_error",
                                headers={"Retry-After": "1"}) from None
            self._log(decision)
            if not decision.admitted:
                self.metrics.add("rejected_total")
                retry = decision.retry_after_s or 1.0
                raise HTTPError(429, f"cannot meet the SLO: {decision.reason}",
                                kind="rate_limit_exceeded", code="slo",
                                headers={"Retry-After": str(max(1, math.ceil(retry)))})
            self.scheduler.commit(decision, sreq, now)
            self._queued.setdefault(decision.prefill, {})[sreq.id] = \
                decision.placement.chosen.prefill_s
            return decision

    def _unbook(self, decision: Decision, sreq: Request, prefill_only: bool = False) -> None:
        """The prefill part of a booking is over (done or failed); unless `prefill_only`, the
        decode part too."""
        with self.instances.lock:
            now = time.monotonic()
            queued = self._queued.get(decision.prefill, {})
            queued.pop(sreq.id, None)
            inst = self.scheduler.cluster.by_name.get(decision.prefill)
            if inst is not None:
                inst.queued = max(0, inst.queued - 1)
                inst.busy_until = now + sum(queued.values())
            if not prefill_only:
                self._release_decode(decision.decode, sreq)

    def _release_decode(self, name: str | None, sreq: Request) -> None:
        with self.instances.lock:
            dec = self.scheduler.cluster.by_name.get(name) if name else None
            if dec is not None:
                dec.batch = max(0, dec.batch - 1)
                dec.context_tokens = max(0, dec.context_tokens - sreq.input_tokens -
                                         sreq.output_tokens)

    def _learn(self, pname: str, keys: list[str], body: dict[str, Any],
               decision: Decision) -> None:
        prompt, cached = int(body.get("prompt_tokens", 0)), int(body.get("cached_tokens", 0))
        self.metrics.add("prompt_tokens_total", prompt)
        self.metrics.add("prefix_hit_tokens_total", cached)
        fetched = decision.placement.chosen.fetch_blocks
        if fetched:
            self.metrics.add("blocks_fetched_total", fetched)
        stored = body.get("stored_keys")
        copied = body.get("replicated_keys")  # fetched blocks that gained a replica there
        copied = [k for k in copied if isinstance(k, str)] if isinstance(copied, list) else []
        self.metrics.add("blocks_replicated_total", len(copied))
        with self.instances.lock:  # what the instance holds now: what it had, what it stored
            index = self.scheduler.cluster.index
            index.touch(pname, keys[:decision.placement.chosen.local_blocks])
            index.store(pname, stored if isinstance(stored, list) else [])
            index.store(pname, copied)
        model = self.scheduler.cluster.model
        if isinstance(model, OnlineCostModel):
            compute = float(body.get("timing", {}).get("compute", 0.0))
            model.observe_prefill(prompt - cached, compute)

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
            self._release_decode(placed.decision.decode, sreq)

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

    def _log(self, decision: Decision) -> None:
        if self._explain is not None:
            with self._explain_lock:
                self._explain.write(json.dumps(decision.explain()) + "\n")
                self._explain.flush()

    def close(self) -> None:
        if self._explain is not None:
            self._explain.close()
