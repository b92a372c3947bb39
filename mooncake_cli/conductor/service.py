"""ConductorService: a ConductorConfig -> the running conductor (HTTP front, poller, scheduler;
with --registry or --peers the etcd registry's watch, with --peers its share of the peers'
bookings and index).

    svc = ConductorService(cfg).start()
    svc.url          # http://127.0.0.1:PORT
    svc.close()
"""

from __future__ import annotations

import logging

from mooncake_cli.conductor.chat import ChatTemplate
from mooncake_cli.conductor.event_routing import EventRouting
from mooncake_cli.conductor.http_front import AUDITED, OPENAI, routes
from mooncake_cli.conductor.identities import Identities
from mooncake_cli.conductor.indexer import Indexer
from mooncake_cli.conductor.indexer_api import AUDITED as INDEXER_AUDITED
from mooncake_cli.conductor.indexer_api import READ as INDEXER_READ
from mooncake_cli.conductor.indexer_api import indexer_routes
from mooncake_cli.conductor.instances import Instances, Poller
from mooncake_cli.conductor.live import Conductor
from mooncake_cli.conductor.live_metrics import ConductorMetrics
from mooncake_cli.conductor.peers import Peers
from mooncake_cli.conductor.registry_watch import RegistryWatch
from mooncake_cli.conductor.served import ServedModel
from mooncake_cli.config.conductor import ConductorConfig
from mooncake_cli.http.audit import AuditLog
from mooncake_cli.http.auth import Gate, require_secret, signer
from mooncake_cli.http.server import Limits, Server, edge_app
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.kvkeys import KVNamespace
from mooncake_cli.scheduler.costmodel import CostModel, load_profile
from mooncake_cli.scheduler.links import Links
from mooncake_cli.scheduler.online_cost import OnlineCostModel
from mooncake_cli.scheduler.scheduler import Scheduler, Slo, make_policy
from mooncake_cli.scheduler.state import Cluster

log = logging.getLogger(__name__)


def served_model(cfg: ConductorConfig) -> ServedModel:
    """Tokenizer, KV namespace, chat template and context length of `cfg.model`, without
    loading weights (a named model is fetched into the cache first)."""
    from mooncake_cli.engine.errors import ModelError
    from mooncake_cli.engine.source import open_source

    try:
        src = open_source(cfg.model, progress=lambda msg: log.warning("%s", msg))
    except ModelError as e:
        raise ConfigError(str(e)) from None
    mc, chat = src.config, ChatTemplate.from_spec(src.chat)
    dtype = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(cfg.dtype, cfg.dtype)
    try:
        ns = KVNamespace(src.model_id, dtype, cfg.block_size, mc.num_layers, mc.num_kv_heads,
                         mc.head_dim)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return ServedModel(cfg.served_model_name or src.model_id, src.tokenizer, ns,
                       mc.max_position, chat, mc.vocab_size, tuple(src.eos_token_ids))


def cost_model(cfg: ConductorConfig, ns: KVNamespace) -> CostModel:
    if cfg.profile:
        return load_profile(cfg.profile)
    return OnlineCostModel(block_tokens=ns.block_size,
                           kv_bytes_per_token=ns.block_bytes // ns.block_size,
                           bandwidth=cfg.bandwidth)


class ConductorService:
    """`secret`, the cluster secret, guards the internal endpoints and signs the requests to
    the workers; refused beyond loopback without one (`mooncake_cli.http.auth.require_secret`)."""

    def __init__(self, cfg: ConductorConfig, secret: str = "") -> None:
        self.cfg = cfg
        require_secret(cfg.host, secret, "the conductor")
        auth = signer(secret)
        model = served_model(cfg)
        cost = cost_model(cfg, model.ns)
        cluster = Cluster(cost, links=Links(learn=cfg.link_bandwidth == "measured"))
        on_step = cost.observe_decode if isinstance(cost, OnlineCostModel) else None
        instances = Instances(cluster, cfg.instance_ttl, cfg.block_size, on_decode_step=on_step)
        slo = Slo(cfg.ttft_slo or None, cfg.tbt_slo or None)
        scheduler = Scheduler(cluster, make_policy(cfg.policy, cfg.seed, cfg.policy_options()), slo,
                              grow_decode=True, prefill_depth=cfg.prefill_depth)
        metrics = ConductorMetrics(cluster.index.blocks)
        self.conductor = Conductor(model, scheduler, instances, metrics,
                                   retries=cfg.retries, timeout=cfg.request_timeout,
                                   explain_path=cfg.explain, auth=auth,
                                   queue_limit=cfg.max_queue,
                                   max_migrations=cfg.max_migrations,
                                   prefetch=cfg.prefetch)
        self.poller = Poller(instances, cfg.prefill + cfg.decode, cfg.poll_interval, auth)
        limits = Limits(max_connections=cfg.max_connections, idle_timeout=cfg.idle_timeout)
        self.audit = AuditLog.open(cfg.audit_log, "conductor")
        self.indexer = Indexer()  # the KV indexer API's event streams (docs/indexer.md)
        # workers registering their KV events are followed through the same indexer
        self.events = instances.events = self.conductor.bookings.events = EventRouting(
            self.indexer, model.name, cfg.block_size)
        metrics.kv_streams = self.indexer.snapshot
        self.app = edge_app(routes(self.conductor, Identities(instances))
                            + indexer_routes(self.indexer), limits,
                            guard=Gate(secret, cfg.api_key, OPENAI + INDEXER_READ),
                            audit=self.audit, audited={**AUDITED, **INDEXER_AUDITED})
        self._http = Server(self.app, cfg.host, cfg.port, "conductor",
                            background=[self.poller.run])
        self.url = f"http://{self._http.host}:{self._http.port}"
        self.peers: Peers | None = None
        if cfg.peers:
            self.peers = self.conductor.bookings.peers = Peers(
                cfg.peers, cluster, instances.lock, self_url=self.url, secret=secret,
                ttl=cfg.peer_ttl)
        self.etcd: RegistryWatch | None = None
        if cfg.registry or cfg.peers:  # a new instance gets the peers' bookings of it
            joined = self.peers.bookings.sync if self.peers is not None else None
            self.etcd = RegistryWatch(instances, cfg.registry or cfg.peers, secret=secret,
                                      joined=joined)

    def start(self) -> ConductorService:
        if self.cfg.store_events:  # the store's holdings, as a /register of type Mooncake
            self.events.follow_store(self.cfg.store_events, self.cfg.store_events_replay or None)
        self.poller.start()
        if self.etcd is not None:
            self.etcd.start()
        if self.peers is not None:  # caught up before it serves (or 503 until it is)
            self.peers.start()
        self._http.start()
        return self

    def close(self) -> None:
        self._http.run(self.conductor.close_peer())
        self._http.close()
        if self.peers is not None:
            self.peers.close()
        if self.etcd is not None:
            self.etcd.close()
        self.conductor.close()
        self.indexer.close()
        if self.audit is not None:
            self.audit.close()
