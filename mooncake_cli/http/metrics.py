"""Prometheus for every role, through `prometheus_client`: one registry per role, a collector
reading gauges at scrape time, and the text a /metrics endpoint answers.

Label values (instance names come from workers) are escaped by `prometheus_client`, so a `"`
or a newline in a name cannot break a scrape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
disable_created_metrics()  # no `_created` series next to every counter


def number(value: float) -> str:
    """Exact Prometheus text: an integer as one (`:g` would round 1234567 to 1.23457e+06)."""
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return str(int(value))
    return repr(float(value))


class ScrapeCollector(Collector):
    """Metric families built by `collect_fn` at each scrape (gauges read from live state)."""

    def __init__(self, collect_fn: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect_fn

    def collect(self) -> Iterable[Metric]:
        return list(self._collect())


def new_registry() -> CollectorRegistry:
    """A role's own registry (never the process-global one: two roles may share a process)."""
    return CollectorRegistry(auto_describe=False)  # scrape collectors read state late


def render(registry: CollectorRegistry) -> str:
    """The registry's metrics as Prometheus text exposition format."""
    return generate_latest(registry).decode()
