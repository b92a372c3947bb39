"""upstream's protocol "rdma" here: there is no RDMA transport of our own, so it means the nixl
plugin where its UCX finds an RDMA device, and otherwise every available transport, with a
warning that names them (upstream's wheel also falls back to TCP without a device and returns 0).
Shared by the compat store's `setup` and the compat engine's `initialize`."""

from __future__ import annotations

import logging

from mooncake_cli.registry import Registry

log = logging.getLogger("mooncake.compat")


def _in_use(registry: Registry) -> str:
    """The transports `auto` picks among, best first (as the engine ranks them)."""
    found = sorted(registry.available("mooncake.transports"), key=lambda t: -t.priority)
    return ", ".join(t.name for t in found) or "none"


def rdma_transport(registry: Registry) -> str:
    """upstream's protocol "rdma": nixl where its UCX finds an RDMA device; otherwise "auto",
    with a warning naming why and the transports used instead (upstream, too, falls back to
    TCP without a device, and returns 0)."""
    try:
        nixl = registry.get("mooncake.transports", "nixl")
        fast = str(getattr(nixl, "fast", ""))
        why = "UCX (the nixl plugin) finds no RDMA device" + (f" (only {fast})" if fast else "")
    except Exception as e:  # a missing or broken plugin: the fallback below says so
        fast, why = "", f"the nixl plugin, the only RDMA path, is unavailable ({e})"
    if "RDMA" in fast:
        log.info("protocol rdma: nixl (%s)", fast)
        return "nixl"
    log.warning("protocol rdma: %s; transfers use %s instead (auto: the best per peer)",
                why, _in_use(registry))
    return "auto"
