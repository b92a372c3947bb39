"""Direct or through a relay: the time each path would take a transfer, from measured links.

Direct: latency + size / bandwidth of the link to the target. Through relay B, the data is
staged in B in chunks and forwarded while the next chunk comes (pipelined): both hops'
latencies, plus size over the slower hop's bandwidth, plus one chunk over the faster hop
(the pipeline filling), plus a control round trip to B per chunk. A relay is taken only when
its estimate beats the direct one by MARGIN (a measurement error should not send data the
long way), and only for transfers of at least MIN_RELAY bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MARGIN = 0.1
MIN_RELAY = 8 << 20


@dataclass(frozen=True)
class Link:
    """A measured link: bytes per second and seconds of one small round trip."""

    bandwidth: float
    latency: float = 0.0

    def seconds(self, size: int) -> float:
        return self.latency + size / self.bandwidth if self.bandwidth > 0 else float("inf")


@dataclass(frozen=True)
class Plan:
    """The path chosen (`via`: a relay's name, or None for direct) and every estimate."""

    via: str | None
    direct_s: float
    relay_s: Mapping[str, float] = field(default_factory=dict)
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"via": self.via, "direct_s": self.direct_s, "relay_s": dict(self.relay_s),
                "why": self.why}


def two_hop_seconds(size: int, first: Link, second: Link, chunk: int) -> float:
    """Estimated seconds to move `size` bytes over `first` then `second`, pipelined in
    `chunk`-byte pieces."""
    if first.bandwidth <= 0 or second.bandwidth <= 0:
        return float("inf")
    slow = min(first.bandwidth, second.bandwidth)
    fast = max(first.bandwidth, second.bandwidth)
    chunks = max(1, -(-size // chunk))
    return (first.latency + second.latency + size / slow + min(chunk, size) / fast
            + chunks * first.latency)


def choose(size: int, direct: Link | None, hops: Mapping[str, tuple[Link, Link]], chunk: int,
           margin: float = MARGIN, min_relay: int = MIN_RELAY) -> Plan:
    """The faster path for `size` bytes: `direct` (None: not measured, taken as unusable)
    or the best relay in `hops` (name -> (link to it, its link to the target))."""
    direct_s = direct.seconds(size) if direct is not None else float("inf")
    relay_s = {name: two_hop_seconds(size, a, b, chunk) for name, (a, b) in hops.items()}
    if size < min_relay and direct is not None:
        return Plan(None, direct_s, relay_s, f"{size} bytes: below {min_relay}, direct")
    if not relay_s:
        return Plan(None, direct_s, relay_s, "no relay offered")
    best = min(relay_s, key=lambda n: relay_s[n])
    if relay_s[best] * (1 + margin) < direct_s:
        return Plan(best, direct_s, relay_s, f"through {best}: {relay_s[best]:.3g} s "
                    f"estimated against {direct_s:.3g} s direct")
    return Plan(None, direct_s, relay_s, f"direct: {direct_s:.3g} s estimated, the best "
                f"relay ({best}) {relay_s[best]:.3g} s")
