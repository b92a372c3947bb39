"""Reading /metrics the way Prometheus does: through `prometheus_client.parser`."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """(sample name, labels) -> value of every sample; a malformed scrape raises ValueError."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(text: str, metric: str, **labels: str) -> float:
    """The value of sample `metric` with exactly `labels`; KeyError when it is absent."""
    return samples(text)[(metric, frozenset(labels.items()))]


def helps(text: str) -> dict[str, str]:
    """Metric family name -> its HELP text."""
    return {f.name: f.documentation for f in text_string_to_metric_families(text)}
