"""ConductorConfig: the live conductor's settings (the `[conductor]` table of cluster.toml).

    [conductor]
    host = "127.0.0.1"
    port = 8000
    model = "demo"                        # checkpoint dir or demo name: tokenizer + KV geometry
    served_model_name = "demo"            # the name clients put in "model"
    policy = "kvcache-centric"
    prefill = ["http://10.0.0.1:9100"]    # static instances (workers may also register)
    decode = ["http://10.0.0.2:9200"]
    ttft_slo = 30.0                       # seconds; 0 admits everything
    tbt_slo = 0.2
"""

from __future__ import annotations

import math
import urllib.parse
from dataclasses import dataclass
from typing import Any

from mooncake_cli.api.kv_events import replay_of
from mooncake_cli.config import described
from mooncake_cli.interfaces import ConfigError, MooncakeError

PIPELINE = "kvcache-pipeline"  # the policy that spreads a prefill over stages (our engine's)
LINK_BANDWIDTH = ("measured", "model")  # what fetch estimates take per pair (conductor/links.py)


def _urls(value: Any, name: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{name} must be a list of http://HOST:PORT URLs")
    out = []
    for v in value:
        v = v.strip().rstrip("/")
        if not v.startswith("http://"):
            v = "http://" + v
        try:
            if urllib.parse.urlsplit(v).port is None or not urllib.parse.urlsplit(v).hostname:
                raise ValueError("no port")
        except ValueError:
            raise ConfigError(f"{name}: {v!r} is not an http://HOST:PORT URL") from None
        out.append(v)
    return tuple(out)


@dataclass(frozen=True)
class ConductorConfig:
    """The conductor: its listener, served model, policy, SLOs and workers."""

    host: str = described("127.0.0.1", "listen address")
    port: int = described(8000, "HTTP port (0: any free)")
    model: str = described("demo", "checkpoint directory, .gguf file or named model, for the "
                                   "tokenizer and the KV block geometry")
    served_model_name: str = described("", "the model name clients send (none: the model's id)")
    dtype: str = described("float32", "the workers' KV dtype (part of every block key)")
    block_size: int = described(16, "tokens per KV block; must match the workers'")
    policy: str = described("kvcache-centric", "random, round-robin, least-load, cache-aware, "
                                               "kvcache-centric or kvcache-pipeline (a long "
                                               "prefill may run as a pipeline of layer stages "
                                               "on idle prefill workers: native engine only)")
    max_stages: int = described(2, "kvcache-pipeline: prefill workers one pipelined prefill "
                                   "may use at most, its lead included")
    pipeline_chunk: int = described(2048, "kvcache-pipeline: prompt tokens per chunk handed "
                                          "between stages; shorter prompts are not pipelined")
    pipeline_min_gain: float = described(0.3, "kvcache-pipeline: the estimated TTFT gain "
                                              "(a fraction) a pipeline must bring over the "
                                              "best single worker")
    seed: int = described(0, "seed of the random policies")
    prefill: tuple[str, ...] = described((), "comma-separated prefill worker URLs (workers "
                                             "may also register themselves)")
    decode: tuple[str, ...] = described((), "comma-separated decode worker URLs")
    ttft_slo: float = described(0.0, "TTFT SLO in seconds; a request whose predicted TTFT "
                                     "(its wait in the queue + prefill) breaks it gets 429 "
                                     "(0: no limit)")
    tbt_slo: float = described(0.0, "TBT SLO in seconds (0: no limit)")
    max_queue: int = described(4096, "requests that may wait for room at once (503 with "
                                     "Retry-After beyond); without an SLO a request waits "
                                     "instead of getting 429")
    prefill_depth: int = described(32, "requests booked on one prefill instance at once; more "
                                       "wait in the conductor's queue (0: no limit)")
    instance_ttl: float = described(5.0, "seconds after which a silent instance is dead")
    poll_interval: float = described(1.0, "seconds between load polls of each instance")
    retries: int = described(2, "other instances tried when one fails")
    request_timeout: float = described(300.0, "seconds a worker may stay silent within a "
                                               "request: for a prefill's answer, or between "
                                               "two tokens of an answer")
    max_migrations: int = described(3, "times one answer may move to another decode worker "
                                       "when its worker fails mid-answer (0: never)")
    prefetch: bool = described(True, "have the prefill instance a waiting request will go to "
                                     "pull its stored prefix into its own segment meanwhile "
                                     "(--no-prefetch: the prefill fetches it when it starts)")
    profile: str = described("", "profile.json from `mooncake bench profile` (none: learn the "
                                 "cost model from the workers' timings)")
    explain: str = described("", "JSONL file to append every scheduling decision to")
    bandwidth: float = described(1e9, "bytes/s between instances, for fetch estimates")
    link_bandwidth: str = described("measured", "the bandwidth a prefix fetched from one "
                                                "prefill instance by another is estimated to "
                                                "cross at: measured (each pair's, learned from "
                                                "the fetches the conductor had it make; the "
                                                "cost model's bandwidth until the first) or "
                                                "model (the cost model's for every pair; "
                                                "nothing learned)")
    registry: str = described("", "etcd://HOST:PORT[,...][/CLUSTER]: also serve the workers "
                                  "registered there")
    peers: str = described("", "etcd://HOST:PORT[,...][/CLUSTER]: share decode bookings and "
                               "the prefix index with every conductor started with the same "
                               "address, and serve the workers registered there (the "
                               "registry, unless --registry names another)")
    store_events: str = described("", "tcp://HOST:PORT of a store master's object events "
                                      "(its --kv-events): the indexer follows what the store "
                                      "holds from the start, as a /register of type Mooncake "
                                      "would")
    store_events_replay: str = described("", "their replay endpoint (none: --store-events' "
                                             "port + 1, as the master derives it)")
    peer_ttl: int = described(5, "seconds this conductor's bookings outlive it in etcd when it "
                                 "dies (its lease; refreshed every third of it)")
    max_connections: int = described(16384, "HTTP connections (and requests) at once; 503 "
                                            "beyond")
    idle_timeout: float = described(15.0, "seconds a keep-alive client connection may idle")
    api_key: str = described("", "key the OpenAI API requires as 'Authorization: Bearer KEY' "
                                 "(none: open)")
    audit_log: str = described("", "JSONL file to append every registration, completion and "
                                   "refused access to")

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefill", _urls(self.prefill, "prefill"))
        object.__setattr__(self, "decode", _urls(self.decode, "decode"))
        if not 0 <= self.port < 65536:
            raise ConfigError(f"port {self.port} is out of range 0-65535")
        if self.block_size < 1:
            raise ConfigError(f"block_size must be >= 1, got {self.block_size}")
        for name in ("ttft_slo", "tbt_slo"):
            v = getattr(self, name)
            if v < 0 or not math.isfinite(v):
                raise ConfigError(f"{name} must be >= 0 seconds (0: no limit), got {v}")
        if min(self.instance_ttl, self.poll_interval, self.request_timeout, self.bandwidth) <= 0:
            raise ConfigError("instance_ttl, poll_interval, request_timeout and bandwidth "
                              "must be positive")
        if self.registry or self.peers:
            from mooncake_cli.api.registration import parse

            for url in (self.registry, self.peers):
                if url:
                    parse(url)
        if self.link_bandwidth not in LINK_BANDWIDTH:
            raise ConfigError(f"link_bandwidth must be {' or '.join(LINK_BANDWIDTH)}, not "
                              f"{self.link_bandwidth!r}")
        if self.store_events_replay and not self.store_events:
            raise ConfigError("store_events_replay needs store_events")
        for name in ("store_events", "store_events_replay"):
            if getattr(self, name):
                try:
                    replay_of(getattr(self, name))  # the form of an endpoint, checked
                except MooncakeError as e:
                    raise ConfigError(f"{name}: {e}") from None
        if self.peer_ttl < 2:
            raise ConfigError(f"peer_ttl must be >= 2 seconds (etcd's shortest lease), got "
                              f"{self.peer_ttl}")
        if self.retries < 0 or self.max_migrations < 0:
            raise ConfigError("retries and max_migrations must be >= 0")
        if self.max_queue < 0 or self.prefill_depth < 0:
            raise ConfigError("max_queue and prefill_depth must be >= 0")
        from mooncake_cli.scheduler.scheduler import POLICIES

        if self.policy not in POLICIES:
            raise ConfigError(f"unknown policy '{self.policy}': use one of "
                              f"{', '.join(POLICIES)}")
        self.policy_options()  # ConfigError for an out-of-range pipeline option

    def policy_options(self) -> dict[str, Any]:
        """The policy's own options (kvcache-pipeline's), checked."""
        if self.policy != PIPELINE:
            return {}
        from mooncake_cli.scheduler.policy_ours import PipelinePolicy

        PipelinePolicy(max_stages=self.max_stages, chunk_tokens=self.pipeline_chunk,
                       min_gain=self.pipeline_min_gain)
        return {"max_stages": self.max_stages, "chunk_tokens": self.pipeline_chunk,
                "min_gain": self.pipeline_min_gain}
