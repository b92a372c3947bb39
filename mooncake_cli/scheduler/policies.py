"""Prefill placement policies behind one interface (`Policy.place`).

Every policy runs the request on the instance it picks, reusing the prefix that instance holds;
only `kvcache-centric` (and ours, in policy_ours.py) also fetch a longer prefix from another
instance. The choice is returned with the estimates behind it (`Placement`).
"""

from __future__ import annotations

import random
from typing import Protocol

from mooncake_cli.interfaces import ConfigError
from mooncake_cli.scheduler.candidates import best_candidate
from mooncake_cli.scheduler.estimate import Candidate, Placement, least_queued, local, with_fetch
from mooncake_cli.scheduler.state import Cluster, InstanceState, Request


class Policy(Protocol):
    """Picks the prefill instance of a request."""

    name: str

    def place(self, req: Request, cluster: Cluster, now: float,
              explain: bool = False) -> Placement:
        """The chosen instance and its estimates; all candidates when `explain`."""
        ...


def _live(cluster: Cluster) -> list[InstanceState]:
    insts = cluster.live_prefill()
    if not insts:
        raise ConfigError("no live prefill instance to schedule on")
    return insts


def _all_local(cluster: Cluster, insts: list[InstanceState], req: Request,
               now: float) -> tuple[Candidate, ...]:
    prefix = cluster.index.prefix_lengths(req.block_keys)
    return tuple(local(cluster, i, req, now, prefix.get(i.name, 0)) for i in insts)


def _placed(policy: str, cluster: Cluster, inst: InstanceState, req: Request, now: float,
            explain: bool, insts: list[InstanceState]) -> Placement:
    chosen = local(cluster, inst, req, now, cluster.index.prefix_len(inst.name, req.block_keys))
    return Placement(policy, chosen, _all_local(cluster, insts, req, now) if explain else ())


class RandomPolicy:
    """A uniformly random prefill instance (seeded)."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def place(self, req: Request, cluster: Cluster, now: float,
              explain: bool = False) -> Placement:
        insts = _live(cluster)
        return _placed(self.name, cluster, self._rng.choice(insts), req, now, explain, insts)


class RoundRobinPolicy:
    """Prefill instances in turn."""

    name = "round-robin"

    def __init__(self, seed: int = 0) -> None:
        self._next = 0

    def place(self, req: Request, cluster: Cluster, now: float,
              explain: bool = False) -> Placement:
        insts = _live(cluster)
        inst = insts[self._next % len(insts)]
        self._next += 1
        return _placed(self.name, cluster, inst, req, now, explain, insts)


class LeastLoadPolicy:
    """The least estimated queue time, blind to the cache.

    Ties (typically several idle instances) are broken at random (seeded): a fixed order would
    send every request of a quiet period to the same instance and so give a load balancer
    cache affinity by accident, which is what `cache-aware` is there to measure.
    """

    name = "least-load"

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def place(self, req: Request, cluster: Cluster, now: float,
              explain: bool = False) -> Placement:
        insts = _live(cluster)
        start = min(max(i.busy_until, now) for i in insts)
        tied = [i for i in insts if max(i.busy_until, now) == start]
        inst = tied[0] if len(tied) == 1 else self._rng.choice(tied)
        return _placed(self.name, cluster, inst, req, now, explain, insts)


def _holders(cluster: Cluster, prefix: dict[str, int]) -> list[tuple[InstanceState, int]]:
    """Live prefill instances holding a prefix, with its length in blocks."""
    out = []
    for name, n in prefix.items():
        inst = cluster.by_name.get(name)
        if inst is not None and inst.alive and inst.role == "prefill":
            out.append((inst, n))
    return out


def _best(cands: list[Candidate]) -> Candidate:
    return min(cands, key=lambda c: (c.ttft_s, c.instance))  # lowest name on ties


class CacheAwarePolicy:
    """Lowest TTFT = queue + prefill of what the instance does not hold locally."""

    name = "cache-aware"

    def __init__(self, seed: int = 0) -> None:
        pass

    def place(self, req: Request, cluster: Cluster, now: float,
              explain: bool = False) -> Placement:
        if not explain:  # instances holding nothing differ only by queue (candidates.py)
            return Placement(self.name, best_candidate(cluster, req, now, None))
        insts = _live(cluster)
        prefix = cluster.index.prefix_lengths(req.block_keys)
        cands = [local(cluster, i, req, now, prefix.get(i.name, 0)) for i in insts]
        return Placement(self.name, _best(cands), tuple(cands))


class KVCacheCentricPolicy:
    """Algorithm 1 of the Mooncake paper: per instance, TTFT = queue + prefill of the rest
    given its local prefix, or queue + transfer of the longest prefix held anywhere + prefill
    of the rest, when that prefix beats the local one by more than `threshold` (the ratio
    best / local prefix length) and fetching beats recomputing. The lowest TTFT wins; the
    chosen instance fetches the prefix, so hot blocks gain replicas."""

    name = "kvcache-centric"

    def __init__(self, seed: int = 0, threshold: float = 1.0) -> None:
        self.threshold = threshold

    def candidates(self, req: Request, cluster: Cluster, now: float, explain: bool,
                   prefix: dict[str, int] | None = None) -> list[Candidate]:
        """Each instance's best estimate (unless `explain`, only those holding a prefix, the
        least queued other one, and those with a bandwidth measured from the holder of the
        longest prefix); `prefix` is the index's prefix_lengths when known."""
        insts = _live(cluster)
        if prefix is None:
            prefix = cluster.index.prefix_lengths(req.block_keys)
        src, best = None, 0
        for name, n in prefix.items():
            if n > best or (n == best and src is not None and name < src):
                src, best = name, n
        t = self.threshold
        if explain:
            return [with_fetch(cluster, i, req, now, prefix.get(i.name, 0), best, src, t)
                    for i in insts]
        cands = [with_fetch(cluster, i, req, now, n, best, src, t)
                 for i, n in _holders(cluster, prefix)]
        other = least_queued(insts, now, prefix)
        if other is not None:
            cands.append(with_fetch(cluster, other, req, now, 0, best, src, t))
        for name in cluster.links.from_source(src):  # fetching at their own bandwidth
            inst = cluster.by_name.get(name)
            if inst is not None and inst.alive and inst.role == "prefill" \
                    and name not in prefix and inst is not other:
                cands.append(with_fetch(cluster, inst, req, now, 0, best, src, t))
        return cands

    def place(self, req: Request, cluster: Cluster, now: float,
              explain: bool = False) -> Placement:
        if not explain:  # the same choice, scoring only instances that can win
            return Placement(self.name, best_candidate(cluster, req, now, self.threshold))
        cands = self.candidates(req, cluster, now, explain)
        return Placement(self.name, _best(cands), tuple(cands))
