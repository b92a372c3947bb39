"""Rebuilding a master's index from the clients that hold the data: after a restart or a
failover, each client mounts its segments again and re-announces the replicas they hold.

`poll_holdings` is the heartbeat of a client with a segment: it also tells it what completed in
or left its DRAM segment, whoever put it (reports.py), so it re-registers every replica it
holds, not only its own puts (`register_held`); `register_existing` joins re-announced complete
replicas to what the master knows of a key, all or nothing. A key it learns this way starts
leased for `lease_ttl`, since a reader may hold a lease the old master granted (and reads
its replicas meanwhile): it is neither removed without force nor evicted before that runs out.
"""

from __future__ import annotations

from collections.abc import Sequence

from mooncake_cli.store.errors import (
    InvalidParams,
    InvalidReplica,
    ObjectAlreadyExists,
    StoreError,
)
from mooncake_cli.store.master.state import MasterState
from mooncake_cli.store.records import (
    DEFAULT_CONFIG,
    ObjectMeta,
    Replica,
    ReplicateConfig,
    check_key,
    evolve,
)
from mooncake_cli.store.reports import Held, HoldingsReport


class Rebuild:
    """Re-registration over the master's state."""

    def __init__(self, state: MasterState) -> None:
        self.state = state

    def poll_holdings(self, client_id: str, epoch: str = "", ack: int = 0) -> HoldingsReport:
        """A heartbeat that also answers what changed in the client's DRAM segments since
        `ack` of journal `epoch` (see reports.py); known=False if the master does not know it."""
        st = self.state
        if not isinstance(client_id, str) or not client_id or not isinstance(ack, int):
            raise InvalidParams("poll_holdings takes a client id, an epoch and an ack")
        with st.lock:
            if client_id not in st.clients:
                return HoldingsReport(known=False)
            st.clients[client_id] = st.now()
            return st.reports.report(client_id, epoch, ack, st.objects.values())


    def register_held(self, held: Sequence[Held]) -> list[None | StoreError]:
        """`register_existing` of each replica a client re-announces; per item None when
        registered (or known already), else the error it met."""
        st = self.state
        out: list[None | StoreError] = []
        with st.lock:
            for h in held:
                try:
                    if not isinstance(h, Held):
                        raise InvalidParams("register_held takes a list of Held")
                    self.register_existing(h.key, [h.replica], h.config)
                    out.append(None)
                except StoreError as e:
                    out.append(e)
        return out


    def register_existing(self, key: str, replicas: Sequence[Replica],
                          config: ReplicateConfig | None = None) -> ObjectMeta:
        """Re-announce complete replicas of `key` that a client still holds on its mounted
        segments; they join what the master already knows of `key`. All or nothing."""
        st = self.state
        check_key(key)
        reps = list(replicas)
        if not reps or not all(isinstance(r, Replica) for r in reps):
            raise InvalidParams("register_existing needs at least one Replica")
        size = reps[0].size
        if any(r.size != size for r in reps):
            raise InvalidReplica(f"replicas of {key!r} disagree on its size")
        if config is not None and not isinstance(config, ReplicateConfig):
            raise InvalidParams(f"config must be a ReplicateConfig, not {type(config).__name__}")
        with st.lock:
            now = st.now()
            st.expire_put(key, now)
            meta = st.objects.get(key)
            if meta is not None and (not meta.complete or meta.size != size):
                raise ObjectAlreadyExists(f"object {key!r} exists with another size or is "
                                          f"being put")
            known = meta.replicas if meta is not None else ()
            sums = {r.checksum for r in (*known, *reps) if r.checksum is not None}
            if len(sums) > 1:
                raise InvalidReplica(f"replicas of {key!r} disagree on the checksum")
            taken = {(r.segment, r.tier): r.offset for r in known}  # one per segment and tier
            new: list[Replica] = []
            try:
                for r in reps:
                    if taken.get((r.segment, r.tier)) == r.offset:
                        continue  # already known: another owner or a repeat
                    if (r.segment, r.tier) in taken:
                        raise InvalidReplica(f"{key!r} already has a {r.tier} replica on "
                                             f"{r.segment}")
                    new.append(st.segments.claim(r))
                    taken[(r.segment, r.tier)] = r.offset
            except StoreError:
                st.segments.release_all(new)
                raise
            if meta is None:  # leased as a get would be: a lease of the last master still holds
                meta = ObjectMeta(key, size, tuple(new), config or DEFAULT_CONFIG, now, now,
                                  lease_until=now + st.lease_ttl)
            else:
                meta = evolve(meta, replicas=meta.replicas + tuple(new))
            return st.keep(meta)
