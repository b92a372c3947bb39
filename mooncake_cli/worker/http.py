"""The HTTP faces of the workers: routes shared by both roles, and each role's own."""

from __future__ import annotations

from typing import Any

from mooncake_cli.jsonhttp import HTTPError, JSONHandler


class WorkerHandler(JSONHandler):
    """GET /health, /metrics and /v1/load; the app is a WorkerRuntime."""

    routes = {("GET", "/health"): "health", ("GET", "/metrics"): "metrics",
              ("GET", "/v1/load"): "load"}

    def health(self, body: dict[str, Any], path: str) -> tuple[int, Any]:
        return 200, self.app.health()

    def metrics(self, body: dict[str, Any], path: str) -> tuple[int, Any]:
        return 200, self.app.metrics.render()

    def load(self, body: dict[str, Any], path: str) -> tuple[int, Any]:
        return 200, self.app.load()

    def refuse_when_draining(self) -> None:
        if self.app.draining.is_set():
            raise HTTPError(503, f"{self.app.role} worker {self.app.name} is shutting down",
                            kind="unavailable")


class PrefillHandler(WorkerHandler):
    routes = {**WorkerHandler.routes, ("POST", "/v1/prefill"): "prefill"}

    def prefill(self, body: dict[str, Any], path: str) -> tuple[int, Any]:
        self.refuse_when_draining()
        return 200, self.app.prefill(body)


class DecodeHandler(WorkerHandler):
    routes = {**WorkerHandler.routes, ("POST", "/v1/kv/reserve"): "reserve",
              ("POST", "/v1/kv/release"): "release", ("POST", "/v1/generate"): "generate"}

    def reserve(self, body: dict[str, Any], path: str) -> tuple[int, Any]:
        self.refuse_when_draining()
        return 200, self.app.reserve(body)

    def release(self, body: dict[str, Any], path: str) -> tuple[int, Any]:
        return 200, self.app.release(body)

    def generate(self, body: dict[str, Any], path: str) -> tuple[int, Any]:
        self.refuse_when_draining()
        return 200, self.app.generate(body)
