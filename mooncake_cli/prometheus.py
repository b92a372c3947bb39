"""Shared bits of the Prometheus text format every role's /metrics writes."""

from __future__ import annotations


def number(value: float) -> str:
    """Exact Prometheus text: an integer as one (`:g` would round 1234567 to 1.23457e+06)."""
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return str(int(value))
    return repr(float(value))
