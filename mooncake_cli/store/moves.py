"""Copies between tiers that the master asks a client to make: offloads (DRAM -> SSD, instead of
dropping an evicted object) and promotions (SSD -> DRAM, after a get hits an SSD-only object).

Both ends of a move are on one client, which copies locally and confirms; only then does the
master switch the object's replica. `MoveBook` is the master's ledger of moves: waiting to be
handed out, handed out, or cancelled (the object went away meanwhile). A handed-out move keeps
its destination block allocated until the client answers or leaves, so a late copy can never
land on space given to another object; one unanswered for a while is handed out again (the
answer was lost). Blocks to forget are handed out until the client acknowledges them. Move ids
and forget sequence numbers start at a random 48-bit offset, so those of an earlier master term
are not taken for this one's. Not thread-safe: the master's lock guards it.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from mooncake_cli.store.records import Replica

MoveKind = Literal["offload", "promote"]


@dataclass(frozen=True)
class Move:
    """Copy `key`'s bytes from replica `src` to the new replica `dst`; both on one client."""

    id: int
    kind: MoveKind
    key: str
    src: Replica
    dst: Replica
    checksum: str | None = None


@dataclass(frozen=True)
class MoveResult:
    """A client's answer to move `id`: copied and verified (`ok`), or why not."""

    id: int
    ok: bool
    message: str = ""


@dataclass(frozen=True)
class MoveOrders:
    """What a polling client should do: `moves` to make, and `forget`, the offsets of blocks on
    its SSD segment that no longer hold a live object (drop them from its manifest). `known` is
    False when the master does not know the client (it should mount again). `ack` is the
    sequence number of the last of `forget` (0 when none): the client sends it back with its next
    poll once it has dropped them, until then they are handed out again."""

    known: bool = True
    moves: tuple[Move, ...] = ()
    forget: tuple[int, ...] = ()
    ack: int = 0


@dataclass
class Pending:
    move: Move
    client: str
    freeing: int  # DRAM bytes an offload frees once done (0 for a promotion)
    created: float
    handed: bool = False
    handed_at: float = 0.0
    cancelled: bool = False


def _first_id() -> int:
    return secrets.randbits(48) + 1


@dataclass
class MoveBook:
    _first: int = field(default_factory=_first_id)
    _next: int = 0
    _moves: dict[int, Pending] = field(default_factory=dict)
    _by_key: dict[str, int] = field(default_factory=dict)  # live (not cancelled) moves
    _forget: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # (seq, offset)

    def __post_init__(self) -> None:
        self._next = self._first

    def _id(self) -> int:
        self._next += 1
        return self._next - 1

    def add(self, kind: MoveKind, key: str, src: Replica, dst: Replica, checksum: str | None,
            client: str, freeing: int, now: float) -> Move:
        move = Move(self._id(), kind, key, src, dst, checksum)
        self._moves[move.id] = Pending(move, client, freeing, now)
        self._by_key[key] = move.id
        return move

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def __iter__(self) -> Iterator[Pending]:
        return iter(list(self._moves.values()))

    def freeing(self) -> int:
        """DRAM bytes the live offloads will free."""
        return sum(self._moves[i].freeing for i in self._by_key.values())

    def hand_out(self, client: str, now: float, timeout: float) -> tuple[Move, ...]:
        """`client`'s moves never handed out, and those handed out `timeout` seconds ago and
        still unanswered (a cancelled one too: its answer frees its block)."""
        out = []
        for p in self._moves.values():
            if p.client == client and (not p.handed and not p.cancelled or
                                       p.handed and p.handed_at + timeout <= now):
                p.handed, p.handed_at = True, now
                out.append(p.move)
        return tuple(out)

    def take(self, client: str, move_id: int) -> Pending | None:
        """The handed-out move `move_id` of `client`, removed from the book (None if unknown)."""
        p = self._moves.get(move_id)
        if p is None or p.client != client or not p.handed:
            return None
        self.pop(p)
        return p

    def pop(self, p: Pending) -> None:
        self._moves.pop(p.move.id, None)
        if self._by_key.get(p.move.key) == p.move.id:
            del self._by_key[p.move.key]

    def cancel(self, key: str) -> Pending | None:
        """Call off `key`'s live move (see `call_off`)."""
        i = self._by_key.get(key)
        return None if i is None else self.call_off(self._moves[i])

    def call_off(self, p: Pending) -> Pending | None:
        """Returned (and removed) when never handed out, so its destination can be freed now;
        a handed-out move stays, marked cancelled, until its client answers."""
        if self._by_key.get(p.move.key) == p.move.id:
            del self._by_key[p.move.key]
        if p.handed:
            p.cancelled = True
            return None
        self._moves.pop(p.move.id, None)
        return p

    def stale(self, now: float, timeout: float) -> list[Pending]:
        """Moves never handed out within `timeout` (their client does not poll), removed."""
        if not self._moves:
            return []
        old = [p for p in self._moves.values() if not p.handed and p.created + timeout <= now]
        for p in old:
            self.pop(p)
        return old

    def forget(self, client: str, offset: int) -> None:
        self._forget.setdefault(client, []).append((self._id(), offset))

    def forgets(self, client: str, ack: int) -> tuple[tuple[int, ...], int]:
        """The offsets `client` has not acknowledged yet (those up to `ack`, a sequence number
        of this book, are dropped) and the sequence number of the last (0 when none)."""
        owed = self._forget.get(client, [])
        if self._first <= ack < self._next:
            owed = [(seq, off) for seq, off in owed if seq > ack]
            if owed:
                self._forget[client] = owed
            else:
                self._forget.pop(client, None)
        return tuple(off for _, off in owed), (owed[-1][0] if owed else 0)

    def drop_client(self, client: str) -> None:
        """Forget everything owed to or by `client` (it is gone, its segments with it)."""
        for p in [p for p in self._moves.values() if p.client == client]:
            self.pop(p)
        self._forget.pop(client, None)
