"""The floor under our nixl transport: the same NIXL agent, peer and registered memory driven
through NIXL's Python API with no engine on top (one transfer in flight, busy-polled), so the
table shows what the engine costs and what UCX itself reaches on this host."""

from __future__ import annotations

import threading
import time
from typing import Any

from mooncake_cli.bench.stats import Progress, Result, pump, summarize
from mooncake_cli.interfaces import TransferError


def measure(engine: Any, region: Any, target: str, op: str, block: int, duration: float,
            progress: Progress | None = None, label: str = "nixl api") -> Result:
    """Move `block` bytes between `region` and `target` (both registered with nixl) for
    `duration` seconds with bare NIXL calls, then read one block back to verify."""
    ep = engine.endpoints.by_name["nixl"]
    peer = engine._peer(target)
    ch = peer.acquire()
    try:
        rbase = peer.desc.regions[0].base
        lmem, laddr, ldev = ep.local(region)
        rmem, raddr, rdev = ch._remote(rbase, block)
        remote = ch.remote
    finally:
        peer.release(ch)
    agent = ep.agent
    kind = "READ" if op == "read" else "WRITE"
    lat: list[float] = []
    span = [0.0, 0.0]
    errors: list[str] = []
    done = threading.Event()

    def one(kind: str) -> None:
        h = agent.initialize_xfer(kind, agent.get_xfer_descs([(laddr, block, ldev)], lmem),
                                  agent.get_xfer_descs([(raddr, block, rdev)], rmem), remote)
        st = agent.transfer(h)
        while st == "PROC":
            st = agent.check_xfer_state(h)
        h.release()
        if st != "DONE":
            raise TransferError(f"nixl {kind} ended {st}")

    def loop() -> None:
        clock = time.perf_counter
        try:
            now = span[0] = clock()
            deadline = now + duration
            while now < deadline:
                one(kind)
                end = clock()
                lat.append(end - now)
                now = end
            span[1] = now
        except Exception as e:  # reported below
            errors.append(f"{type(e).__name__}: {e}")
        finally:
            done.set()

    th = threading.Thread(target=loop, name="bench-nixl-api", daemon=True)
    th.start()
    pump(done.is_set, duration, label, progress)
    th.join()
    if errors:
        raise TransferError(f"the bare NIXL loop failed: {errors[0]}")
    view = region.view
    pattern = bytes(range(256)) * (block // 256) + bytes(block % 256)
    view[:block] = pattern
    one("WRITE")
    view[:block] = bytes(block)
    one("READ")
    ok = bytes(view[:block]) == pattern
    return summarize("nixl api", "nixl", op, block, 1, 1, len(lat) * block, len(lat),
                     span[1] - span[0], lat, ok, "bare NIXL calls, same agent and peer")
