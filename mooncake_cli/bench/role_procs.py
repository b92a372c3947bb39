"""Roles as processes of their own on loopback, for benchmarks that need them apart: a store
master (`python -m mooncake_cli.store.service`, with its /metrics), prefill and decode workers
on one engine (`mooncake prefill|decode --engine ...`, started one at a time: a vLLM engine
takes minutes on a busy CPU), and conductors in front of the workers named to each
(`mooncake conductor start --prefill URL --decode URL`). Children are spawned by the calling
thread (stats.Child), so call from the main thread.

    with RoleProcs(RoleSpec(model="smollm2-135m", engine="vllm", block_size=128)) as procs:
        p = procs.worker("prefill", "prefill-a")
        d = procs.worker("decode", "decode-0")
        conductor = procs.conductor([p], [d])
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

from mooncake_cli.bench.serving_procs import cpu_seconds, metrics
from mooncake_cli.bench.stats import Child
from mooncake_cli.http import jsonhttp
from mooncake_cli.interfaces import MooncakeError

START_S = 900.0  # seconds a worker may take to come up (a vLLM engine on 2 busy cores)


@dataclass(frozen=True)
class RoleSpec:
    model: str
    engine: str = "native"
    block_size: int = 16
    kv_blocks: int = 512
    segment: str = "512MiB"  # DRAM each worker gives the store
    policy: str = "kvcache-centric"


@dataclass(frozen=True)
class Role:
    """A started process: its URL and what its ready line said."""

    name: str
    url: str
    child: Child
    info: dict[str, Any]

    @property
    def pid(self) -> int:
        return int(self.child.proc.pid)

    def cpu(self) -> float:
        """CPU seconds the process itself has used so far (not its children)."""
        return cpu_seconds(self.pid)


class RoleProcs:
    """The master at construction; workers and conductors on demand; all stopped on close."""

    def __init__(self, spec: RoleSpec) -> None:
        self.spec = spec
        self._children: list[Child] = []
        try:
            info = self._ready(Child([sys.executable, "-m", "mooncake_cli.store.service",
                                      "--port", "0", "--metrics-port", "0"],
                                     "the store master"), 60, "ready")
            self.store, self.store_metrics = str(info["address"]), str(info["metrics"])
        except BaseException:
            self.close()
            raise

    def _ready(self, child: Child, timeout: float, event: str) -> dict[str, Any]:
        self._children.append(child)
        deadline = time.monotonic() + timeout
        while True:
            info = child.line(max(1.0, deadline - time.monotonic()))
            if info.get("event") == event:
                return info

    def worker(self, role: str, name: str) -> Role:
        """A prefill or decode worker on the spec's engine, with the store; once ready."""
        s = self.spec
        argv = [sys.executable, "-m", "mooncake_cli", "--json", role, "--model", s.model,
                "--engine", s.engine, "--block-size", str(s.block_size), "--kv-blocks",
                str(s.kv_blocks), "--store", self.store, "--name", name, "--segment-size",
                s.segment]
        if s.engine == "native":
            argv += ["--threads", "1"]
        child = Child(argv, f"{role} worker {name}", {"OMP_NUM_THREADS": "1"})
        info = self._ready(child, START_S, "ready")
        return Role(name, str(info["url"]), child, info)

    def conductor(self, prefill: list[Role], decode: list[Role]) -> Role:
        """A conductor routing to exactly these workers; once it counts them all alive."""
        s = self.spec
        argv = [sys.executable, "-m", "mooncake_cli", "--json", "conductor", "start",
                "--port", "0", "--model", s.model, "--block-size", str(s.block_size),
                "--policy", s.policy, "--prefill", ",".join(w.url for w in prefill),
                "--decode", ",".join(w.url for w in decode)]
        child = Child(argv, "a conductor", {"OMP_NUM_THREADS": "1"})
        info = self._ready(child, 300, "serving")
        url = str(info["url"])
        deadline = time.monotonic() + 120
        while self.alive(url) < len(prefill) + len(decode):
            if time.monotonic() > deadline:
                raise MooncakeError(f"the conductor at {url} counts only {self.alive(url)} of "
                                    f"its {len(prefill) + len(decode)} workers alive")
            time.sleep(0.2)
        return Role(f"conductor-{len(self._children)}", url, child, info)

    def alive(self, url: str) -> int:
        snap = jsonhttp.call(url + "/v1/instances").body["instances"]
        return sum(1 for i in snap if i["alive"])

    def metrics(self, url: str) -> dict[str, float]:
        """`url`'s Prometheus figures (a /metrics URL, or a role's base URL)."""
        path = url if url.endswith("/metrics") else url + "/metrics"
        return metrics(jsonhttp.fetch(path).data.decode(errors="replace"))

    def close(self) -> None:
        for child in reversed(self._children):
            child.close(grace=30)
        self._children = []

    def __enter__(self) -> RoleProcs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
