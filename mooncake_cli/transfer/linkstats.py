"""What the transfer engine measured on each link: per peer segment and direction, the bytes
its batches moved and the seconds they took.

A batch counts, per peer and direction, the bytes of its completed requests and the time from
its submission to the last of them finishing: requests to one peer run side by side, so their
wall time, not the sum of theirs, is what the link took. Failed requests count nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mooncake_cli.transfer.batch import Batch


@dataclass(frozen=True)
class Traffic:
    """Bytes moved to or from one peer in one direction, in `seconds` of transfers."""

    bytes: int = 0
    seconds: float = 0.0
    batches: int = 0

    @property
    def bandwidth(self) -> float | None:
        """Bytes per second, None before anything was timed."""
        return self.bytes / self.seconds if self.seconds > 0 else None

    def minus(self, before: Traffic) -> Traffic:
        return Traffic(self.bytes - before.bytes, self.seconds - before.seconds,
                       self.batches - before.batches)


class LinkStats:
    """Per (peer segment, "read" or "write") traffic of one engine; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._links: dict[tuple[str, str], Traffic] = {}

    def batch_done(self, batch: Batch, ended: Mapping[int, float]) -> None:
        """Count `batch`, started at `batch.started`, whose requests completed at `ended`
        (request index -> perf_counter time)."""
        moved: dict[tuple[str, str], list[float]] = {}
        for i, end in ended.items():
            r = batch.requests[i]
            m = moved.setdefault((r.target, r.op.value), [0, 0.0])
            m[0] += r.length
            m[1] = max(m[1], end - batch.started)
        with self._lock:
            for key, (n, s) in moved.items():
                t = self._links.get(key, Traffic())
                self._links[key] = Traffic(t.bytes + int(n), t.seconds + s, t.batches + 1)

    def snapshot(self) -> dict[tuple[str, str], Traffic]:
        """(peer, direction) -> traffic so far."""
        with self._lock:
            return dict(self._links)

    @staticmethod
    def since(before: Mapping[tuple[str, str], Traffic],
              after: Mapping[tuple[str, str], Traffic]) -> dict[tuple[str, str], Traffic]:
        """The traffic between two snapshots, links that moved nothing left out."""
        out = {}
        for key, t in after.items():
            d = t.minus(before.get(key, Traffic()))
            if d.bytes > 0:
                out[key] = d
        return out


def reads_since(before: Mapping[tuple[str, str], Traffic],
                after: Mapping[tuple[str, str], Traffic]) -> dict[str, Traffic]:
    """Per peer, what was read from it between two snapshots (peers read nothing from left
    out)."""
    return {peer: t for (peer, op), t in LinkStats.since(before, after).items() if op == "read"}
