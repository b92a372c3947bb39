"""The master's HTTP side port: `GET /health` and Prometheus `GET /metrics`.

    server = MetricsServer(master, "127.0.0.1", 9003).start()   # port 0 picks a free one
    server.url      # http://127.0.0.1:PORT/metrics
    server.close()

/metrics is Prometheus' text exposition format (version 0.0.4), built from `StoreMaster.stats()`
at each scrape: gauges for objects, pending puts, clients, and per tier (label `tier`) segments,
objects, bytes used, resident bytes and capacity; counters for hits, misses, evictions, puts and
gets since the master started; the eviction policy (`eviction_policy{policy=...} 1`), hits and
misses labelled with it, evictions by cause and bytes copied by kind (`replica`: between nodes;
`offload`, `promote`: between the tiers of one node). /health answers 200 {"status":"ok"} while
the server runs; any other path 404.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

from mooncake_cli.httpserve import BackgroundHTTPServer
from mooncake_cli.store.records import COPY_KINDS, EVICTION_CAUSES, StoreStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "mooncake_store_"


def render(stats: StoreStats) -> str:
    """`stats` in Prometheus text exposition format (ends with a newline)."""
    lines: list[str] = []

    def metric(name: str, kind: str, help_: str,
               samples: list[tuple[dict[str, str], int]]) -> None:
        full = PREFIX + name
        lines.append(f"# HELP {full} {help_}")
        lines.append(f"# TYPE {full} {kind}")
        for labels, value in samples:
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(f"{full}{{{text}}} {value}" if text else f"{full} {value}")

    tiers = sorted(stats.tiers.items())
    metric("objects", "gauge", "Objects with every replica written.", [({}, stats.objects)])
    metric("pending_puts", "gauge", "Puts started and not yet ended.", [({}, stats.pending)])
    metric("clients", "gauge", "Clients known to the master.", [({}, stats.clients)])
    metric("segments", "gauge", "Mounted segments per tier.",
           [({"tier": t}, s.segments) for t, s in tiers])
    metric("tier_objects", "gauge", "Objects with a complete replica on the tier.",
           [({"tier": t}, s.objects) for t, s in tiers])
    metric("bytes_used", "gauge", "Allocated bytes per tier (alignment and pending puts "
           "included).", [({"tier": t}, s.bytes_used) for t, s in tiers])
    metric("capacity_bytes", "gauge", "Mounted bytes per tier.",
           [({"tier": t}, s.capacity) for t, s in tiers])
    counters = (
        ("hits_total", stats.hits, "Replica-list requests that found a complete object."),
        ("misses_total", stats.misses, "Replica-list requests for a missing or unfinished object."),
        ("evictions_total", stats.evictions, "Objects evicted."),
        ("puts_total", stats.puts, "Puts ended (made complete)."),
        ("gets_total", stats.gets, "Replica-list requests served."))
    for name, value, help_ in counters:
        metric(name, "counter", help_, [({}, value)])
    _policy_metrics(stats, metric)
    return "\n".join(lines) + "\n"


def _policy_metrics(stats: StoreStats, metric: Callable[..., None]) -> None:
    tiers = sorted(stats.tiers.items())
    metric("resident_bytes", "gauge", "Bytes of the complete replicas per tier.",
           [({"tier": t}, s.resident_bytes) for t, s in tiers])
    if not stats.policy:
        return
    pol = {"policy": stats.policy}
    metric("eviction_policy", "gauge", "The eviction policy the master runs (always 1).",
           [(pol, 1)])
    metric("policy_hits_total", "counter", "Replica-list requests that found a complete "
           "object, by eviction policy.", [(pol, stats.hits)])
    metric("policy_misses_total", "counter", "Replica-list requests for a missing or unfinished "
           "object, by eviction policy.", [(pol, stats.misses)])
    causes = [*EVICTION_CAUSES, *sorted(set(stats.evicted_by) - set(EVICTION_CAUSES))]
    metric("evictions_by_cause_total", "counter", "Evictions by cause: room for a put, above "
           "the high watermark, an evict request, room on one segment for a promotion or a "
           "replica, room on a full SSD tier.",
           [({**pol, "cause": c}, stats.evicted_by.get(c, 0)) for c in causes])
    metric("copied_bytes_total", "counter", "Bytes copied on the master's orders: replica "
           "(added on another node), offload and promote (between the tiers of one node).",
           [({"kind": k}, stats.copied_bytes.get(k, 0)) for k in COPY_KINDS])


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _handler(stats: Callable[[], StoreStats]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _reply(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            path = urllib.parse.urlsplit(self.path).path
            if path == "/health":
                self._reply(200, json.dumps({"status": "ok"}).encode(), "application/json")
            elif path == "/metrics":
                try:
                    body = render(stats()).encode()
                except Exception as e:  # a scrape must not kill the thread; say what failed
                    self._reply(500, f"stats failed: {type(e).__name__}: {e}\n".encode(),
                                "text/plain; charset=utf-8")
                    return
                self._reply(200, body, CONTENT_TYPE)
            else:
                self._reply(404, b"not found: try /metrics or /health\n",
                            "text/plain; charset=utf-8")

        do_HEAD = do_GET  # noqa: N815

    return Handler


class MetricsServer(BackgroundHTTPServer):
    """Serves /metrics and /health for `stats` (e.g. `StoreMaster.stats`) on http://HOST:PORT."""

    def __init__(self, stats: Callable[[], StoreStats], host: str = "127.0.0.1",
                 port: int = 9003) -> None:
        super().__init__(host, port, _handler(stats), "mooncake-store-metrics")
        self.url = f"http://{self.host}:{self.port}/metrics"
