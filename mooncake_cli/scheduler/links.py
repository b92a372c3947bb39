"""Links: the KV bandwidth the conductor measured between pairs of instances.

A prefill worker that fetched a prefix reports the bytes it read from other segments and the
seconds its transfer engine took for them (`PrefillAnswer.fetched`, from the engine's link
statistics); the conductor counts them for the pair it chose, the holder the prefix came from
and the instance that fetched it. Each pair keeps an exponentially weighted average of the
rates seen, the first one taken as it is. A pair never measured has no entry: the scheduler
uses the cost model's bandwidth for it, the prior (the conductor config's `bandwidth`, or the
profile's). With `learn` off (`--link-bandwidth model`) observations are dropped, so every pair
keeps the prior: fetches are estimated as before links were measured.

Not locked: the live conductor observes and reads it under its instance registry's lock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

ALPHA = 0.3  # weight of the newest rate: a link's rate changes with its load


class Links:
    """Measured bytes per second per (source, destination) pair of instances."""

    def __init__(self, alpha: float = ALPHA, learn: bool = True) -> None:
        self.alpha, self.learn = alpha, learn
        self._from: dict[str, dict[str, float]] = {}  # source -> destination -> bytes/s
        self._seen: dict[tuple[str, str], int] = {}  # (source, destination) -> fetches

    def __bool__(self) -> bool:
        """Whether any pair was measured."""
        return bool(self._from)

    def observe(self, source: str, dest: str, nbytes: int, seconds: float) -> None:
        """`dest` read `nbytes` from `source` in `seconds` of transfers (dropped unless
        `learn`)."""
        if not self.learn or nbytes <= 0 or not seconds > 0 or not math.isfinite(seconds) \
                or source == dest:
            return
        rate = nbytes / seconds
        row = self._from.setdefault(source, {})
        old = row.get(dest)
        row[dest] = rate if old is None else old + self.alpha * (rate - old)
        self._seen[source, dest] = self._seen.get((source, dest), 0) + 1

    def get(self, source: str | None, dest: str) -> float | None:
        """The measured bandwidth from `source` to `dest`, None when never measured."""
        row = self._from.get(source) if source is not None else None
        return row.get(dest) if row else None

    def from_source(self, source: str | None) -> Mapping[str, float]:
        """Each destination measured from `source` -> its bandwidth (read-only use)."""
        return self._from.get(source, {}) if source is not None else {}

    def forget(self, name: str) -> None:
        """Drop the pairs of an instance that left."""
        self._from.pop(name, None)
        for row in self._from.values():
            row.pop(name, None)
        self._from = {s: row for s, row in self._from.items() if row}
        self._seen = {k: n for k, n in self._seen.items() if name not in k}

    def to_dict(self) -> list[dict[str, Any]]:
        """Each measured pair: source, destination, bytes/s and how many fetches fed it."""
        return [{"source": s, "dest": d, "bandwidth": round(bw, 1),
                 "fetches": self._seen.get((s, d), 0)}
                for s, row in sorted(self._from.items()) for d, bw in sorted(row.items())]
