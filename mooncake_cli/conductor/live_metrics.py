"""The live conductor's Prometheus metrics on its own registry: counters, TTFT/TBT histograms,
per-instance load and cached blocks.

The four figures every dashboard shows: the prefix-cache hit ratio
(`mooncake_conductor_prefix_hit_ratio`), the cache size (`mooncake_conductor_cached_blocks`
per instance, from the global cache index), evictions (`mooncake_conductor_evicted_blocks_total`,
blocks the index dropped to make room) and the bytes moved between nodes
(`mooncake_conductor_kv_bytes_moved_total`, by `path`: `fetch` between prefill instances,
`stream` from prefill to decode).

Cache load balancing shows in two counters: `blocks_fetched_total`, the blocks the scheduler
chose to have a prefill instance fetch from another one (its decision), and
`blocks_replicated_total`, the fetched blocks that then gained a replica in the fetching
instance's own store segment (what the prefill answers report as "replicated_keys").
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from mooncake_cli.http.metrics import ScrapeCollector, new_registry, render

PREFIX = "mooncake_conductor_"
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TBT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 1, 2.5)
COUNTERS = {
    "requests_total": "Completion requests accepted for scheduling.",
    "rejected_total": "Requests refused with 429 (their predicted TTFT or TBT breaks the SLO).",
    "queued_total": "Requests that waited in the queue for room.",
    "queue_full_total": "Requests refused with 503 because the wait queue was full.",
    "errors_total": "Requests that failed after scheduling.",
    "rerouted_total": "Requests placed again after an instance failed.",
    "pipelined_total": "Prefills run as a pipeline of layer stages on several prefill "
                       "instances (kvcache-pipeline).",
    "pipeline_fallbacks_total": "Pipelined prefills that their lead ran alone because a stage "
                                "was busy, failed or gone.",
    "prompt_tokens_total": "Prompt tokens prefilled.",
    "prefix_hit_tokens_total": "Prompt tokens whose KV was reused from the cache.",
    "completion_tokens_total": "Tokens streamed back to clients.",
    "blocks_fetched_total": "KV blocks the scheduler had a prefill instance fetch from another.",
    "blocks_replicated_total": "Fetched KV blocks that gained a replica on the fetching instance.",
    "prefetch_requests_total": "Waiting requests whose prefill instance was asked to pull "
                               "their prefix into its own segment while they wait.",
    "prefetch_cancelled_total": "Prefetches cancelled: their request left the queue or went to "
                                "another instance.",
    "prefetched_blocks_total": "Prefix blocks a prefetch had pulled onto the prefill instance "
                               "before its prefill began (as the prefill answers report).",
    "evicted_blocks_total": "KV blocks the cache index dropped to make room.",
    "migrations_total": "Answers moved to another decode worker after theirs failed.",
    "migration_reused_tokens_total": "Tokens of moved answers whose KV the new prefill "
                                     "loaded from the store.",
    "migration_recomputed_tokens_total": "Tokens of moved answers whose KV was recomputed.",
}
MOVED_PATHS = ("fetch", "stream")


class ConductorMetrics:
    """Thread-safe counters; `render(instances)` gives the /metrics text. `cached_blocks`
    (instance name -> blocks the index says it holds) is read at each scrape when given."""

    def __init__(self, cached_blocks: Callable[[str], int] | None = None) -> None:
        self.registry = new_registry()
        self._lock = threading.Lock()
        self._values = dict.fromkeys(COUNTERS, 0.0)
        self._counters = {name: Counter(PREFIX + name.removesuffix("_total"), text,
                                        registry=self.registry)
                          for name, text in COUNTERS.items()}
        self._moved = Counter(PREFIX + "kv_bytes_moved", "Bytes of KV moved between nodes.",
                              ["path"], registry=self.registry)
        for path in MOVED_PATHS:
            self._moved.labels(path)
        self.ttft = Histogram(PREFIX + "ttft_seconds", "Time to the first token.",
                              buckets=TTFT_BUCKETS, registry=self.registry)
        self.tbt = Histogram(PREFIX + "tbt_seconds", "Time between tokens.",
                             buckets=TBT_BUCKETS, registry=self.registry)
        self.queue_wait = Histogram(PREFIX + "queue_wait_seconds", "Time a request waited "
                                    "in the queue before its prefill was placed.",
                                    buckets=TTFT_BUCKETS, registry=self.registry)
        self.migration_gap = Histogram(PREFIX + "migration_gap_seconds", "Time from a "
                                       "decode worker's failure to the next token of the "
                                       "answer it had, on another one.",
                                       buckets=TTFT_BUCKETS, registry=self.registry)
        self.queue_length: Callable[[], int] = lambda: 0
        self.kv_streams: Callable[[], list[dict[str, Any]]] = list  # Indexer.snapshot
        self._cached_blocks = cached_blocks
        self._instances: list[dict[str, Any]] = []
        self._render_lock = threading.Lock()
        self.registry.register(ScrapeCollector(self._collect))

    @property
    def counters(self) -> dict[str, float]:
        """A copy of the counters' values by name (e.g. "requests_total")."""
        with self._lock:
            return dict(self._values)

    def add(self, name: str, v: float = 1) -> None:
        with self._lock:
            self._values[name] += v
        self._counters[name].inc(v)

    def moved(self, path: str, nbytes: int) -> None:
        """`nbytes` of KV moved between nodes along `path` (fetch or stream)."""
        if nbytes > 0:
            self._moved.labels(path).inc(nbytes)

    def observe(self, ttft: float | None = None, gaps: Sequence[float] = ()) -> None:
        if ttft is not None:
            self.ttft.observe(ttft)
        for g in gaps:
            self.tbt.observe(g)

    def hit_ratio(self) -> float:
        with self._lock:
            p = self._values["prompt_tokens_total"]
            return self._values["prefix_hit_tokens_total"] / p if p else 0.0

    def _collect(self) -> Iterator[Metric]:
        ratio = GaugeMetricFamily(PREFIX + "prefix_hit_ratio", "Prompt tokens served from the "
                                  "prefix cache, of all prompt tokens.")
        ratio.add_metric([], self.hit_ratio())
        yield ratio
        queue = GaugeMetricFamily(PREFIX + "queue_length", "Requests waiting for room now.")
        queue.add_metric([], self.queue_length())
        yield queue
        labels = ["name", "role"]
        alive = GaugeMetricFamily(PREFIX + "instance_alive", "1 while the instance answers.",
                                  labels=labels)
        running = GaugeMetricFamily(PREFIX + "instance_running", "Requests running on the "
                                    "instance.", labels=labels)
        cached = GaugeMetricFamily(PREFIX + "cached_blocks", "KV blocks the cache index says "
                                   "the instance holds (cache size).", labels=labels)
        for i in self._instances:
            key = [str(i["name"]), str(i["role"])]
            alive.add_metric(key, int(bool(i["alive"])))
            load = i["load"] if isinstance(i.get("load"), dict) else {}
            run = load.get("running", 0)
            running.add_metric(key, float(run) if isinstance(run, (int, float)) else 0.0)
            if self._cached_blocks is not None:
                cached.add_metric(key, self._cached_blocks(str(i["name"])))
        yield from (alive, running, cached)
        yield from self._kv_events()

    def _kv_events(self) -> Iterator[Metric]:
        """Per KV event stream (a followed worker's, or one the indexer API registered)."""
        events = CounterMetricFamily(PREFIX + "kv_events", "KV event streams: batches and "
                                     "events applied, gaps, batches replayed, gaps not "
                                     "recovered, malformed frames, blocks stored/removed.",
                                     labels=["stream", "kind"])
        held = GaugeMetricFamily(PREFIX + "kv_event_blocks", "Engine blocks a KV event stream "
                                 "says are held, by medium.", labels=["stream", "medium"])
        for s in self.kv_streams():
            name = f"{s['instance_id']}|{s['tenant_id']}|{s['dp_rank']}"
            for kind, v in sorted({"batches": 0, "events": 0, **s["counts"]}.items()):
                events.add_metric([name, kind], float(v))
            for medium, n in sorted(s["blocks"].items()):
                held.add_metric([name, medium], float(n))
        yield from (events, held)

    def render(self, instances: list[dict[str, Any]]) -> str:
        with self._render_lock:
            self._instances = instances
            try:
                return render(self.registry)
            finally:
                self._instances = []
