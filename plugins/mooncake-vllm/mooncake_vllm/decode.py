"""VllmDecode: the second half of vLLM's disaggregation protocol behind the native decode
worker's messages.

    prefill -> decode  POST /v1/kv/handoff   Handoff: what this vLLM pulls the prompt's KV with
    prefill -> decode  POST /v1/kv/release   the prefill failed: forget its handoff
    conductor -> decode POST /v1/generate    GenerateRequest -> SSE token events, final event

/v1/generate runs the request on this vLLM with its handoff's `kv_transfer_params`
(`do_remote_prefill`, the prefill worker's engine id and bootstrap address, the transfer id):
vLLM's MooncakeConnector reads the prompt's KV from the prefill worker, computes the last
prompt token and generates every token, the first included (the prefill's first token is the
same for a greedy answer). A request moved here from a failed decode worker (`resume`) goes on
after the tokens it has had, which count against its max_tokens.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Annotated, Any

from mooncake_cli.api import roles
from mooncake_cli.api.errors import ErrorCode, ServingError
from mooncake_cli.api.schema import Message, parse
from mooncake_cli.http.server import body, note, sse
from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mooncake_vllm.sampling import final_event, token_events, vllm_params
from mooncake_vllm.worker import VllmWorker

HANDOFF_TTL = 120.0  # seconds a handoff waits for its /v1/generate


class Handoff(Message):
    request_id: roles.RequestId
    num_tokens: Annotated[int, Field(ge=1)]
    max_tokens: roles.Count = 0
    kv_transfer_params: dict[str, Any]


class VllmDecode(VllmWorker):
    role = "decode"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.handoffs: dict[str, tuple[Handoff, float]] = {}
        super().__init__(*args, **kwargs)

    def routes(self) -> list[Route]:
        async def handoff(request: Request) -> Response:
            self.refuse_when_draining()
            h = parse(Handoff, await body(request))
            note(request, request_id=h.request_id, num_tokens=h.num_tokens)
            self.take(h)
            return JSONResponse({"request_id": h.request_id})

        async def release(request: Request) -> Response:
            ref = parse(roles.ReleaseRequest, await body(request))
            note(request, request_id=ref.request_id)
            gone = self.handoffs.pop(ref.request_id, None)
            return JSONResponse({"request_id": ref.request_id, "released": gone is not None})

        async def generate(request: Request) -> Response:
            self.refuse_when_draining()
            req = parse(roles.GenerateRequest, await body(request))
            note(request, request_id=req.request_id, prompt_tokens=len(req.token_ids))
            events = self.generate(req)
            if req.stream:
                return sse(events)
            return JSONResponse(roles.GenerateAnswer(
                events=[e async for e in events if isinstance(e, dict)]).model_dump())

        return [*super().routes(), Route("/v1/kv/handoff", handoff, methods=["POST"]),
                Route("/v1/kv/release", release, methods=["POST"]),
                Route("/v1/generate", generate, methods=["POST"])]

    def take(self, h: Handoff) -> None:
        """Keep `h` for its /v1/generate; DECODE_TOO_LARGE when the request can never run
        here, CONFLICT when one with its id waits already."""
        now = time.monotonic()
        for rid, (_, at) in list(self.handoffs.items()):
            if now - at > HANDOFF_TTL:
                del self.handoffs[rid]
        need = h.num_tokens + h.max_tokens
        blocks = -(-need // self.cfg.block_size)
        if need > self.engine.max_model_len or blocks > self.engine.num_blocks:
            self.metrics.add("requests_failed")
            raise ServingError(ErrorCode.DECODE_TOO_LARGE, f"a request of {h.num_tokens} + "
                               f"{h.max_tokens} tokens: this decode worker's vLLM holds "
                               f"{self.engine.max_model_len} tokens per request and "
                               f"{self.engine.num_blocks} KV blocks of {self.cfg.block_size}")
        if h.request_id in self.handoffs:
            raise ServingError(ErrorCode.CONFLICT,
                               f"request {h.request_id!r} was handed off here already")
        self.handoffs[h.request_id] = (h, now)

    def generate(self, req: roles.GenerateRequest) -> AsyncIterator[dict[str, Any] | str]:
        got = self.handoffs.pop(req.request_id, None)
        if got is None:
            raise ServingError(ErrorCode.NOT_FOUND, f"no KV handoff for request "
                               f"{req.request_id!r}: a prefill worker on vLLM hands it off "
                               "(/v1/kv/handoff) before /v1/generate")
        had = len(req.token_ids) - req.resume.prompt_tokens if req.resume else 0
        return self._events(req, got[0].kv_transfer_params, had)

    async def _events(self, req: roles.GenerateRequest, kv: dict[str, Any],
                      had: int) -> AsyncIterator[dict[str, Any] | str]:
        from vllm.inputs import TokensPrompt

        left = req.sampling.max_tokens - had
        n = had
        self.active += 1
        try:
            if left < 1:  # a moved request that had all its tokens
                yield {"finish_reason": "length", "completion_tokens": n}
                yield "[DONE]"
                return
            outs = self.engine.llm.generate(TokensPrompt(prompt_token_ids=list(req.token_ids)),
                                            vllm_params(req.sampling, left, kv),
                                            request_id=req.request_id)
            async with aclosing(outs):  # a client that leaves aborts the request in vLLM
                async for out in outs:
                    for ev in token_events(out):
                        n += 1
                        yield ev
                    if out.finished:
                        yield final_event(out, n)
            yield "[DONE]"
        except Exception as e:  # the engine died or refused: the conductor moves the request
            self.metrics.add("requests_failed")
            yield {"finish_reason": "error", "completion_tokens": n,
                   "error": f"decode on vLLM failed: {type(e).__name__}: {e}"}
            yield "[DONE]"
        finally:
            self.active -= 1
