"""The conductor's HTTP front: the OpenAI API, health, metrics and the instance registry.

    POST /v1/completions, /v1/chat/completions    OpenAI-compatible (stream: SSE)
    GET  /v1/models                              the served model
    GET  /v1/instances                           the registry with each instance's load
    POST /v1/instances/register, /deregister     worker heartbeats
    GET  /health, /metrics
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mooncake_cli.api import openai as oa
from mooncake_cli.api import roles
from mooncake_cli.api.schema import parse
from mooncake_cli.asgi import body, sse, text_response
from mooncake_cli.conductor.live import Conductor


def routes(conductor: Conductor) -> list[Route]:
    c = conductor

    async def answer(req: oa.Completion) -> Response:
        result = await c.complete(req)
        if isinstance(result, dict):
            return JSONResponse(result)
        return sse(result)

    async def completions(request: Request) -> Response:
        return await answer(oa.parse_completion(await body(request)))

    async def chat(request: Request) -> Response:
        return await answer(oa.parse_chat(await body(request)))

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": c.model.name, "object": "model", "created": 0, "owned_by": "mooncake",
             "max_model_len": c.model.max_context}]})

    async def list_instances(request: Request) -> Response:
        return JSONResponse({"policy": c.scheduler.policy.name,
                             "cost_model": getattr(c.scheduler.cluster.model, "name", ""),
                             "instances": c.instances.snapshot()})

    async def register(request: Request) -> Response:
        inst = c.instances.register(parse(roles.Registration, await body(request)))
        return JSONResponse({"registered": inst.name, "ttl": c.instances.ttl})

    async def deregister(request: Request) -> Response:
        leaving = parse(roles.Deregistration, await body(request))
        return JSONResponse({"deregistered": c.instances.deregister(leaving.name)})

    async def health(request: Request) -> Response:
        snap = c.instances.snapshot()
        alive = {r: sum(1 for i in snap if i["role"] == r and i["alive"])
                 for r in ("prefill", "decode")}
        ok = all(alive.values())
        return JSONResponse({"status": "ok" if ok else "degraded", "alive": alive,
                             "time": time.time()}, 200 if ok else 503)

    async def metrics(request: Request) -> Response:
        return text_response(c.metrics.render(c.instances.snapshot()))

    post = ["POST"]
    return [Route("/v1/completions", completions, methods=post),
            Route("/v1/chat/completions", chat, methods=post),
            Route("/v1/models", models), Route("/v1/instances", list_instances),
            Route("/v1/instances/register", register, methods=post),
            Route("/v1/instances/deregister", deregister, methods=post),
            Route("/health", health), Route("/metrics", metrics)]
