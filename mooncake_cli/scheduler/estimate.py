"""Per-candidate TTFT estimates: the records every policy builds its choice and explanation on."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from mooncake_cli.scheduler.costmodel import transfer_time
from mooncake_cli.scheduler.state import Cluster, InstanceState, Request


@dataclass(frozen=True)
class Weighed:
    """Fetching a longer prefix against recomputing it, as `work` weighed them: transfer +
    prefill of the rest (`fetch_s`) and prefill of the rest from the local prefix
    (`recompute_s`), over a link of `bandwidth` bytes/s, measured or the cost model's."""

    fetch_s: float
    recompute_s: float
    bandwidth: float
    measured: bool

    def to_dict(self, fetched: bool) -> dict[str, Any]:
        return {"fetch_s": round(self.fetch_s, 6), "recompute_s": round(self.recompute_s, 6),
                "bandwidth": round(self.bandwidth, 1), "measured": self.measured,
                "choice": "fetch" if fetched else "recompute"}


@dataclass(frozen=True)
class Candidate:
    """One prefill instance as a policy saw it: TTFT = queue + transfer + prefill."""

    instance: str
    queue_s: float
    local_blocks: int  # leading blocks of the request already on the instance
    fetch_blocks: int  # leading blocks it would hold after fetching (0: no fetch)
    fetch_from: str | None
    transfer_s: float
    prefill_s: float
    ttft_s: float
    stages: tuple[str, ...] = ()  # other instances running pipeline stages of this prefill
    chunk_tokens: int = 0  # tokens per chunk handed between the stages (with stages)
    weighed: Weighed | None = None  # when fetching a longer prefix was weighed

    @property
    def prefix_blocks(self) -> int:
        """Blocks the prefill will reuse: fetched or local."""
        return max(self.fetch_blocks, self.local_blocks)

    @property
    def remote_blocks(self) -> int:
        """Blocks the prefill will read from other segments (0: it reuses only its own)."""
        return max(0, self.fetch_blocks - self.local_blocks)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("queue_s", "transfer_s", "prefill_s", "ttft_s"):
            d[k] = round(d[k], 6)
        del d["weighed"]
        if self.weighed is not None:
            d["fetch_or_recompute"] = self.weighed.to_dict(self.fetch_blocks > 0)
        return d


@dataclass(frozen=True)
class Placement:
    """A policy's answer: the chosen candidate and, when asked to explain, all it weighed."""

    policy: str
    chosen: Candidate
    candidates: tuple[Candidate, ...] = ()
    single: Candidate | None = None  # when a pipeline is chosen: the best single instance


@dataclass(frozen=True)
class Work:
    """What a prefill costs an instance holding `local_blocks` of the prompt, queue aside:
    the prefix it fetches (`fetch_blocks`, 0: none), the transfer and the prefill."""

    local_blocks: int
    fetch_blocks: int
    transfer_s: float
    prefill_s: float
    weighed: Weighed | None = None

    def on(self, inst: InstanceState, now: float, source: str | None) -> Candidate:
        """The candidate of `inst` doing this work after its queue (`source` fetched from)."""
        q = inst.queue_time(now)
        if not self.fetch_blocks:
            return Candidate(inst.name, q, self.local_blocks, 0, None, 0.0, self.prefill_s,
                             q + self.prefill_s, (), 0, self.weighed)
        return Candidate(inst.name, q, self.local_blocks, self.fetch_blocks, source,
                         self.transfer_s, self.prefill_s, q + self.transfer_s + self.prefill_s,
                         (), 0, self.weighed)


def work(cluster: Cluster, req: Request, local_blocks: int, remote_blocks: int = 0,
         threshold: float | None = None, bandwidth: float | None = None) -> Work:
    """Reuse the `local_blocks` held, or -- with a `threshold` -- fetch the longer prefix
    of `remote_blocks` when it beats the local one by more than `threshold` (remote / local
    blocks, Algorithm 1's kvcache_balancing_threshold) and fetching it over a link of
    `bandwidth` bytes/s (measured; None: the cost model's) is faster than recomputing it."""
    n = req.input_tokens
    pre = cluster.model.prefill_time(n, cluster.cached_tokens(n, local_blocks))
    if (threshold is None or remote_blocks <= local_blocks
            or (local_blocks and remote_blocks / local_blocks <= threshold)):
        return Work(local_blocks, 0, 0.0, pre)
    have = cluster.cached_tokens(n, local_blocks)
    get = cluster.cached_tokens(n, remote_blocks)
    xfer = transfer_time(cluster.model, get - have, bandwidth)
    fetched = cluster.model.prefill_time(n, get)
    weighed = Weighed(xfer + fetched, pre, bandwidth or cluster.model.bandwidth,
                      bandwidth is not None)
    if xfer + fetched >= pre:
        return Work(local_blocks, 0, 0.0, pre, weighed)
    return Work(local_blocks, remote_blocks, xfer, fetched, weighed)


def local(cluster: Cluster, inst: InstanceState, req: Request, now: float,
          local_blocks: int) -> Candidate:
    """Run on `inst`, reusing only what it holds."""
    return work(cluster, req, local_blocks).on(inst, now, None)


def with_fetch(cluster: Cluster, inst: InstanceState, req: Request, now: float,
               local_blocks: int, remote_blocks: int, source: str | None,
               threshold: float) -> Candidate:
    """Run on `inst`, fetching the longer prefix from `source` as `work` decides (over the
    bandwidth measured from `source` to `inst` when there is one)."""
    if source is None or source == inst.name:
        return local(cluster, inst, req, now, local_blocks)
    bw = cluster.links.get(source, inst.name)
    return work(cluster, req, local_blocks, remote_blocks, threshold, bw).on(inst, now, source)


def least_queued(insts: list[InstanceState], now: float,
                 skip: dict[str, int] | None = None) -> InstanceState | None:
    """The instance with the least estimated queue time (lowest name on ties), outside
    `skip`."""
    best: InstanceState | None = None
    best_t = 0.0
    for inst in insts:
        if skip and inst.name in skip:
            continue
        t = inst.busy_until if inst.busy_until > now else now
        if best is None or t < best_t or (t == best_t and inst.name < best.name):
            best, best_t = inst, t
    return best
