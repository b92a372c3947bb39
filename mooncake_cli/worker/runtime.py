"""WorkerRuntime: what both roles share — the model, its paged KV cache registered with a
transfer engine, an optional store client, the HTTP server, metrics and registration."""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import TYPE_CHECKING, Any

from starlette.routing import Route

from mooncake_cli.config import TransferConfig
from mooncake_cli.config.worker import WorkerConfig, split_listen
from mooncake_cli.engine import KVCache, ModelRunner, load_model
from mooncake_cli.engine.kvcache import BlockAllocator
from mooncake_cli.http.audit import AuditLog
from mooncake_cli.http.auth import Gate, require_secret, signer
from mooncake_cli.http.server import Limits, Server, edge_app
from mooncake_cli.registry import Registry
from mooncake_cli.store.client import StoreClient
from mooncake_cli.transfer.engine import TransferEngine
from mooncake_cli.transfer.hostinfo import hostname
from mooncake_cli.worker.http import AUDITED
from mooncake_cli.worker.kvwire import KVWire
from mooncake_cli.worker.metrics import WorkerMetrics
from mooncake_cli.worker.registration import Registrar, register_with

if TYPE_CHECKING:
    from mooncake_cli.worker.etcd_registrar import EtcdRegistrar

log = logging.getLogger("mooncake.worker")


class LockedAllocator(BlockAllocator):
    """The cache's block allocator, safe to share between HTTP threads and the step loop."""

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self._lock = threading.Lock()

    def allocate(self, n: int) -> list[int]:
        with self._lock:
            return super().allocate(n)

    def release(self, blocks: list[int]) -> None:
        with self._lock:
            super().release(blocks)


class WorkerRuntime:
    """Loads everything at construction (binding the HTTP port); `start` serves, `close` stops.

    Subclasses set `role`, and implement `routes()`, `load()` and `drain()`. The transfer
    config's secret is the cluster secret: the HTTP edge requires it of every request but
    /health and /metrics, and the worker signs its own requests with it (`auth`)."""

    role = ""

    def __init__(self, cfg: WorkerConfig, transfer: TransferConfig | None = None,
                 registry: Registry | None = None) -> None:
        self.cfg = cfg
        self.draining = threading.Event()
        secret = (transfer or TransferConfig()).secret
        require_secret(split_listen(cfg.listen)[0], secret, f"the {self.role} worker")
        self.auth, self._secret = signer(secret), secret
        if cfg.threads:
            import torch

            torch.set_num_threads(cfg.threads)
        self.model = load_model(cfg.model, cfg.device, cfg.dtype,
                                progress=lambda msg: log.warning("%s", msg))
        self.ns = self.model.namespace(cfg.block_size)
        self.cache = KVCache(self.ns, cfg.kv_blocks, self.model.device)
        self.cache.allocator = LockedAllocator(cfg.kv_blocks)
        self.wire = KVWire(cfg.kv_wire, self.cache)  # the form of blocks moved and stored
        self.runner = ModelRunner(self.model, self.cache, cfg.chunk_size)
        self.metrics = WorkerMetrics(self.role, {
            "running": lambda: float(self.load()["running"]),
            "waiting": lambda: float(self.load()["waiting"]),
            "preempted": lambda: float(self.load().get("preempted", 0)),
            "free_blocks": lambda: float(self.cache.allocator.free),
            "total_blocks": lambda: float(self.cache.num_blocks),
            "kv_used_bytes": lambda: float((self.cache.num_blocks - self.cache.allocator.free)
                                           * self.ns.block_bytes),
            "kv_capacity_bytes": lambda: float(self.cache.num_blocks * self.ns.block_bytes)})
        host, port = split_listen(cfg.listen)
        self.audit = AuditLog.open(cfg.audit_log, self.role)
        self.app = edge_app(self.routes(), Limits(max_connections=cfg.max_connections),
                            guard=Gate(secret), audit=self.audit, audited=AUDITED)
        self.http = Server(self.app, host, port, f"mooncake-{self.role}-http")
        reach = cfg.advertise or (host if host not in ("0.0.0.0", "::", "") else hostname())
        self.url = f"http://{reach if ':' not in reach else f'[{reach}]'}:{self.http.port}"
        self.name = cfg.name or f"{self.role}@{reach}:{self.http.port}"
        self.engine: TransferEngine | None = None
        self.store: StoreClient | None = None
        self._registrar: Registrar | EtcdRegistrar | None = None
        try:
            tc = transfer or TransferConfig()
            p2p = tc.metadata.strip().lower() in ("p2p", "p2phandshake", "")
            tc = dataclasses.replace(tc, host=host, advertise=tc.advertise or cfg.advertise,
                                     name="" if p2p else (tc.name or self.name))
            self.engine = TransferEngine(tc, registry or Registry.from_env())
            # peers write KV there only with a capability: a prefill worker's reservation on
            # a decode worker (worker/kvgrant.py), a pipeline stage's on its lead
            self.pool_region = self.engine.register(self.cache.pool, guarded=True)
            self.engine.set_audit(self.audit)  # refused accesses and transfers, too
            if cfg.uses_store:
                self.store = StoreClient(cfg.store, self.engine, cfg.segment_size,
                                         client_id=f"{self.name}-{self.engine.name}",
                                         secret=tc.secret or None)
        except BaseException:
            self._release()
            raise

    # -- what both roles answer --------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return {"status": "draining" if self.draining.is_set() else "ok", "role": self.role,
                "name": self.name, "model": self.ns.model, "block_size": self.cfg.block_size}

    def load(self) -> dict[str, Any]:
        raise NotImplementedError

    def routes(self) -> list[Route]:
        raise NotImplementedError

    def registration(self) -> dict[str, Any]:
        return {"role": self.role, "name": self.name, "url": self.url, "model": self.ns.model,
                "block_size": self.cfg.block_size, "load": self.load()}

    def describe(self) -> dict[str, Any]:
        """The ready event: where it listens and what it serves."""
        assert self.engine is not None
        return {"event": "ready", "role": self.role, "name": self.name, "url": self.url,
                "model": self.ns.model, "description": self.model.description,
                "block_size": self.cfg.block_size, "kv_blocks": self.cfg.kv_blocks,
                "kv_bytes_per_block": self.ns.block_bytes, "kv_wire": self.wire.name,
                "segment": self.engine.name,
                "store": self.cfg.store if self.store else None,
                "conductor": self.cfg.conductor or None}

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> WorkerRuntime:
        self.http.start()
        self._registrar = register_with(self.cfg.conductor, self.registration,
                                        self.cfg.heartbeat, self._secret, self.auth)
        return self

    def drain(self, timeout: float) -> None:
        """Refuse new work, let in-flight work finish for up to `timeout` s, fail the rest."""
        raise NotImplementedError

    def close(self) -> None:
        """Drain, deregister, unmount the store segment, close the engine and the server."""
        if self.draining.is_set():
            return
        self.draining.set()
        try:
            self.drain(self.cfg.drain_timeout)
        finally:
            if self._registrar is not None:
                self._registrar.close(self.name)
            self._release()

    def _release(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        self.http.close()
        if self.audit is not None:
            self.audit.close()
            self.audit = None

    def __enter__(self) -> WorkerRuntime:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
