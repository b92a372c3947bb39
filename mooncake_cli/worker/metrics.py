"""WorkerMetrics: one worker's counters, step times and gauges on its own Prometheus registry.

The four figures every dashboard shows: the prefix-cache hit ratio
(`mooncake_worker_prefix_hit_ratio`), the cache size (`mooncake_worker_kv_used_bytes` of
`mooncake_worker_kv_capacity_bytes`), evictions (`mooncake_worker_prefix_evictions_total`:
stored prefix blocks gone by the time they were read) and the bytes moved between nodes
(`mooncake_worker_kv_bytes_{loaded,stored,sent}_total`).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator

from prometheus_client import Counter, Summary
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from mooncake_cli.http.metrics import ScrapeCollector, new_registry, render

PREFIX = "mooncake_worker_"
GAUGE_HELP = {
    "running": "Requests running now.",
    "waiting": "Requests queued now.",
    "preempted": "Decode sequences preempted now, waiting to resume.",
    "free_blocks": "Free blocks of the paged KV cache.",
    "total_blocks": "Blocks of the paged KV cache.",
    "kv_used_bytes": "Bytes of the KV cache in use (cache size).",
    "kv_capacity_bytes": "Bytes of the KV cache.",
}


class WorkerMetrics:
    """Thread-safe counters; gauges are read from callables at each scrape."""

    COUNTERS = {
        "prompt_tokens": "Prompt tokens received.",
        "computed_tokens": "Prompt tokens whose KV this worker computed.",
        "prefix_hit_tokens": "Prompt tokens whose KV was loaded from the store instead.",
        "generated_tokens": "Output tokens produced.",
        "kv_bytes_loaded": "Bytes of KV loaded into the cache (prefill: from the store; decode: "
                           "streamed in by prefill workers).",
        "kv_bytes_stored": "Bytes of KV blocks put into the store.",
        "kv_bytes_sent": "Bytes of KV streamed to decode workers.",
        "prefix_evictions": "Stored prefix blocks found evicted (or unreadable) when loaded.",
        "requests": "Requests finished.",
        "requests_failed": "Requests that failed or were refused.",
        "preemptions": "Decode sequences preempted for lack of KV blocks.",
        "parked_blocks": "KV blocks of preempted sequences held in the store when parked.",
        "reloaded_blocks": "KV blocks of resumed sequences read back from the store.",
        "recomputed_tokens": "Tokens of resumed sequences whose KV was recomputed.",
        "write_behind_blocks": "Generated KV blocks a decode worker put into the store as they "
                               "filled (for another decode worker to take its requests over).",
        "pipelined_prefills": "Prefills this worker led as a pipeline of several workers' "
                              "layer stages.",
        "pipeline_fallbacks": "Pipelined prefills this worker ran alone because a stage was "
                              "busy, failed or gone.",
        "stage_bytes_sent": "Bytes the prefills this worker led handed to their stages "
                            "(hidden states and reused prefix slices).",
        "prefetches": "Prefetches started: a waiting request's stored prefix blocks pulled "
                      "into this worker's own segment before its prefill.",
        "prefetches_cancelled": "Prefetches stopped because their request left the queue.",
        "prefetched_blocks": "KV blocks prefetches gave a replica in this worker's own segment.",
        "write_behind_dropped_blocks": "Generated KV blocks not stored because the store was "
                                       "slower than the decode steps.",
    }

    def __init__(self, role: str, gauges: dict[str, Callable[[], float]]) -> None:
        self.role = role
        self.registry = new_registry()
        self._gauges = gauges
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(self.COUNTERS, 0.0)
        self._counters = {name: Counter(PREFIX + name, text, ["role"], registry=self.registry)
                          .labels(role) for name, text in self.COUNTERS.items()}
        self._steps = Summary(PREFIX + "step_seconds", "Time of one forward step.", ["role"],
                              registry=self.registry).labels(role)
        self._step_count = 0
        self._recent: deque[float] = deque(maxlen=32)
        self.registry.register(ScrapeCollector(self._collect_gauges))

    def add(self, name: str, value: float = 1) -> None:
        with self._lock:
            self._counts[name] += value
        self._counters[name].inc(value)

    def step(self, seconds: float) -> None:
        """One forward step (a prefill chunk or a decode step) took `seconds`."""
        with self._lock:
            self._step_count += 1
            self._recent.append(seconds)
        self._steps.observe(seconds)

    def steps(self) -> int:
        with self._lock:
            return self._step_count

    def recent_step_s(self) -> float:
        with self._lock:
            return sum(self._recent) / len(self._recent) if self._recent else 0.0

    def get(self, name: str) -> float:
        with self._lock:
            return self._counts[name]

    def hit_ratio(self) -> float:
        with self._lock:
            prompt = self._counts["prompt_tokens"]
            return self._counts["prefix_hit_tokens"] / prompt if prompt else 0.0

    def _collect_gauges(self) -> Iterator[Metric]:
        ratio = GaugeMetricFamily(PREFIX + "prefix_hit_ratio", "Prompt tokens served from "
                                  "the prefix cache, of all prompt tokens.", labels=["role"])
        ratio.add_metric([self.role], self.hit_ratio())
        yield ratio
        for name, read in self._gauges.items():
            g = GaugeMetricFamily(PREFIX + name, GAUGE_HELP.get(name, name.replace("_", " ")),
                                  labels=["role"])
            g.add_metric([self.role], float(read()))
            yield g

    def render(self) -> str:
        return render(self.registry)
