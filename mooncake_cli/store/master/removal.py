"""Removal on the master: of one key, of the replicas of a key, of every key. A removal with
`own`, the remover's segment, leaves the remover to forget its replicas there itself
(ReportBook.note)."""

from __future__ import annotations

from mooncake_cli.store.errors import InvalidParams, ObjectHasLease, ReplicaNotReady
from mooncake_cli.store.master.state import MasterState
from mooncake_cli.store.records import check_key, evolve


class Removal:
    """Removals over the master's state."""

    def __init__(self, state: MasterState) -> None:
        self.state = state
        self.now = state.now
        self._lock = state.lock

    def remove(self, key: str, force: bool = False, own: str = "") -> None:
        """Forget `key` and free its replicas; refused while leased or being put unless `force`.
        `own`: the remover's segment, whose holdings it updates itself (ReportBook.note)."""
        check_key(key)
        with self._lock:
            st = self.state
            now = self.now()
            meta = st.live(key, now)
            if not force and meta.leased(now):
                raise ObjectHasLease(f"object {key!r} is leased for another "
                                     f"{meta.lease_until - now:.3f} s")
            if not force and not meta.complete:
                raise ReplicaNotReady(f"the put of {key!r} has not ended")
            st.drop(key, own)

    def replica_clear(self, key: str, segment: str = "") -> bool:
        """Drop the replicas of complete, unleased `key` (only those on `segment` when given;
        the object goes when none is left); whether any went. Missing keys: False."""
        with self._lock:
            st = self.state
            now = self.now()
            st.expire_put(key, now)
            meta = st.objects.get(key)
            if meta is None or not meta.complete or meta.leased(now):
                return False
            gone = [r for r in meta.replicas if not segment or r.segment == segment]
            if not gone:
                return False
            if len(gone) == len(meta.replicas):
                st.drop(key)
                return True
            st.segments.release_all(gone)
            st.set(evolve(meta, replicas=tuple(r for r in meta.replicas if r not in gone)))
            return True

    def remove_all(self, force: bool = False, own: str = "") -> int:
        """Remove every complete unleased object (every object with `force`); how many.
        `own` (with `force` only: then the remover knows what went): as for `remove`."""
        if own and not force:
            raise InvalidParams("remove_all names the remover's segment only with force")
        with self._lock:
            st = self.state
            now = self.now()
            keys = [k for k, m in st.objects.items()
                    if force or (m.complete and not m.leased(now))]
            for k in keys:
                st.drop(k, own)
            return len(keys)
