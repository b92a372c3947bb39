"""A trace's KV-block accesses replayed through a real `StoreMaster` under one eviction policy.

Each request does what a prefill worker does (worker/prefix.py): one `batch_exists` over its
blocks in order (a lease on each found), then `batch_put_start` / `batch_put_end` of the blocks
it did not find. The master holds `capacity` blocks on one DRAM segment, with the high watermark
at 1.0 and one block evicted at a time, so capacity is exact and every victim is the policy's
choice (leased blocks of the request itself excepted, as in serving). The clock moves two lease
lengths per request: a lease covers its own request only.

Reported: the prefix-hit ratio (per request, the longest run of leading blocks found; a block
behind a miss does not count), over all blocks of all requests, and the plain per-block ratio.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from mooncake_cli.interfaces import EvictionPolicy
from mooncake_cli.store.errors import StoreError
from mooncake_cli.store.master import StoreMaster
from mooncake_cli.store.records import Mount

BLOCK_BYTES = 64  # one trace block as the master stores it: room is counted in blocks
LEASE_S = 1.0


@dataclass(frozen=True)
class Outcome:
    """What one policy (or bound) achieved on one capacity."""

    policy: str
    capacity: int  # blocks
    requests: int
    blocks: int  # block accesses
    prefix_hits: int
    block_hits: int
    evictions: int = 0
    refused: int = 0  # blocks a put could not place (everything else leased)

    @property
    def prefix_hit_ratio(self) -> float:
        return self.prefix_hits / self.blocks if self.blocks else 0.0

    @property
    def block_hit_ratio(self) -> float:
        return self.block_hits / self.blocks if self.blocks else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "prefix_hit_ratio": self.prefix_hit_ratio,
                "block_hit_ratio": self.block_hit_ratio}


def leading(found: Sequence[object]) -> int:
    """How many of `found` from the start are True."""
    n = 0
    for f in found:
        if f is not True:
            break
        n += 1
    return n


def replay(requests: Sequence[Sequence[int]], policy: str | EvictionPolicy, capacity: int,
           progress: Callable[[int, int], None] | None = None) -> Outcome:
    """Replay `requests` (each its block ids, in prefix order) through a master of `capacity`
    blocks evicting by `policy`; `progress(done, total)` now and then."""
    if capacity < 1:
        raise ValueError(f"capacity must be at least one block, not {capacity}")
    clock = [0.0]
    master = StoreMaster(now=lambda: clock[0], lease_ttl=LEASE_S, client_ttl=1e12,
                         high_watermark=1.0, eviction_ratio=1e-12, eviction=policy)
    master.mount_segment(Mount("replay", "replay", "localhost", 0, capacity * BLOCK_BYTES))
    blocks = prefix = hits = refused = 0
    for i, ids in enumerate(requests):
        clock[0] = i * 2 * LEASE_S
        keys = [str(h) for h in ids]
        found = master.batch_exists(keys)
        blocks += len(keys)
        prefix += leading(found)
        hits += sum(1 for f in found if f is True)
        missing = [k for k, f in zip(keys, found, strict=True) if f is not True]
        if missing:
            started = master.batch_put_start(missing, [BLOCK_BYTES] * len(missing))
            placed = [k for k, r in zip(missing, started, strict=True)
                      if not isinstance(r, StoreError)]
            refused += len(missing) - len(placed)
            master.batch_put_end(placed)
        if progress is not None and (i % 500 == 0 or i + 1 == len(requests)):
            progress(i + 1, len(requests))
    stats = master.stats()
    return Outcome(stats.policy, capacity, len(requests), blocks, prefix, hits,
                   stats.evictions, refused)
