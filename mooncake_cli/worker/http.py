"""The HTTP faces of the workers: routes shared by both roles, and each role's own.

    GET  /health, /metrics, /v1/load                 both roles
    POST /v1/prefill                                 prefill (waits for its turn, async)
    POST /v1/prefetch, /v1/prefetch/cancel           prefill (a waiting request's prefix)
    POST /v1/kv/reserve, /v1/kv/release              decode
    POST /v1/generate                                decode (server-sent token events)
    POST /v1/stage/{begin,chunk,release}             prefill (pipeline stages: stage_host.py)

Bodies are the `mooncake_cli.api.roles` messages; errors leave through `mooncake_cli.http.server`.
All but /health and /metrics need the cluster secret (when the worker has one); `AUDITED`
name the audit log's events.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mooncake_cli.api import roles
from mooncake_cli.api.errors import ErrorCode, ServingError
from mooncake_cli.api.schema import parse
from mooncake_cli.http.server import body, note, sse, text_response
from mooncake_cli.kvkeys import block_keys
from mooncake_cli.worker.kvgrant import KVGrants

if TYPE_CHECKING:
    from mooncake_cli.worker.decode import DecodeWorker
    from mooncake_cli.worker.prefill import PrefillWorker
    from mooncake_cli.worker.runtime import WorkerRuntime

AUDITED = {"/v1/prefill": "prefill", "/v1/prefetch": "prefetch",
           "/v1/prefetch/cancel": "prefetch_cancel", "/v1/kv/reserve": "reserve",
           "/v1/kv/release": "release", "/v1/generate": "generate", "/v1/stage/begin": "stage"}

def _json(message: Any) -> Response:
    data = message.model_dump(mode="json") if hasattr(message, "model_dump") else message
    return JSONResponse(data)


def _request_id(raw: bytes) -> str | None:
    """The request id of a body that may be invalid in any other way."""
    try:
        return roles.RequestRef.model_validate_json(raw).request_id
    except ValidationError:
        return None


def _refuse_when_draining(rt: WorkerRuntime) -> None:
    if rt.draining.is_set():
        raise ServingError(ErrorCode.UNAVAILABLE,
                           f"{rt.role} worker {rt.name} is shutting down")


def common_routes(rt: WorkerRuntime) -> list[Route]:
    async def health(request: Request) -> Response:
        return _json(rt.health())

    async def metrics(request: Request) -> Response:
        return text_response(rt.metrics.render())

    async def load(request: Request) -> Response:
        return _json(rt.load())

    return [Route("/health", health), Route("/metrics", metrics), Route("/v1/load", load)]


def prefill_routes(w: PrefillWorker) -> list[Route]:
    async def prefill(request: Request) -> Response:
        _refuse_when_draining(w)
        req = parse(roles.PrefillRequest, await body(request))
        note(request, request_id=req.request_id, decode=req.decode)
        answer = await w.prefill(req)
        note(request, prompt_tokens=answer.prompt_tokens, cached_tokens=answer.cached_tokens,
             kv_bytes=w.cache.blocks_for(answer.prompt_tokens) * w.ns.block_bytes
             if req.decode else 0, transfer_s=answer.timing.transfer)
        return _json(answer)

    async def prefetch(request: Request) -> Response:
        _refuse_when_draining(w)
        req = parse(roles.PrefetchRequest, await body(request))
        note(request, request_id=req.request_id)
        pull = w.prefetch.start(req.request_id, block_keys(req.token_ids, w.wire.ns), "queue") \
            if w.prefetch is not None else None
        return _json(roles.PrefetchAnswer(request_id=req.request_id, started=pull is not None,
                                          state=pull.state if pull else ""))

    async def cancel(request: Request) -> Response:
        req = parse(roles.RequestRef, await body(request))
        note(request, request_id=req.request_id)
        pull = w.prefetch.cancel(req.request_id) if w.prefetch is not None else None
        return _json(roles.PrefetchAnswer(request_id=req.request_id, started=pull is not None,
                                          state=pull.state if pull else ""))

    return [*common_routes(w), Route("/v1/prefill", prefill, methods=["POST"]),
            Route("/v1/prefetch", prefetch, methods=["POST"]),
            Route("/v1/prefetch/cancel", cancel, methods=["POST"])]


def decode_routes(w: DecodeWorker) -> list[Route]:
    grants = KVGrants(w)  # the write capability of each reservation

    async def reserve(request: Request) -> Response:
        _refuse_when_draining(w)
        req = parse(roles.ReserveRequest, await body(request))
        note(request, request_id=req.request_id, num_tokens=req.num_tokens)
        grants.sweep()
        holder = request.client.host if request.client else ""
        answer = grants.grant(w.reserve(req), req.request_id, holder)
        note(request, blocks=len(answer.block_ids))
        return _json(answer)

    async def release(request: Request) -> Response:
        req = parse(roles.ReleaseRequest, await body(request))
        note(request, request_id=req.request_id)
        grants.revoke(req.request_id)
        return _json(w.release(req))

    async def generate(request: Request) -> Response:
        _refuse_when_draining(w)
        raw = await body(request)
        try:
            req = parse(roles.GenerateRequest, raw)
        except ServingError:  # a request that cannot run gives its reserved blocks back
            grants.revoke(_request_id(raw))
            w.forget(_request_id(raw))
            raise
        note(request, request_id=req.request_id, prompt_tokens=len(req.token_ids))
        grants.revoke(req.request_id)  # its KV is written: nobody writes there any more
        events = w.generate(req)
        if req.stream:
            return sse(events)
        return _json(roles.GenerateAnswer(events=[e async for e in events
                                                  if isinstance(e, dict)]))

    return [*common_routes(w), Route("/v1/kv/reserve", reserve, methods=["POST"]),
            Route("/v1/kv/release", release, methods=["POST"]),
            Route("/v1/generate", generate, methods=["POST"])]
