"""What vLLM reports after each engine step, turned into a worker's load and its /metrics
figures (mooncake_cli.worker.metrics: the native workers' names and meanings).

vLLM hands its stats to the stat loggers an AsyncLLM is made with, in this process; `logger_class`
is the one this worker adds. It stands in for vLLM's own Prometheus logger (vLLM adds that one
only when no logger of its class is given): vLLM 0.32's asserts that every connector of a
MultiConnector that reports stats also has Prometheus metrics, which MooncakeConnector has not,
and the failed assertion kills the engine's output loop. The worker serves its own /metrics.
"""

from __future__ import annotations

import threading
from typing import Any

from mooncake_cli.worker.metrics import WorkerMetrics

PD = "MooncakeConnector"
STORE = "MooncakeStoreConnector"


def _records(stats: Any, connector: str, field: str) -> list[Any]:
    """The list `field` of one connector's stats in a MultiConnector's report."""
    data = stats.get(connector) if isinstance(stats, dict) else None
    data = getattr(data, "data", data)
    values = data.get(field) if isinstance(data, dict) else None
    return list(values) if isinstance(values, list) else []


class EngineStats:
    """The latest scheduler state and the running totals of one engine (thread-safe: vLLM
    records on the HTTP loop's thread, /metrics and registration read from others)."""

    def __init__(self, role: str, metrics: WorkerMetrics) -> None:
        self.role, self.metrics = role, metrics
        self._lock = threading.Lock()
        self.running = self.waiting = 0
        self.kv_usage = 0.0
        self.token_bytes = 0  # KV bytes per token, set once the engine is up

    def record(self, scheduler: Any, iteration: Any) -> None:
        if scheduler is not None:
            with self._lock:
                self.running = int(scheduler.num_running_reqs)
                self.waiting = int(scheduler.num_waiting_reqs +
                                   getattr(scheduler, "num_skipped_waiting_reqs", 0))
                self.kv_usage = float(scheduler.kv_cache_usage)
            self._connectors(scheduler.kv_connector_stats)
        if iteration is not None:
            self._iteration(iteration)

    def _connectors(self, stats: Any) -> None:
        if not stats:
            return
        m = self.metrics
        m.add("kv_bytes_sent", sum(_records(stats, PD, "bytes_transferred")))
        m.add("kv_bytes_stored", sum(int(r["num_bytes"]) for r in
                                     _records(stats, STORE, "save_put")))
        if self.role == "prefill":  # the decode side counts what P sent it (below)
            m.add("kv_bytes_loaded", sum(int(r["num_bytes"]) for r in
                                         _records(stats, STORE, "load_get")))
        failed = sum(int(r["num_failed_keys"]) for r in _records(stats, STORE, "load_get"))
        if failed:  # stored prefix blocks gone when read (vLLM then recomputes them)
            m.add("prefix_evictions", failed)

    def _iteration(self, it: Any) -> None:
        m, pts = self.metrics, it.prompt_token_stats
        if self.role == "prefill":
            m.add("prompt_tokens", pts.total)
            m.add("computed_tokens", pts.computed)
            m.add("prefix_hit_tokens", pts.local_cache_hit + pts.external_kv_transfer)
        else:  # the prompt's KV came from the prefill worker
            m.add("kv_bytes_loaded", pts.external_kv_transfer * self.token_bytes)
        m.add("generated_tokens", it.num_generation_tokens)
        m.add("preemptions", it.num_preempted_reqs)
        for done in it.finished_requests:
            failed = str(getattr(done, "finish_reason", "")).lower().endswith(("abort", "error"))
            m.add("requests_failed" if failed else "requests")
        for gap in it.inter_token_latencies_iter:  # a decode step per token
            m.step(gap)

    def snapshot(self) -> tuple[int, int, float]:
        with self._lock:
            return self.running, self.waiting, self.kv_usage


def logger_class(sink: EngineStats) -> type:
    """A vLLM aggregate stat logger that passes every report to `sink`."""
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    class WorkerStatLogger(PrometheusStatLogger):
        def __init__(self, vllm_config: Any, engine_indexes: Any = None) -> None:
            pass  # nothing of vLLM's Prometheus registry: see the module's docstring

        def record(self, scheduler_stats: Any, iteration_stats: Any,
                   mm_cache_stats: Any = None, engine_idx: Any = 0) -> None:
            sink.record(scheduler_stats, iteration_stats)

        def record_sleep_state(self, sleep: int = 0, level: int = 0) -> None:
            pass

        def record_admission_rejection(self, reason: str) -> None:
            pass

        def log_engine_initialized(self) -> None:
            pass

        def log(self) -> None:
            pass

    return WorkerStatLogger
