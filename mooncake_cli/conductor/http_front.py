"""The conductor's HTTP front: the OpenAI API, health, metrics and the instance registry.

    POST /v1/completions, /v1/chat/completions    OpenAI-compatible (stream: SSE)
    GET  /v1/models                              the served model
    GET  /v1/instances                           the registry with each instance's load, and
                                                 the wait queue
    POST /v1/instances/register, /deregister     worker heartbeats (a name stays its first
                                                 registrant's: `Identities`)
    GET  /health, /metrics                       (/health, with --peers: the peers as this
                                                 conductor sees them; 503 until caught up)

`OPENAI` are the paths an --api-key guards (the OpenAI API and the read-only instance list); the
others but /health and /metrics need the cluster secret (`mooncake_cli.http.auth.Gate`); `AUDITED`
name the audit log's events.
"""

from __future__ import annotations

import time

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mooncake_cli.api import openai as oa
from mooncake_cli.api import roles
from mooncake_cli.api.registration import DEREGISTER, REGISTER
from mooncake_cli.api.schema import parse
from mooncake_cli.conductor.identities import Identities
from mooncake_cli.conductor.live import Conductor
from mooncake_cli.conductor.waitqueue import Ticket, unless_gone
from mooncake_cli.http.server import body, note, sse, text_response

OPENAI = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/instances")
AUDITED = {"/v1/completions": "completion", "/v1/chat/completions": "completion",
           REGISTER: "register", DEREGISTER: "deregister"}


def routes(conductor: Conductor, identities: Identities | None = None) -> list[Route]:
    c = conductor
    ids = identities or Identities(c.instances)

    async def answer(request: Request, req: oa.Completion) -> Response:
        ticket = Ticket()
        result = await unless_gone(request, c.complete(req, ticket))
        if result is None:  # the client left (while queued, say): nobody reads an answer
            return Response(status_code=499)
        if isinstance(result, dict):
            note(request, request_id=result.get("id"), usage=result.get("usage"))
            response = Response(msgspec.json.encode(result), media_type="application/json")
        else:
            response = sse(result)
        response.headers.update(ticket.headers())
        return response

    async def completions(request: Request) -> Response:
        return await answer(request, oa.parse_completion(await body(request)))

    async def chat(request: Request) -> Response:
        return await answer(request, oa.parse_chat(await body(request)))

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": c.model.name, "object": "model", "created": 0, "owned_by": "mooncake",
             "max_model_len": c.model.max_context}]})

    async def list_instances(request: Request) -> Response:
        return JSONResponse({"policy": c.scheduler.policy.name,
                             "cost_model": getattr(c.scheduler.cluster.model, "name", ""),
                             "queue": c.queue.snapshot(),
                             "instances": c.instances.snapshot()})

    async def register(request: Request) -> Response:
        reg = parse(roles.Registration, await body(request))
        note(request, name=reg.name, instance_role=reg.role, url=reg.url)
        ids.claim(reg.name, reg.token)
        known = c.instances.get(reg.name)
        if known is not None and (known.role, known.url) == (reg.role, reg.url.rstrip("/")) \
                and not known.dead_reason:
            note(request, heartbeat=True)  # a refresh: not a line of the audit log
        inst = c.instances.register(reg)
        return JSONResponse({"registered": inst.name, "ttl": c.instances.ttl})

    async def deregister(request: Request) -> Response:
        leaving = parse(roles.Deregistration, await body(request))
        note(request, name=leaving.name)
        ids.release(leaving.name, leaving.token)
        return JSONResponse({"deregistered": c.instances.deregister(leaving.name)})

    async def health(request: Request) -> Response:
        snap = c.instances.snapshot()
        alive = {r: sum(1 for i in snap if i["role"] == r and i["alive"])
                 for r in ("prefill", "decode")}
        ok = all(alive.values())
        out = {"status": "ok" if ok else "degraded", "alive": alive, "time": time.time()}
        peers = c.bookings.peers
        if peers is not None:  # --peers: not ready (503) until caught up with the others
            out["peers"] = peers.snapshot()
            if not peers.ready:
                ok, out["status"] = False, "catching-up"
        return JSONResponse(out, 200 if ok else 503)

    async def metrics(request: Request) -> Response:
        return text_response(c.metrics.render(c.instances.snapshot()))

    post = ["POST"]
    return [Route("/v1/completions", completions, methods=post),
            Route("/v1/chat/completions", chat, methods=post),
            Route("/v1/models", models), Route("/v1/instances", list_instances),
            Route(REGISTER, register, methods=post), Route(DEREGISTER, deregister, methods=post),
            Route("/health", health), Route("/metrics", metrics)]
