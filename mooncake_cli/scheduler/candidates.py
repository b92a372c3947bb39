"""The prefill choice of `kvcache-centric` (Algorithm 1) and `cache-aware` without scoring every
instance: the same choice as scoring every live holder of a prefix plus the least queued live
instance holding none (lowest TTFT, then lowest name), found by visiting only the instances
that can still win.

An instance's estimate is its queue plus a cost that depends only on how many leading blocks
it holds (`Work`, computed once per length). Holders of a long prefix are few: each is scored
unless its queue alone puts it out of reach. Holders of a short, hot prefix may be most of the
cluster: they are walked in queue order (`Cluster.queues`). Among idle instances the estimate
of a length is exact and the lowest name wins, so one per length is scored and the walk leaves
the idle ones once no unseen length could win; among busy ones it stops where the queue plus
the cheapest remaining cost exceeds the best estimate found.

An instance with a bandwidth measured from the prefix's source (`Cluster.links`) fetches at
its own cost: those few are scored one by one and left out of the walks, whose bounds hold
for the cost model's bandwidth.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from itertools import filterfalse

from mooncake_cli.interfaces import ConfigError
from mooncake_cli.scheduler.estimate import Candidate, Work, work
from mooncake_cli.scheduler.prefix_match import PrefixMatch
from mooncake_cli.scheduler.state import Cluster, Request

SMALL = 16  # prefix levels held by more instances than this are walked, not listed
_REL = 1e-12  # float slack when a bound rules an instance out (sums round differently)


def _beyond(bound: float, top: Candidate | None) -> bool:
    """True when an estimate of at least `bound` can neither beat nor tie `top`."""
    return top is not None and bound > top.ttft_s * (1 + _REL) + 1e-15


def _better(c: Candidate, top: Candidate | None) -> bool:
    return top is None or c.ttft_s < top.ttft_s or (c.ttft_s == top.ttft_s and
                                                    c.instance < top.instance)


def first_at(idle: list[str], match: PrefixMatch, d: int) -> str | None:
    """The first of the sorted `idle` names holding exactly `d` leading blocks, among those
    not listed in `match.deep` (a lazy filter run by C: it stops at the first)."""
    levels = match.levels
    beyond = levels[d] if d < len(levels) else match.deep  # holding more; deep: listed
    names: Iterator[str] = iter(idle) if not d else filter(levels[d - 1].__contains__, idle)
    return next(filterfalse(beyond.__contains__, names), None)


def best_candidate(cluster: Cluster, req: Request, now: float,
                   threshold: float | None) -> Candidate:
    """The winning candidate: each instance reuses its local prefix or, with a `threshold`,
    fetches the longest one held anywhere as `estimate.work` decides. ConfigError when no
    prefill instance is live."""
    if not cluster.queues.live_count(now):
        raise ConfigError("no live prefill instance to schedule on")
    match = cluster.index.prefix_match(req.block_keys, SMALL)
    longest = match.longest()
    fetch = threshold if longest else None  # nothing held: nothing to fetch
    src = match.source() if fetch is not None and cluster.links else None
    linked = cluster.links.from_source(src) if src is not None else {}  # dest -> bytes/s
    plans: dict[int, Work] = {}
    costs: dict[int, float] = {}  # depth -> transfer + prefill: an idle instance's estimate

    def plan(d: int) -> Work:
        w = plans.get(d)
        if w is None:
            w = plans[d] = work(cluster, req, d, longest, fetch)
            costs[d] = w.transfer_s + w.prefill_s
        return w

    def cost(d: int) -> float:
        c = costs.get(d)
        return plan(d).transfer_s + plan(d).prefill_s if c is None else c

    top: Candidate | None = None
    by_name = cluster.by_name
    for name, bw in linked.items():
        inst = by_name.get(name)
        if inst is not None and inst.alive and inst.role == "prefill":
            d = match.depth(name)
            c = work(cluster, req, d, longest, fetch, bw).on(inst, now, src)
            if _better(c, top):
                top = c
    deep = []  # (a bound on its estimate, depth, instance), lowest bound first
    for name, d in match.deep.items():
        inst = by_name.get(name)
        if inst is not None and inst.alive and inst.role == "prefill" and name not in linked:
            b = inst.busy_until
            deep.append(((b - now if b > now else 0.0) + cost(d), d, inst))
    deep.sort(key=lambda x: x[0])
    for bound, d, inst in deep:
        if _beyond(bound, top):
            break
        c = plan(d).on(inst, now, None)
        if _better(c, top):
            top = c
    # the rest: holders of the wide levels, and the least queued instance holding nothing
    wide = match.wide_depths()  # 0: holding nothing
    seen: set[int] = set()  # depths settled: scored when idle, or hopeless
    idle = cluster.queues.idle(now)
    if linked:
        idle = [name for name in idle if name not in linked]
    for d in sorted(wide, key=cost):
        if top is not None and cost(d) > top.ttft_s:  # idle: the estimate is the cost
            seen.update(x for x in wide if cost(x) > top.ttft_s)  # hopeless when busy too
            break
        first = first_at(idle, match, d)
        if first is not None:  # later idle ones at this depth tie and lose on name
            seen.add(d)
            c = plan(d).on(by_name[first], now, None)
            if _better(c, top):
                top = c
    low = min((cost(d) for d in wide if d or 0 not in seen), default=None)
    for inst in cluster.queues.busy(now):
        if low is None or _beyond(inst.queue_time(now) + low, top):
            break
        if inst.name in match.deep or inst.name in linked:
            continue
        d = match.depth(inst.name)
        if d == 0:
            if 0 in seen:
                continue
            seen.add(0)
            low = min((cost(d) for d in wide if d), default=None)
        c = plan(d).on(inst, now, None)
        if _better(c, top):
            top = c
    assert top is not None  # some prefill instance is live
    if top.fetch_blocks and top.fetch_from is None:
        top = dataclasses.replace(top, fetch_from=match.source())
    return top
