"""VllmWorker: what a prefill and a decode worker on vLLM share, as the native workers
(mooncake_cli.worker.runtime) do: the HTTP edge with the cluster secret and the audit log,
/health, /metrics (the native workers' figures) and /v1/load, registration with a conductor
(the same Registrar, or etcd), and the vLLM engine (engine.py) started in this process.

The KV namespace (model id, dtype, geometry) is the native workers', from the same --model, so
the block keys a prefill answers with are the conductor's.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from mooncake_cli.api.errors import ErrorCode, ServingError
from mooncake_cli.config import TransferConfig
from mooncake_cli.config.worker import WorkerConfig, split_listen
from mooncake_cli.engine.errors import ModelError
from mooncake_cli.engine.source import open_source
from mooncake_cli.http.audit import AuditLog
from mooncake_cli.http.auth import Gate, require_secret, signer
from mooncake_cli.http.jsonhttp import AsyncPeer
from mooncake_cli.http.server import Limits, Server, edge_app, text_response
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.kvkeys import KVNamespace
from mooncake_cli.registry import Registry
from mooncake_cli.transfer.hostinfo import hostname
from mooncake_cli.worker.metrics import WorkerMetrics
from mooncake_cli.worker.registration import Registrar, register_with
from rich.markup import escape
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mooncake_vllm.engine import EngineSpec, VllmEngine
from mooncake_vllm.kv_events import EventSockets
from mooncake_vllm.model_dir import model_folder
from mooncake_vllm.startlog import new_log
from mooncake_vllm.stats import EngineStats

if TYPE_CHECKING:
    from mooncake_cli.worker.etcd_registrar import EtcdRegistrar

log = logging.getLogger("mooncake.vllm")
AUDITED = {"/v1/prefill": "prefill", "/v1/kv/handoff": "handoff", "/v1/kv/release": "release",
           "/v1/generate": "generate"}
PROTOCOLS = {"tcp": "tcp", "nixl": "rdma"}  # our transport -> MooncakeConnector's protocol


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host if host not in ("", "::") else "0.0.0.0", 0))
        return int(s.getsockname()[1])


class VllmWorker:
    """Starts vLLM at construction (binding the HTTP port first); `start` serves and registers,
    `close` drains, deregisters and stops vLLM. Subclasses set `role` and add `routes()`."""

    role = ""

    def __init__(self, cfg: WorkerConfig, transfer: TransferConfig | None = None,
                 registry: Registry | None = None) -> None:
        self.cfg = cfg
        self.draining = threading.Event()
        tc = transfer or TransferConfig()
        host, port = split_listen(cfg.listen)
        require_secret(host, tc.secret, f"the {self.role} worker")
        self.auth, self._secret = signer(tc.secret), tc.secret
        try:
            src = open_source(cfg.model, progress=lambda msg: log.warning("%s", msg))
            self.ns = KVNamespace(src.model_id, cfg.dtype, cfg.block_size, src.config.num_layers,
                                  src.config.num_kv_heads, src.config.head_dim)
        except (ModelError, ValueError) as e:
            raise ConfigError(str(e)) from None
        self.tokenizer = src.tokenizer
        self.model_dir = model_folder(cfg.model)
        self.active = 0  # requests in flight (HTTP loop only)
        self.metrics = WorkerMetrics(self.role, self._gauges())
        self.stats = EngineStats(self.role, self.metrics)
        self.audit = AuditLog.open(cfg.audit_log, self.role)
        self.app = edge_app(self.routes(), Limits(max_connections=cfg.max_connections),
                            guard=Gate(tc.secret), audit=self.audit, audited=AUDITED)
        self.http = Server(self.app, host, port, f"mooncake-vllm-{self.role}")
        self.reach = cfg.advertise or (host if host not in ("0.0.0.0", "::", "") else hostname())
        self.url = f"http://{self.reach if ':' not in self.reach else f'[{self.reach}]'}:" \
                   f"{self.http.port}"
        self.name = cfg.name or f"{self.role}@{self.reach}:{self.http.port}"
        self.vllm_log = new_log(self.name)
        self.bootstrap = free_port(host)
        # a prefill worker's KV events tell the conductor what its vLLM holds
        self.events = EventSockets.open(host, self.reach) if self.role == "prefill" else None
        self._registrar: Registrar | EtcdRegistrar | None = None
        self._peers: dict[asyncio.AbstractEventLoop, AsyncPeer] = {}
        self._stopping = threading.Event()
        self._watch = threading.Thread(target=self._watchdog, daemon=True,
                                       name=f"mooncake-vllm-{self.role}-watch")
        spec = EngineSpec(
            role=self.role, engine_id=self.name, model_dir=self.model_dir, host=self.reach,
            dtype=cfg.dtype, block_size=cfg.block_size, kv_blocks=cfg.kv_blocks,
            chunk_size=cfg.chunk_size, store=cfg.store if cfg.uses_store else "",
            segment_size=cfg.segment_size, protocol=PROTOCOLS.get(tc.transport, "auto"),
            secret=tc.secret, bootstrap_port=self.bootstrap,
            kv_events=self.events.config() if self.events is not None else None)
        try:
            self.engine = VllmEngine(spec, self.stats, self.vllm_log)
        except BaseException:
            if self.events is not None:
                self.events.close()
            self.http.close()
            if self.audit is not None:
                self.audit.close()
            raise

    def _now(self) -> tuple[int, int, float]:
        """vLLM's running and waiting requests and KV cache use, as of its last step (none
        running while no request of this worker is in flight: vLLM reports only when it
        steps, so its last report outlives the request it counted)."""
        running, waiting, usage = self.stats.snapshot()
        return (running, waiting, usage) if self.active else (0, 0, usage)

    def _gauges(self) -> dict[str, Any]:
        def used() -> float:
            return self._now()[2] * self.engine.num_blocks

        return {"running": lambda: float(self._now()[0]),
                "waiting": lambda: float(self._now()[1]),
                "preempted": lambda: 0.0,
                "free_blocks": lambda: self.engine.num_blocks - round(used()),
                "total_blocks": lambda: float(self.engine.num_blocks),
                "kv_used_bytes": lambda: round(used()) * float(self.engine.block_bytes),
                "kv_capacity_bytes": lambda: float(self.engine.num_blocks *
                                                   self.engine.block_bytes)}

    # -- what both roles answer --------------------------------------------------------------
    def routes(self) -> list[Route]:
        async def health(request: Request) -> Response:
            answer = self.health()
            return JSONResponse(answer, 503 if answer["status"] == "dead" else 200)

        async def metrics(request: Request) -> Response:
            return text_response(self.metrics.render())

        async def load(request: Request) -> Response:
            return JSONResponse(self.load())

        return [Route("/health", health), Route("/metrics", metrics), Route("/v1/load", load)]

    def health(self) -> dict[str, Any]:
        status = "dead" if self.engine_dead() else \
            "draining" if self.draining.is_set() else "ok"
        return {"status": status, "role": self.role, "name": self.name, "model": self.ns.model,
                "block_size": self.cfg.block_size, **self._kv_events()}

    def _kv_events(self) -> dict[str, Any]:
        if self.events is None:
            return {}
        return {"kv_events": self.events.registration(self.cfg.block_size)}

    def engine_dead(self) -> bool:
        """Whether vLLM's engine has died (its engine-core process gone, say): vLLM notices
        it itself and fails every request after."""
        return bool(getattr(self.engine.llm, "errored", False))

    def load(self) -> dict[str, Any]:
        running, waiting, usage = self._now()
        total = self.engine.num_blocks
        return {"role": self.role, "running": running, "waiting": waiting,
                "free_blocks": total - round(usage * total), "total_blocks": total,
                "recent_step_s": self.metrics.recent_step_s(), "queued_prefill_tokens": 0,
                "preempted": 0, "preemptions": int(self.metrics.get("preemptions"))}

    def registration(self) -> dict[str, Any]:
        return {"role": self.role, "name": self.name, "url": self.url, "model": self.ns.model,
                "block_size": self.cfg.block_size, "load": self.load(), **self._kv_events()}

    def describe(self) -> dict[str, Any]:
        from vllm import __version__

        return {"event": "ready", "role": self.role, "name": self.name, "url": self.url,
                "engine": "vllm", "vllm": __version__, "model": self.ns.model,
                "description": f"vLLM {__version__}: {self.model_dir}",
                "block_size": self.cfg.block_size, "kv_blocks": self.engine.num_blocks,
                "kv_bytes_per_block": self.engine.block_bytes,
                "bootstrap": f"http://{self.reach}:{self.bootstrap}",
                "store": self.cfg.store if self.cfg.uses_store else None,
                "conductor": self.cfg.conductor or None, "vllm_log": str(self.vllm_log)}

    def ready_text(self) -> str:
        info = self.describe()
        return (f"{self.role} worker [bold]{escape(self.name)}[/bold] at "
                f"[bold]{escape(self.url)}[/bold]\n"
                f"  engine: {escape(info['description'])}\n"
                f"  KV: {info['kv_blocks']} blocks of {self.cfg.block_size} tokens, store "
                f"{escape(info['store'] or 'none')}\n  vLLM's log: {escape(str(self.vllm_log))}")

    # -- for the roles' requests -------------------------------------------------------------
    @property
    def peer(self) -> AsyncPeer:
        """The pooled client of the running loop, signing with the cluster secret."""
        loop = asyncio.get_running_loop()
        if loop not in self._peers:
            self._peers[loop] = AsyncPeer(self.auth)
        return self._peers[loop]

    def refuse_when_draining(self) -> None:
        if self.draining.is_set():
            raise ServingError(ErrorCode.UNAVAILABLE,
                               f"{self.role} worker {self.name} is shutting down")

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> VllmWorker:
        self.http.start()
        self._registrar = register_with(self.cfg.conductor, self.registration,
                                        self.cfg.heartbeat, self._secret, self.auth)
        self._watch.start()
        return self

    def _watchdog(self) -> None:
        """A worker whose vLLM died leaves the conductor (its /health answers 503 from then),
        so that no request is placed on it."""
        while not self._stopping.wait(self.cfg.heartbeat):
            if self.engine_dead():
                log.error("%s: its vLLM engine died (vLLM's log: %s); leaving the conductor",
                          self.name, self.vllm_log)
                registrar, self._registrar = self._registrar, None
                if registrar is not None:
                    registrar.close(self.name)
                return

    def close(self) -> None:
        """Let in-flight requests finish (up to drain_timeout), deregister, stop vLLM."""
        if self.draining.is_set():
            return
        self.draining.set()
        self._stopping.set()
        if self._watch.is_alive():
            self._watch.join()
        deadline = time.monotonic() + self.cfg.drain_timeout
        while self.active and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._registrar is not None:
            self._registrar.close(self.name)
        for peer in list(self._peers.values()):
            self.http.run(peer.close())
        self.http.close()
        self.engine.close()
        if self.events is not None:
            self.events.close()
        if self.audit is not None:
            self.audit.close()
            self.audit = None
