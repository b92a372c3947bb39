"""Worker processes (`mooncake prefill`, `mooncake decode`) for the worker tests, a recording
conductor stand-in, and the client side of the prefill -> decode hand-off."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from mooncake_cli.http.jsonhttp import call, events
from mooncake_cli.http.server import Server, body, edge_app
from tests.helpers.procs import Child, child_env


class WorkerProc:
    """`mooncake --json <role> ...` started at once; `ready()` waits for its ready line."""

    def __init__(self, role: str, *args: str) -> None:
        self.role = role
        self.child = Child([sys.executable, "-m", "mooncake_cli", "--json", role, *args],
                           child_env())
        self.info: dict[str, Any] = {}

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.child.popen

    def ready(self, timeout: float = 90.0) -> WorkerProc:
        if not self.info:
            self.info = self.child.ready_line("ready", timeout)
        return self

    @property
    def url(self) -> str:
        return str(self.ready().info["url"])

    def stop(self, timeout: float = 30.0) -> tuple[int | None, list[dict[str, Any]]]:
        """SIGTERM; (exit code, the events printed after the ready line)."""
        rc = self.child.stop(timeout)
        return rc, [json.loads(raw) for raw in self.child.rest.splitlines() if raw.strip()]


class ConductorRecorder:
    """A real HTTP server taking the workers' registrations (what a conductor receives)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.registered: list[dict[str, Any]] = []
        self.deregistered: list[dict[str, Any]] = []

        def recorder(into: list[dict[str, Any]]) -> Any:
            async def record(request: Request) -> JSONResponse:
                got = json.loads(await body(request))
                with self.lock:
                    into.append(got)
                return JSONResponse({"ok": True})
            return record

        app = edge_app([
            Route("/v1/instances/register", recorder(self.registered), methods=["POST"]),
            Route("/v1/instances/deregister", recorder(self.deregistered), methods=["POST"])])
        self.server = Server(app, "127.0.0.1", 0, "test-conductor").start()
        self.url = f"http://127.0.0.1:{self.server.port}"

    def close(self) -> None:
        self.server.close()


def complete(prefill_url: str, decode_url: str | None, rid: str, token_ids: list[int],
             sampling: dict[str, Any], between: Any = None,
             ) -> tuple[dict[str, Any], list[int], dict[str, Any]]:
    """Prefill (handing over to `decode_url`), then (after `between()`, when given) generate
    there: (prefill answer, all output ids, final event)."""
    answer = call(prefill_url + "/v1/prefill", {"request_id": rid, "token_ids": token_ids,
                                               "sampling": sampling, "decode": decode_url},
                  timeout=120)
    assert answer.status == 200, answer.body
    if between is not None:
        between()
    if decode_url is None:
        return answer.body, [answer.body["first_token"]], {}
    out: list[int] = []
    final: dict[str, Any] = {}
    for event in events(decode_url + "/v1/generate",
                        {"request_id": rid, "token_ids": token_ids,
                         "first_token": answer.body["first_token"], "sampling": sampling},
                        timeout=120):
        if "token" in event:
            out.append(event["token"])
        else:
            final = event
    assert out[0] == answer.body["first_token"]
    return answer.body, out, final
