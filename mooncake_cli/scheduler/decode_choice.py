"""The decode choice: the live decode instance with KV room whose next step, with the request
added, is fastest; on a tie the one holding the fewest KV tokens, then the lowest name. The
requests counted and tokens held include bookings that no load report shows yet
(`InstanceState.load`, `held_tokens`), so a burst spreads over idle instances even where the
cost model's step time does not grow with them.

Found by walking the instances in (held tokens, name) order (`Cluster.decoders`):
a decode step takes no less time with a larger batch or more context (CostModel), so an
instance holding h tokens steps no faster than `decode_step_time(1, h + grown)`, and the walk
stops where that bound reaches the best step time found.
"""

from __future__ import annotations

import math

from mooncake_cli.scheduler.state import Cluster, InstanceState


def pick(cluster: Cluster, need: int, grown: int) -> tuple[InstanceState | None, float]:
    """The chosen instance with room for `need` more KV tokens and its step time; (None, inf)
    when none has room."""
    model = cluster.model
    best: InstanceState | None = None
    best_t = math.inf
    for inst in cluster.decoders.walk():
        held = inst.held_tokens()
        if best is not None and model.decode_step_time(1, held + grown) >= best_t:
            break  # it and every later one step no faster, and lose ties on the order
        cap = inst.kv_capacity_tokens
        if cap is not None and held + need > cap:
            continue
        t = model.decode_step_time(inst.load() + 1, held + grown)
        if t < best_t:
            best, best_t = inst, t
    return best, best_t
