"""The master's HTTP side port: `GET /health` and Prometheus `GET /metrics`.

    server = MetricsServer(master, "127.0.0.1", 9003).start()   # port 0 picks a free one
    server.url      # http://127.0.0.1:PORT/metrics
    server.close()

/metrics is Prometheus' text exposition format (version 0.0.4), built by `prometheus_client`
from `StoreMaster.stats()` at each scrape (its own registry): the hit ratio; gauges for objects,
pending puts, clients, and per tier (label `tier`) segments, objects, bytes used, resident bytes
and capacity; counters for hits, misses, evictions, puts and gets since the master started; the
eviction policy (`eviction_policy{policy=...} 1`), hits and misses labelled with it, evictions by
cause and bytes copied by kind (`replica`: between nodes; `offload`, `promote`: between the
tiers of one node). /health answers 200 {"status":"ok"} while the server runs; any other path
404.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mooncake_cli.http.metrics import CONTENT_TYPE, ScrapeCollector, new_registry
from mooncake_cli.http.metrics import render as render_registry
from mooncake_cli.http.server import Limits, Server, edge_app, text_response
from mooncake_cli.store.records import COPY_KINDS, EVICTION_CAUSES, StoreStats

__all__ = ["CONTENT_TYPE", "MetricsServer", "render"]
PREFIX = "mooncake_store_"
Samples = list[tuple[dict[str, str], float]]


def families(stats: StoreStats) -> Iterator[Metric]:
    """The metric families of one `stats` snapshot."""

    def metric(name: str, kind: str, help_: str, samples: Samples) -> Metric:
        family: Metric
        labels = list(samples[0][0]) if samples else []  # one set of label names a family
        if kind == "counter":
            family = CounterMetricFamily(PREFIX + name.removesuffix("_total"), help_,
                                         labels=labels)
        else:
            family = GaugeMetricFamily(PREFIX + name, help_, labels=labels)
        for lab, value in samples:
            family.add_metric([lab[k] for k in labels], value)
        return family

    tiers = sorted(stats.tiers.items())
    looked = stats.hits + stats.misses
    yield metric("hit_ratio", "gauge", "Replica-list requests that found a complete object, "
                 "of all (0 before the first).", [({}, stats.hits / looked if looked else 0.0)])
    yield metric("objects", "gauge", "Objects with every replica written.",
                 [({}, stats.objects)])
    yield metric("pending_puts", "gauge", "Puts started and not yet ended.",
                 [({}, stats.pending)])
    yield metric("clients", "gauge", "Clients known to the master.", [({}, stats.clients)])
    yield metric("segments", "gauge", "Mounted segments per tier.",
                 [({"tier": t}, s.segments) for t, s in tiers])
    yield metric("tier_objects", "gauge", "Objects with a complete replica on the tier.",
                 [({"tier": t}, s.objects) for t, s in tiers])
    yield metric("bytes_used", "gauge", "Allocated bytes per tier (alignment and pending puts "
                 "included).", [({"tier": t}, s.bytes_used) for t, s in tiers])
    yield metric("capacity_bytes", "gauge", "Mounted bytes per tier.",
                 [({"tier": t}, s.capacity) for t, s in tiers])
    counters = (
        ("hits_total", stats.hits, "Replica-list requests that found a complete object."),
        ("misses_total", stats.misses, "Replica-list requests for a missing or unfinished object."),
        ("evictions_total", stats.evictions, "Objects evicted."),
        ("puts_total", stats.puts, "Puts ended (made complete)."),
        ("gets_total", stats.gets, "Replica-list requests served."))
    for name, value, help_ in counters:
        yield metric(name, "counter", help_, [({}, value)])
    yield from _policy_metrics(stats, metric)


def _policy_metrics(stats: StoreStats, metric: Callable[..., Metric]) -> Iterator[Metric]:
    tiers = sorted(stats.tiers.items())
    yield metric("resident_bytes", "gauge", "Bytes of the complete replicas per tier.",
                 [({"tier": t}, s.resident_bytes) for t, s in tiers])
    yield metric("copied_bytes_total", "counter", "Bytes copied on the master's orders: "
                 "replica (added on another node), offload and promote (between the tiers of "
                 "one node).", [({"kind": k}, stats.copied_bytes.get(k, 0)) for k in COPY_KINDS])
    if not stats.policy:
        return
    pol = {"policy": stats.policy}
    yield metric("eviction_policy", "gauge", "The eviction policy the master runs (always 1).",
                 [(pol, 1)])
    yield metric("policy_hits_total", "counter", "Replica-list requests that found a complete "
                 "object, by eviction policy.", [(pol, stats.hits)])
    yield metric("policy_misses_total", "counter", "Replica-list requests for a missing or "
                 "unfinished object, by eviction policy.", [(pol, stats.misses)])
    causes = [*EVICTION_CAUSES, *sorted(set(stats.evicted_by) - set(EVICTION_CAUSES))]
    yield metric("evictions_by_cause_total", "counter", "Evictions by cause: room for a put, "
                 "above the high watermark, an evict request, room on one segment for a "
                 "promotion or a replica, room on a full SSD tier.",
                 [({**pol, "cause": c}, stats.evicted_by.get(c, 0)) for c in causes])


def render(stats: StoreStats) -> str:
    """`stats` in Prometheus text exposition format (ends with a newline)."""
    registry = new_registry()
    registry.register(ScrapeCollector(lambda: families(stats)))
    return render_registry(registry)


class MetricsServer:
    """Serves /metrics and /health for `stats` (e.g. `StoreMaster.stats`) on http://HOST:PORT.
    Binds at construction (port 0 picks a free one); serves once `start`ed, until `close`."""

    def __init__(self, stats: Callable[[], StoreStats], host: str = "127.0.0.1",
                 port: int = 9003) -> None:
        registry = new_registry()
        registry.register(ScrapeCollector(lambda: families(stats())))

        async def health(request: Request) -> Response:
            return JSONResponse({"status": "ok"})

        async def metrics(request: Request) -> Response:
            return text_response(render_registry(registry))

        app = edge_app([Route("/health", health), Route("/metrics", metrics)], Limits(max_body=0))
        self._server = Server(app, host, port, "mooncake-store-metrics")
        self.host, self.port = self._server.host, self._server.port
        self.url = f"http://{self.host}:{self.port}/metrics"

    def start(self) -> MetricsServer:
        self._server.start()
        return self

    def close(self) -> None:
        self._server.close()
