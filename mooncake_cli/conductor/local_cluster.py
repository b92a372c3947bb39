"""`conductor start --local P,D`: a whole cluster in one process, for a laptop.

A store master on a free loopback port (publishing its object events on loopback, which the
conductor follows: `--store-events`), P prefill and D decode workers of the same model (each
with its own KV cache, store segment and HTTP port; on the worker config's engine: ours, or
vLLM's in this process with its engine cores beside it), and the conductor in front of them. Closing
stops the conductor first, then the workers (finishing what is in flight), then the master.

Every role gets the one cluster secret: the transfer config's, or a fresh one (kept in memory),
so no other process of this host can register workers, reserve or write KV memory, or put and
remove blocks in the store. The workers append to the conductor's --audit-log.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from mooncake_cli.conductor.service import ConductorService
from mooncake_cli.config import TransferConfig
from mooncake_cli.config.conductor import ConductorConfig
from mooncake_cli.config.store import StoreConfig
from mooncake_cli.config.worker import WorkerConfig
from mooncake_cli.http.auth import new_secret
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.registry import Registry
from mooncake_cli.store.master.events import ObjectEvents
from mooncake_cli.store.service import MasterService, events_from, master_from
from mooncake_cli.worker.engines import Worker, worker_class

log = logging.getLogger(__name__)


def parse_local(spec: str) -> tuple[int, int]:
    """(P, D) from "P,D"; ConfigError unless both are integers >= 1."""
    parts = spec.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ConfigError(f"--local {spec!r}: use P,D (prefill and decode worker counts), "
                          "e.g. 2,1")
    p, d = (int(x) for x in parts)
    if p < 1 or d < 1 or p + d > 32:
        raise ConfigError(f"--local {spec!r}: at least one of each role, 32 workers at most")
    return p, d


class LocalCluster:
    """Master + workers + conductor in this process; `progress(text)` reports each start."""

    def __init__(self, cfg: ConductorConfig, prefill: int, decode: int,
                 worker: WorkerConfig | None = None, transfer: TransferConfig | None = None,
                 progress: Callable[[str], None] = lambda _: None) -> None:
        self.master: MasterService | None = None
        self.events: ObjectEvents | None = None
        self.workers: list[Worker] = []
        self.conductor: ConductorService | None = None
        base = worker or WorkerConfig()
        base = dataclasses.replace(base, model=cfg.model, dtype=cfg.dtype,
                                   block_size=cfg.block_size, listen=f"{cfg.host}:0",
                                   audit_log=base.audit_log or cfg.audit_log)
        transfer = transfer or TransferConfig()
        self.secret = transfer.secret or new_secret()
        transfer = dataclasses.replace(transfer, secret=self.secret)
        try:
            store_cfg = StoreConfig(kv_events="tcp://127.0.0.1:0")
            self.events = events_from(store_cfg)
            self.master = MasterService(master_from(store_cfg, self.events), cfg.host, 0,
                                        self.secret)
            self.master.__enter__()
            progress(f"store master at {self.master.address}")
            registry = Registry.from_env()
            for role, n in (("prefill", prefill), ("decode", decode)):
                kind = worker_class(base.engine, role)
                for i in range(n):
                    wcfg = dataclasses.replace(base, role=role, name=f"{role}-{i}",
                                               store=self.master.address)
                    w = kind(wcfg, transfer, registry).start()
                    self.workers.append(w)
                    progress(f"{w.name} at {w.url}")
            urls = {r: tuple(w.url for w in self.workers if w.role == r)
                    for r in ("prefill", "decode")}
            assert self.events is not None
            ccfg = dataclasses.replace(cfg, prefill=urls["prefill"], decode=urls["decode"],
                                       store_events=self.events.endpoint,
                                       store_events_replay=self.events.replay_endpoint)
            self.conductor = ConductorService(ccfg, self.secret).start()
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        assert self.conductor is not None
        return self.conductor.url

    def close(self) -> None:
        if self.conductor is not None:
            self.conductor.close()
            self.conductor = None
        for w in reversed(self.workers):
            try:
                w.close()
            except Exception:  # one worker failing to stop must not keep the others up
                log.exception("closing %s", w.name)
        self.workers.clear()
        if self.master is not None:
            self.master.__exit__(None, None, None)
            self.master = None
        if self.events is not None:
            self.events.close()
            self.events = None
