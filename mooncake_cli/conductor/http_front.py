"""The conductor's HTTP front: the OpenAI API, health, metrics and the instance registry.

    POST /v1/completions, /v1/chat/completions    OpenAI-compatible (stream: SSE)
    GET  /v1/models                              the served model
    GET  /v1/instances                           the registry with each instance's load
    POST /v1/instances/register, /deregister     worker heartbeats
    GET  /health, /metrics
"""

from __future__ import annotations

import time
from typing import Any

from mooncake_cli.conductor import openai_api as oa
from mooncake_cli.conductor.live import Conductor
from mooncake_cli.jsonhttp import HTTPError, JSONHandler, Stream


class ConductorHandler(JSONHandler):
    routes = {
        ("POST", "/v1/completions"): "completions",
        ("POST", "/v1/chat/completions"): "chat",
        ("GET", "/v1/models"): "models",
        ("GET", "/v1/instances"): "list_instances",
        ("POST", "/v1/instances/register"): "register",
        ("POST", "/v1/instances/deregister"): "deregister",
        ("GET", "/health"): "health",
        ("GET", "/metrics"): "metrics",
    }

    @property
    def conductor(self) -> Conductor:
        conductor: Conductor = self.app
        return conductor

    def _answer(self, req: oa.Completion) -> tuple[int, Any]:
        result = self.conductor.complete(req)
        if isinstance(result, dict):
            return 200, result
        return 200, Stream(result)

    def completions(self, body: dict[str, Any], path: str) -> tuple[int, Any]:
        return self._answer(oa.parse_completion(body))

    def chat(self, body: dict[str, Any], path: str) -> tuple[int, Any]:
        return self._answer(oa.parse_chat(body))

    def models(self, body: dict[str, Any], path: str) -> tuple[int, Any]:
        name = self.conductor.model.name
        return 200, {"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "mooncake",
             "max_model_len": self.conductor.model.max_context}]}

    def list_instances(self, body: dict[str, Any], path: str) -> tuple[int, Any]:
        c = self.conductor
        return 200, {"policy": c.scheduler.policy.name,
                     "cost_model": getattr(c.scheduler.cluster.model, "name", ""),
                     "instances": c.instances.snapshot()}

    def register(self, body: dict[str, Any], path: str) -> tuple[int, Any]:
        try:
            inst = self.conductor.instances.register(body)
        except (ValueError, TypeError) as e:
            raise HTTPError(400, str(e)) from None
        return 200, {"registered": inst.name, "ttl": self.conductor.instances.ttl}

    def deregister(self, body: dict[str, Any], path: str) -> tuple[int, Any]:
        name = body.get("name")
        if not isinstance(name, str):
            raise HTTPError(400, "deregistration needs a 'name'", param="name")
        return 200, {"deregistered": self.conductor.instances.deregister(name)}

    def health(self, body: dict[str, Any], path: str) -> tuple[int, Any]:
        snap = self.conductor.instances.snapshot()
        alive = {r: sum(1 for i in snap if i["role"] == r and i["alive"])
                 for r in ("prefill", "decode")}
        ok = all(alive.values())
        return (200 if ok else 503), {"status": "ok" if ok else "degraded",
                                      "alive": alive, "time": time.time()}

    def metrics(self, body: dict[str, Any], path: str) -> tuple[int, Any]:
        return 200, self.conductor.metrics.render(self.conductor.instances.snapshot())
