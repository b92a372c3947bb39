"""Write capabilities: which peer may write where in a guarded region of this engine.

A guarded region (a decode worker's KV pool) takes no plain WRITE over the wire: each must
carry a capability, a random 16-byte token the owner issued for a set of byte ranges (the
blocks of one reservation). The target checks every write against its token's ranges, so a
writer who was pointed at memory it was never granted (a fake decode URL naming the real
worker's blocks) is refused whatever secret it holds.

    grants = engine.grants
    grants.guard(region)                                   # this region needs capabilities
    token = grants.issue("req-1", [(off, n), ...], ttl=120, holder="10.0.0.7")
    grants.allows(token, off, n)                           # None, or why not
    grants.revoke("req-1")

A grant is `used` once a write through it succeeded; `expired_unused(ttl)` names the grants
nobody wrote through within `ttl` seconds, so their owner can give the memory back quickly.
"""

from __future__ import annotations

import bisect
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

TOKEN_BYTES = 16


@dataclass
class Grant:
    key: str
    token: bytes
    starts: list[int]  # sorted, merged ranges [starts[i], ends[i])
    ends: list[int]
    holder: str
    expires: float
    created: float = field(default_factory=time.monotonic)
    used: bool = False
    torn: bool = False  # a write through it was cut short: its memory holds partial bytes

    def covers(self, offset: int, length: int) -> bool:
        i = bisect.bisect_right(self.starts, offset) - 1
        return i >= 0 and offset + length <= self.ends[i]


def merge(ranges: Iterable[tuple[int, int]]) -> tuple[list[int], list[int]]:
    starts: list[int] = []
    ends: list[int] = []
    for off, n in sorted(ranges):
        if n <= 0:
            continue
        if ends and off <= ends[-1]:
            ends[-1] = max(ends[-1], off + n)
        else:
            starts.append(off)
            ends.append(off + n)
    return starts, ends


class Grants:
    """The capabilities one engine issued, and the regions that need them. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._guarded: tuple[tuple[int, int], ...] = ()
        self._by_token: dict[bytes, Grant] = {}
        self._by_key: dict[str, Grant] = {}

    def guard(self, base: int, length: int) -> None:
        with self._lock:
            self._guarded = (*self._guarded, (base, base + length))

    def unguard(self, base: int) -> None:
        with self._lock:
            self._guarded = tuple(g for g in self._guarded if g[0] != base)

    def guarded(self, offset: int, length: int) -> bool:
        """Whether any byte of [offset, offset+length) lies in a guarded region."""
        return any(lo < offset + length and offset < hi for lo, hi in self._guarded)

    def issue(self, key: str, ranges: Iterable[tuple[int, int]], ttl: float,
              holder: str = "") -> bytes:
        """A fresh token for `ranges` (replacing the one of `key`), valid `ttl` seconds."""
        starts, ends = merge(ranges)
        token = secrets.token_bytes(TOKEN_BYTES)
        grant = Grant(key, token, starts, ends, holder, time.monotonic() + ttl)
        with self._lock:
            old = self._by_key.pop(key, None)
            if old is not None:
                self._by_token.pop(old.token, None)
            self._by_key[key] = grant
            self._by_token[token] = grant
        return token

    def revoke(self, key: str) -> Grant | None:
        with self._lock:
            grant = self._by_key.pop(key, None)
            if grant is not None:
                self._by_token.pop(grant.token, None)
            return grant

    def get(self, key: str) -> Grant | None:
        return self._by_key.get(key)

    def allows(self, token: bytes | None, offset: int, length: int) -> str | None:
        """None when a write of [offset, offset+length) may go ahead, else why not."""
        if token is None:
            if self.guarded(offset, length):
                return (f"[{offset}, {offset + length}) is guarded: a write there needs the "
                        "capability of a reservation")
            return None
        grant = self._by_token.get(bytes(token))
        if grant is None:
            return "unknown or revoked write capability"
        if grant.expires < time.monotonic():
            self.revoke(grant.key)
            return f"the write capability of {grant.key!r} expired"
        if not grant.covers(offset, length):
            return (f"the write capability of {grant.key!r} does not cover "
                    f"[{offset}, {offset + length})")
        return None

    def wrote(self, token: bytes | None, complete: bool = True) -> None:
        """Record a write through `token`: `used`, or `torn` when it was cut short."""
        grant = self._by_token.get(bytes(token)) if token is not None else None
        if grant is not None:
            if complete:
                grant.used = True
            else:
                grant.torn = True

    def held_by(self, holder: str, unused_only: bool = True) -> list[Grant]:
        with self._lock:
            return [g for g in self._by_key.values()
                    if g.holder == holder and not (unused_only and g.used)]

    def expired_unused(self, ttl: float) -> list[str]:
        """Keys of grants nobody wrote through within `ttl` seconds of their issue, and of
        those past their own expiry."""
        now = time.monotonic()
        with self._lock:
            return [g.key for g in self._by_key.values()
                    if (not g.used and now - g.created > ttl) or g.expires < now]

    def __len__(self) -> int:
        return len(self._by_key)
