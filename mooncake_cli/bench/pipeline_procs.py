"""The prefill workers `bench pipeline` measures: `mooncake prefill` child processes on loopback,
each limited to the same torch threads, no store, sharing a one-off cluster secret.

    with PrefillProcs(3, model="smollm2-135m", threads=1, kv_blocks=520, chunk=512) as procs:
        answer = procs.prefill(0, body, 600.0)  # signed POST /v1/prefill to worker 0
        procs.urls[1:]                          # the stages another worker may lead

Children are spawned by the calling thread (a child gets SIGTERM when the thread that started
it ends: stats.Child), so call from the main thread.
"""

from __future__ import annotations

import secrets
import sys
from typing import Any

from mooncake_cli.bench.serving_procs import cpu_seconds
from mooncake_cli.bench.stats import Child
from mooncake_cli.http.auth import signer
from mooncake_cli.http.jsonhttp import call
from mooncake_cli.interfaces import MooncakeError

START_TIMEOUT = 600.0  # seconds a worker may take to load its model on a loaded machine


class PrefillProcs:
    """`n` prefill workers started at once; `urls` in start order once all printed ready."""

    def __init__(self, n: int, model: str, threads: int, kv_blocks: int, chunk: int,
                 block_size: int = 16) -> None:
        secret = secrets.token_hex(16)
        self.auth = signer(secret)
        env = {"MOONCAKE_SECRET": secret, "MOONCAKE_SECRET_FILE": "",
               "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
        self.children: list[Child] = []
        self.urls: list[str] = []
        self.ready: list[dict[str, Any]] = []
        self._seen = [0] * n  # stderr lines of each worker `warnings` has looked at
        try:
            for i in range(n):
                argv = [sys.executable, "-m", "mooncake_cli", "--json", "prefill", "--model",
                        model, "--threads", str(threads), "--listen", "127.0.0.1:0",
                        "--store", "none", "--kv-blocks", str(kv_blocks), "--block-size",
                        str(block_size), "--chunk-size", str(chunk), "--name", f"stage-{i}"]
                self.children.append(Child(argv, f"prefill worker stage-{i}", env))
            for child in self.children:  # they load their models meanwhile, side by side
                info = child.line(START_TIMEOUT)
                while info.get("event") != "ready":
                    info = child.line(START_TIMEOUT)
                self.ready.append(info)
                self.urls.append(str(info["url"]))
        except BaseException:
            self.close()
            raise

    def prefill(self, worker: int, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        """The PrefillAnswer of worker `worker` to `body`; MooncakeError for any other answer."""
        a = call(self.urls[worker] + "/v1/prefill", body, timeout=timeout, auth=self.auth)
        if a.status != 200 or not isinstance(a.body, dict):
            raise MooncakeError(f"prefill {body.get('request_id')} on {self.urls[worker]}: "
                                f"HTTP {a.status}: {a.body}")
        return a.body

    def warnings(self) -> list[str]:
        """The lines the workers logged at WARNING or above since the last call, each with
        its worker's name (why a stage failed, for one)."""
        out = []
        for i, child in enumerate(self.children):
            lines = child.stderr_tail(1 << 22).splitlines()
            new, self._seen[i] = lines[self._seen[i]:], len(lines)
            out += [f"stage-{i}: {line}" for line in new
                    if any(w in line for w in ("WARNING", "ERROR", "CRITICAL"))]
        return out

    def cpu(self) -> float:
        """User + system CPU seconds the workers have used so far."""
        return sum(cpu_seconds(c.proc.pid) for c in self.children)

    def close(self) -> None:
        for child in reversed(self.children):
            child.close(grace=30)
        self.children = []

    def __enter__(self) -> PrefillProcs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
