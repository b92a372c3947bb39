"""WorkerMetrics: counters and gauges of one worker, rendered as Prometheus text."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from mooncake_cli.prometheus import number


class WorkerMetrics:
    """Thread-safe counters; gauges are read from callables when rendered."""

    COUNTERS = {
        "prompt_tokens": "Prompt tokens received.",
        "computed_tokens": "Prompt tokens whose KV this worker computed.",
        "prefix_hit_tokens": "Prompt tokens whose KV was loaded from the store instead.",
        "generated_tokens": "Output tokens produced.",
        "kv_bytes_loaded": "Bytes of KV loaded into the cache (prefill: from the store; decode: "
                           "streamed in by prefill workers).",
        "kv_bytes_stored": "Bytes of KV blocks put into the store.",
        "kv_bytes_sent": "Bytes of KV streamed to decode workers.",
        "requests": "Requests finished.",
        "requests_failed": "Requests that failed or were refused.",
    }

    def __init__(self, role: str, gauges: dict[str, Callable[[], float]]) -> None:
        self.role = role
        self._gauges = gauges
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(self.COUNTERS, 0.0)
        self._step_sum = 0.0
        self._step_count = 0
        self._recent: deque[float] = deque(maxlen=32)

    def add(self, name: str, value: float = 1) -> None:
        with self._lock:
            self._counts[name] += value

    def step(self, seconds: float) -> None:
        """One forward step (a prefill chunk or a decode step) took `seconds`."""
        with self._lock:
            self._step_sum += seconds
            self._step_count += 1
            self._recent.append(seconds)

    def steps(self) -> int:
        with self._lock:
            return self._step_count

    def recent_step_s(self) -> float:
        with self._lock:
            return sum(self._recent) / len(self._recent) if self._recent else 0.0

    def get(self, name: str) -> float:
        with self._lock:
            return self._counts[name]

    def render(self) -> str:
        label = f'{{role="{self.role}"}}'
        lines = []
        with self._lock:
            counts = dict(self._counts)
            step_sum, step_count = self._step_sum, self._step_count
        for name, help_text in self.COUNTERS.items():
            metric = f"mooncake_worker_{name}_total"
            lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} counter",
                      f"{metric}{label} {number(counts[name])}"]
        metric = "mooncake_worker_step_seconds"
        lines += [f"# HELP {metric} Time of one forward step.", f"# TYPE {metric} summary",
                  f"{metric}_sum{label} {step_sum:.6f}", f"{metric}_count{label} {step_count}"]
        for name, read in self._gauges.items():
            metric = f"mooncake_worker_{name}"
            lines += [f"# TYPE {metric} gauge", f"{metric}{label} {number(read())}"]
        return "\n".join(lines) + "\n"

