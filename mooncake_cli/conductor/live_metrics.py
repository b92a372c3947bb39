"""The live conductor's Prometheus metrics: counters, TTFT/TBT histograms, per-instance load.

Cache load balancing shows in two counters: `blocks_fetched_total`, the blocks the scheduler
chose to have a prefill instance fetch from another one (its decision), and
`blocks_replicated_total`, the fetched blocks that then gained a replica in the fetching
instance's own store segment (what the prefill answers report as "replicated_keys").
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from typing import Any

from mooncake_cli.prometheus import number

PREFIX = "mooncake_conductor_"
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TBT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 1, 2.5)


class Histogram:
    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0
        self.n = 0

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, v)] += 1
        self.sum += v
        self.n += 1

    def lines(self, name: str) -> list[str]:
        out, acc = [], 0
        for le, c in zip((*self.buckets, "+Inf"), self.counts, strict=True):
            acc += c
            out.append(f'{name}_bucket{{le="{le}"}} {acc}')
        out += [f"{name}_sum {self.sum}", f"{name}_count {self.n}"]
        return out


class ConductorMetrics:
    """Thread-safe counters; `render(instances)` gives the /metrics text."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters: dict[str, float] = {
            "requests_total": 0, "rejected_total": 0, "errors_total": 0,
            "rerouted_total": 0, "prompt_tokens_total": 0, "prefix_hit_tokens_total": 0,
            "completion_tokens_total": 0, "blocks_fetched_total": 0,
            "blocks_replicated_total": 0}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tbt = Histogram(TBT_BUCKETS)

    def add(self, name: str, v: float = 1) -> None:
        with self._lock:
            self.counters[name] += v

    def observe(self, ttft: float | None = None, gaps: Sequence[float] = ()) -> None:
        with self._lock:
            if ttft is not None:
                self.ttft.observe(ttft)
            for g in gaps:
                self.tbt.observe(g)

    def hit_ratio(self) -> float:
        with self._lock:
            p = self.counters["prompt_tokens_total"]
            return self.counters["prefix_hit_tokens_total"] / p if p else 0.0

    def render(self, instances: list[dict[str, Any]]) -> str:
        with self._lock:
            lines = []
            for name, v in self.counters.items():
                lines += [f"# TYPE {PREFIX}{name} counter", f"{PREFIX}{name} {number(v)}"]
            for name, h in (("ttft_seconds", self.ttft), ("tbt_seconds", self.tbt)):
                lines.append(f"# TYPE {PREFIX}{name} histogram")
                lines += h.lines(PREFIX + name)
            p = self.counters["prompt_tokens_total"]
            ratio = self.counters["prefix_hit_tokens_total"] / p if p else 0.0
        lines += [f"# TYPE {PREFIX}prefix_hit_ratio gauge",
                  f"{PREFIX}prefix_hit_ratio {number(ratio)}",
                  f"# TYPE {PREFIX}instance_alive gauge",
                  f"# TYPE {PREFIX}instance_running gauge"]
        for i in instances:
            label = f'{{name="{i["name"]}",role="{i["role"]}"}}'
            lines.append(f"{PREFIX}instance_alive{label} {int(i['alive'])}")
            running = i["load"].get("running", 0) if isinstance(i["load"], dict) else 0
            lines.append(f"{PREFIX}instance_running{label} {running}")
        return "\n".join(lines) + "\n"
