"""Resolving segment names to pooled peers: metadata lookup, transport choice, and a fresh
look when a request falls outside what we know of a peer.

Each peer gets the best transport that reaches it (highest priority first: shm for a
same-host peer with shared memory, nixl when UCX sees RDMA or CUDA, else tcp) unless one is
forced; the choice and why are logged at info and kept in `choices` for `mooncake plugins`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from mooncake_cli.interfaces import ConfigError, MooncakeError, SegmentDescriptor, TransferError
from mooncake_cli.registry import Registry
from mooncake_cli.transfer.endpoints import Endpoints
from mooncake_cli.transfer.metadata import MetadataClient
from mooncake_cli.transfer.peers import Peer
from mooncake_cli.transfer.segment import Segment
from mooncake_cli.transfer.spi import Transport

GROUP = "mooncake.transports"
log = logging.getLogger("mooncake.transfer")


def reaches(t: Transport, peer: SegmentDescriptor, local: SegmentDescriptor) -> tuple[bool, str]:
    """`t.reachable` as (ok, why); older plugins answer a bare bool."""
    try:
        r = t.reachable(peer, local)
    except Exception as e:  # a plugin's bug is a reason, not a crash of the lookup
        return False, f"{type(e).__name__}: {e}"
    if isinstance(r, tuple):
        return bool(r[0]), str(r[1])
    return bool(r), ""


def choose(transports: list[Transport], peer: SegmentDescriptor,
           local: SegmentDescriptor) -> tuple[Transport | None, str]:
    """The best transport that reaches `peer` (by its `rank` for this peer when it has one,
    else its priority), and a line saying why each better one did not."""
    notes: list[str] = []
    ranked = sorted(transports, key=lambda t: -(t.rank(peer, local) if hasattr(t, "rank")
                                                else t.priority))
    for t in ranked:
        ok, why = reaches(t, peer, local)
        if ok:
            return t, "; ".join([f"{t.name}: {why or 'reachable'}"] + notes)
        notes.append(f"not {t.name}: {why or 'unreachable'}")
    return None, "; ".join(notes)


def pick_transports(registry: Registry, choice: str) -> list[Transport]:
    """The transports an engine may use, best first: every available one for `auto`."""
    if choice == "auto":
        found = registry.available(GROUP)
        if not found:
            raise ConfigError("no transport plugin is available (see `mooncake plugins`)")
    else:
        found = [registry.get(GROUP, choice)]
    return sorted(found, key=lambda t: -t.priority)


class PeerDirectory:
    """One `Peer` per segment name, replaced when it turns stale (after a failure)."""

    def __init__(self, transports: list[Transport], endpoints: Endpoints,
                 metadata: MetadataClient, own_name: str, segment: Segment,
                 describe: Callable[[], SegmentDescriptor], secret: str | None, timeout: float,
                 connections: int) -> None:
        self.transports, self.metadata = transports, metadata
        self._endpoints = endpoints
        self.choices: dict[str, tuple[str, str]] = {}  # segment -> (transport, why)
        self._own, self._segment, self._describe = own_name, segment, describe
        self._secret, self._timeout, self._connections = secret, timeout, connections
        self._peers: dict[str, Peer] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> Peer:
        peer = self._peers.get(name)  # a dict read is atomic; writers hold the lock
        if peer is not None and not peer.stale:
            return peer
        if name == self._own:
            peer = Peer(self._describe(), None, None, self._timeout, 1 << 16,
                        local=self._segment)
        else:
            desc = self.metadata.lookup(name)
            local = self._describe()
            usable = [t for t in self.transports if t.name in self._endpoints.by_name]
            best, why = choose(usable, desc, local)
            if best is None:
                raise TransferError(f"no transport reaches '{name}' ({why or 'none attached'})")
            if self.choices.get(name, ("", ""))[0] != best.name:
                log.info("peer %s: transport %s (%s)", name, best.name, why)
            self.choices[name] = (best.name, why)
            peer = Peer(desc, best, self._secret, self._timeout, self._connections,
                        endpoint=self._endpoints.by_name[best.name])
        with self._lock:
            old = self._peers.get(name)
            self._peers[name] = peer
        if old is not None:
            old.retire()  # batches still running on it finish on their channels
        return peer

    def recheck(self, peer: Peer, target: str, offset: int, length: int,
                fresh: dict[str, SegmentDescriptor]) -> str | None:
        """Why [offset, offset+length) of `target`, outside the peer's known regions, is
        refused; None when a fresh descriptor (fetched once per target per batch: the peer
        may have registered memory since we looked) holds it."""
        if target not in fresh:
            try:
                fresh[target] = (self._describe() if target == self._own
                                 else self.metadata.lookup(target))
            except MooncakeError as e:
                return str(e)
        if fresh[target].region_for(offset, length) is None:
            return (f"{target}: out of bounds: [{offset}, {offset + length}) is not inside "
                    "one registered region")
        new, old = fresh[target], peer.desc
        if (new.host, new.port, new.pid) == (old.host, old.port, old.pid):
            peer.desc = new  # same process, more memory: keep its open connections
        else:
            peer.stale = True  # another process now: the next batch connects afresh
        return None

    def close(self) -> None:
        with self._lock:
            peers, self._peers = list(self._peers.values()), {}
        for p in peers:
            p.close()
