"""A pipeline stage host (worker/stage_host.py) of smollm2-135m in its own process, behind the
cluster secret, for test_pipeline_handoff.py; and the same host in the test's own process.

    python -m tests.helpers.stage_procs SECRET TRANSPORT   # prints {"event": "ready", "url"}

It serves until its stdin closes. Its cache holds every layer, as a prefill worker's does, so
one process serves any layer range.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from mooncake_cli.config import TransferConfig
from mooncake_cli.engine import KVCache
from mooncake_cli.http.auth import Gate, signer
from mooncake_cli.http.server import Server, edge_app
from mooncake_cli.registry import Registry
from mooncake_cli.transfer.engine import TransferEngine
from mooncake_cli.worker.stage_host import StageHost, stage_routes
from tests.helpers.procs import Child, child_env
from tests.helpers.stage_ref import BLOCK, TOKENS, blocks_for, model


@dataclass
class Hosted:
    host: StageHost
    url: str


@contextmanager
def hosted(secret: str, transport: str) -> Iterator[Hosted]:
    """A stage host with its control routes served on a free loopback port."""
    m = model()
    engine = TransferEngine(TransferConfig(secret=secret, transport=transport),
                            Registry.from_env())
    server: Server | None = None
    try:
        host = StageHost(m, KVCache(m.namespace(BLOCK), 2 * blocks_for(TOKENS)), engine,
                         auth=signer(secret), max_tokens=2 * TOKENS, timeout=60.0)
        server = Server(edge_app(stage_routes(lambda: host), guard=Gate(secret)), "127.0.0.1", 0,
                        "mooncake-stage-http").start()
        yield Hosted(host, f"http://127.0.0.1:{server.port}")
    finally:
        if server is not None:
            server.close()
        engine.close()


class StageProc:
    """`python -m tests.helpers.stage_procs` started at once; `ready()` waits for its URL."""

    def __init__(self, secret: str, transport: str) -> None:
        self.child = Child([sys.executable, "-m", "tests.helpers.stage_procs", secret,
                            transport], child_env(), stdin=True)
        self.url = self.segment = ""

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.child.popen

    def ready(self, timeout: float = 180.0) -> StageProc:
        if not self.url:
            line = self.child.ready_line("ready", timeout)
            self.url, self.segment = str(line["url"]), str(line["segment"])
        return self

    def kill(self) -> None:
        self.child.kill()

    def stop(self, timeout: float = 20.0) -> int | None:
        return self.child.stop(timeout, term=False)  # it serves until stdin closes


def main() -> None:
    secret, transport = sys.argv[1], sys.argv[2]
    with hosted(secret, transport) as h:
        print(json.dumps({"event": "ready", "url": h.url, "segment": h.host.engine.name}),
              flush=True)
        sys.stdin.read()  # until the test closes our stdin


if __name__ == "__main__":
    main()
