"""What no eviction policy can beat on a trace: Belady's optimum for a capacity (from the
future accesses) and the infinite cache.

Belady's MIN (with bypass) keeps the blocks used again soonest: on a miss with the cache full,
the block whose next use is farthest (the incoming one included: then it is not kept) goes. It
maximises per-block hits, so its per-block hit ratio bounds every policy's prefix-hit ratio
from above (a prefix hit is a block hit); its own prefix-hit ratio is reported beside it.
Accesses are taken one block at a time, in request order.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from mooncake_cli.store.eviction.replay import Outcome

NEVER = 1 << 62


def _next_uses(flat: Sequence[int]) -> list[int]:
    nxt = [NEVER] * len(flat)
    last: dict[int, int] = {}
    for t in range(len(flat) - 1, -1, -1):
        nxt[t] = last.get(flat[t], NEVER)
        last[flat[t]] = t
    return nxt


def belady(requests: Sequence[Sequence[int]], capacity: int) -> Outcome:
    """Belady's MIN on `requests` with room for `capacity` blocks."""
    flat = [h for ids in requests for h in ids]
    nxt = _next_uses(flat)
    due: dict[int, int] = {}  # held block -> its next use
    heap: list[tuple[int, int]] = []  # (-next use, block); stale entries skipped
    t = prefix = hits = evictions = 0
    for ids in requests:
        run = True
        for h in ids:
            n = nxt[t]
            t += 1
            if h in due:
                hits += 1
                prefix += run
            else:
                run = False
                if len(due) >= capacity:
                    while -heap[0][0] != due.get(heap[0][1]):
                        heapq.heappop(heap)
                    if -heap[0][0] <= n:
                        continue  # the incoming block is needed last: not kept
                    del due[heapq.heappop(heap)[1]]
                    evictions += 1
            due[h] = n
            heapq.heappush(heap, (-n, h))
    return Outcome("belady", capacity, len(requests), len(flat), prefix, hits, evictions)


def ceiling(requests: Sequence[Sequence[int]]) -> Outcome:
    """An infinite cache: every block seen before is found."""
    seen: set[int] = set()
    blocks = prefix = hits = 0
    for ids in requests:
        run = True
        for h in ids:
            blocks += 1
            if h in seen:
                hits += 1
                prefix += run
            else:
                run = False
        seen.update(ids)
    return Outcome("ceiling", 0, len(requests), blocks, prefix, hits)
