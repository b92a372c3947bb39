"""The live conductor: one OpenAI request -> tokens -> block keys -> a scheduled (prefill,
decode) pair -> prefill over HTTP -> tokens streamed back from the decode worker.

Scheduling runs the same `Scheduler` as the simulator, against a `Cluster` that `Instances`
keeps current. A prefill worker that cannot be reached is marked dead and the request is placed
again (up to `retries` times); no admissible pair answers 429 with Retry-After, and a request
no decode instance could ever hold answers 400 (context_length_exceeded). A decode worker that
fails mid-answer turns into 503 (or an error event in a stream), never a finished answer.
"""

from __future__ import annotations

import http.client
import logging
import math
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from mooncake_cli import jsonhttp
from mooncake_cli.conductor import answers
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
    """What the conductor needs of the model: its name, tokenizer, KV namespace, context and
    vocabulary size (token ids of a prompt must be below it)."""

    name: str
    tokenizer: Any  # encode(str, add_special_tokens) -> list[int], decode(list[int]) -> str
    ns: KVNamespace
    max_context: int
    chat: ChatTemplate = field(default_factory=lambda: ChatTemplate(None))
    vocab_size: int | None = None

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
            vocab = self.model.vocab_size
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
        if req.sampling.max_tokens is not None and req.sampling.max_tokens < 1:
            raise HTTPError(400, "max_tokens must be >= 1", param="max_tokens")
        ids = self.tokens(req)
        with self.instances.lock:
            room = self.scheduler.decode_capacity()
        req = oa.fit_output(req, len(ids), min(self.model.max_context, room or math.inf))
        assert req.sampling.max_tokens is not None
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
            return answers.sse(req, rid, tokens, start, self.metrics, len(ids), cached)
        return answers.collect(req, rid, tokens, start, self.metrics, len(ids), cached)

    def _place(self, rid: str, ids: list[int], req: oa.Completion) -> Placed:
        keys = block_keys(ids, self.model.ns)
        sreq = Request(rid, len(ids), req.sampling.max_tokens or 0, keys)
        param = "messages" if req.chat else "prompt"
        tried: list[str] = []
        for _attempt in range(self.retries + 1):
            decision = self.bookings.decide(sreq, param)
            try:  # whatever happens, the booking does not outlive this attempt
                ans, purl, durl = self._prefill(decision, rid, ids, req, tried)
            except BaseException:
                self.bookings.unbook(decision, sreq)
                raise
            self.bookings.unbook(decision, sreq, prefill_only=ans is not None and
                                 ans.status == 200)
            if ans is None:  # an instance failed or left: place the request again
                continue
            pname, dname = decision.prefill, decision.decode or ""
            if ans.status != 200:
                raw = ans.body.get("error")
                err: dict[str, Any] = raw if isinstance(raw, dict) else {}
                msg, code = err.get("message", str(ans.body)), err.get("code")
                if code == "decode_unreachable":  # the decode worker died: place it again
                    self.instances.mark_dead(dname, msg)
                    self.metrics.add("rerouted_total")
                    tried.append(dname)
                    continue
                if code == "decode_too_large":  # it can never fit there
                    raise HTTPError(400, f"the request does not fit decode instance "
                                         f"{dname}: {msg}", param=param,
                                    code="context_length_exceeded")
                if code == "decode_full":  # no KV room left on the decode side: come back
                    self.metrics.add("rejected_total")
                    retry = max(1, math.ceil(self.scheduler.decode_retry()))
                    raise HTTPError(429, f"decode instance {dname} has no KV room: {msg}",
                                    kind="rate_limit_exceeded", code="decode_full",
                                    headers={"Retry-After": str(retry)})
                raise HTTPError(503 if ans.status >= 500 else ans.status,
                                f"prefill on {pname} failed: {msg}", kind="server_error")
            try:
                self.bookings.learn(pname, keys, ans.body, decision, self.model.ns.block_bytes)
            except (ValueError, TypeError, AttributeError) as e:  # a malformed answer
                self.bookings.release_decode(decision.decode, sreq)
                raise HTTPError(502, f"prefill on {pname} answered a malformed body: {e}",
                                kind="server_error") from None
            return Placed(decision, purl, durl, ans.body)
        raise HTTPError(503, f"no instance could take the request (tried "
                             f"{', '.join(tried)})", kind="server_error")

    def _prefill(self, decision: Decision, rid: str, ids: list[int], req: oa.Completion,
                 tried: list[str]) -> tuple[jsonhttp.Answer | None, str, str]:
        """Run the prefill of `decision`: its answer, or None when the prefill instance failed
        (marked dead) or either instance left the registry meanwhile."""
        pname, dname = decision.prefill, decision.decode
        if dname is None:
            raise HTTPError(503, "no live decode instance", kind="server_error")
        try:
            purl = self.instances.url(pname)
        except KeyError:
            tried.append(pname)
            return None, "", ""
        try:
            durl = self.instances.url(dname)
        except KeyError:
            tried.append(dname)
            return None, purl, ""
        chosen = decision.placement.chosen
        body = {"request_id": rid, "token_ids": ids, "decode": durl,
                "sampling": self._sampling(req),
                # reuse only what the instance holds, unless the policy chose to fetch
                "reuse": "any" if chosen.fetch_blocks > chosen.local_blocks else "local"}
        try:
            return jsonhttp.call(purl + "/v1/prefill", body, timeout=self.timeout), purl, durl
        except (OSError, ValueError, http.client.HTTPException) as e:
            self.instances.mark_dead(pname, f"prefill request failed: {e}")
            self.metrics.add("rerouted_total")
            tried.append(pname)
            return None, purl, durl

    def _decode(self, placed: Placed, rid: str, ids: list[int],
                req: oa.Completion) -> Iterator[dict[str, Any]]:
        body = {"request_id": rid, "token_ids": ids, "sampling": self._sampling(req),
                "first_token": placed.answer.get("first_token")}
        sreq = Request(rid, len(ids), req.sampling.max_tokens or 0, ())
        dname = placed.decision.decode or ""
        try:
            for ev in jsonhttp.events(placed.decode_url + "/v1/generate", body,
                                      timeout=self.timeout):
                if ev.get("error") or ev.get("finish_reason") == "error":
                    raise HTTPError(503, f"decode worker {dname} failed: "
                                         f"{ev.get('error') or 'no reason given'}",
                                    kind="server_error")
                yield ev
        except OSError as e:
            self.instances.mark_dead(dname, f"generate failed: {e}")
            self.metrics.add("errors_total")
            raise HTTPError(503, f"decode worker {dname} failed: {e}",
                            kind="server_error") from None
        except HTTPError:
            self.metrics.add("errors_total")
            raise
        finally:
            self.bookings.release_decode(placed.decision.decode, sreq)

    @staticmethod
    def _sampling(req: oa.Completion) -> dict[str, Any]:
        return req.sampling.to_json() | {"stop_token_ids": []}

    def close(self) -> None:
        self.bookings.close()
