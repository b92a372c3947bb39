"""Leader election of HA store masters through an etcd lease (see leader.py for the key).

Each candidate polls the leader key; when nobody holds it, it grants itself a lease of `ttl`
seconds and creates the key in a transaction that succeeds only if the key does not exist
(create_revision == 0). The winner refreshes its lease every ttl/4 seconds and checks the key
is still its own. It steps down when the key is gone or another's, when its lease has expired,
or when etcd has been unreachable for 3/4 of the TTL (before the lease can expire, so two
masters never lead at once). A killed leader's lease expires after `ttl` seconds and a standby
takes over; a leader closed cleanly revokes its lease, and a standby takes over at once.

    ha = HaMaster(service, "etcd://127.0.0.1:2379", lambda: StoreMaster())
    ...
    ha.close()

While standing by, the service answers every request with NotLeader naming the leader, so a
client that reached it re-resolves; each term starts from an empty StoreMaster that the clients
refill by mounting their segments again and re-registering the objects they hold. A leader
acknowledges puts and removes only once the owners of the replicas have them (acks.py), so that
refill misses no acknowledged object and brings back no removed one.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from mooncake_cli.store.errors import RpcFailed
from mooncake_cli.store.ha.acks import WARM_UP, Acks
from mooncake_cli.store.ha.leader import Etcd, HaAddress, LeaderInfo
from mooncake_cli.store.master import StoreMaster

log = logging.getLogger("mooncake.store")
OnChange = Callable[[bool, LeaderInfo | None], None]


class Election:
    """Campaigns for `address` in the cluster of `url` until closed. `on_change(leading, info)`
    is called from the election thread when this candidate starts or stops leading."""

    def __init__(self, url: str, address: str, on_change: OnChange, ttl: int = 2,
                 poll: float = 0.2) -> None:
        self.where = HaAddress.parse(url)
        self.address = address
        self.id = uuid.uuid4().hex
        self.ttl = max(int(ttl), 2)  # etcd's shortest lease
        self._etcd = Etcd(self.where, timeout=self.ttl / 3)
        self._on_change = on_change
        self._poll = poll
        self._lease: Any = None
        self._renewed = 0.0  # monotonic time a refresh that succeeded was sent
        self.leading: LeaderInfo | None = None  # our term while we lead
        self.leader: LeaderInfo | None = None  # the last leader seen (maybe us)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mooncake-store-election",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._keep() if self._lease is not None else self._campaign()
            except Exception as e:  # etcd away, or a bug: the next round tries again
                log.warning("store election: %s", e)
            self._stop.wait(self.ttl / 4 if self._lease is not None else self._poll)

    def _campaign(self) -> None:
        current = self._etcd.leader()
        if current is not None:
            self.leader = current
            return
        sent = time.monotonic()
        lease = self._etcd.each("lease grant", lambda c: c.lease(ttl=self.ttl))
        key, value = self.where.key, json.dumps({"address": self.address, "id": self.id})
        txn = {"compare": [{"key": _b64(key), "result": "EQUAL", "target": "CREATE",
                            "create_revision": 0}],
               "success": [{"request_put": {"key": _b64(key), "value": _b64(value),
                                            "lease": lease.id}}],
               "failure": []}
        reply = self._etcd.each("transaction", lambda c: c.transaction(txn))
        if not reply.get("succeeded"):
            _quietly(lease.revoke)
            self.leader = self._etcd.leader()
            return
        self._lease, self._renewed = lease, sent
        self.leading = self.leader = LeaderInfo(self.address, int(reply["header"]["revision"]),
                                                self.id, True)
        log.info("store master %s leads (term %d)", self.address, self.leading.term)
        self._on_change(True, self.leading)

    def _keep(self) -> None:
        sent = time.monotonic()
        try:
            ttl = self._etcd.each("lease keepalive", lambda c: _refresh(c, self._lease.id))
            current = self._etcd.leader()
        except RpcFailed as e:
            if time.monotonic() - self._renewed < self.ttl * 0.75:
                return  # the lease still holds: try again next round
            self._step_down(f"etcd unreachable for {time.monotonic() - self._renewed:.1f} s: {e}")
            return
        if ttl <= 0:
            self._step_down("the lease expired")
        elif current is None or current.id != self.id:
            self._step_down("the leader key is gone or another's")
        else:
            self._renewed = sent

    def _step_down(self, why: str) -> None:
        lease, self._lease, self.leading = self._lease, None, None
        log.warning("store master %s steps down: %s", self.address, why)
        self._on_change(False, None)
        _quietly(lease.revoke)

    def close(self) -> None:
        """Stop campaigning; a leader revokes its lease so that a standby takes over at once."""
        self._stop.set()
        self._thread.join(timeout=self.ttl + 1)
        if self._lease is not None:
            _quietly(self._lease.revoke)
            self._lease = self.leading = None


class Standby(Protocol):
    """What HaMaster drives (MasterService): the master in use, and the HA hooks."""

    master: StoreMaster
    address: str
    standby: Callable[[], str] | None
    leader: Callable[[], LeaderInfo]
    acks: Acks


class HaMaster:
    """Runs `service` as an HA candidate: it serves only while its election is won, each term
    with a fresh master from `fresh`. `on_change(leading, info)` is told of every change."""

    def __init__(self, service: Standby, url: str, fresh: Callable[[], StoreMaster],
                 ttl: int = 2, on_change: OnChange | None = None) -> None:
        self.service = service
        self._fresh = fresh
        self._on_change = on_change
        self.election: Election | None = None  # until it exists, answers say "not ready"
        service.standby = self.refusal
        service.leader = self.leader
        service.acks.durable = True
        self.election = Election(url, service.address, self._changed, ttl)

    def leader(self) -> LeaderInfo:
        """The leader as this master knows it (address "" while nobody leads)."""
        known = self.election.leader if self.election is not None else None
        return known or LeaderInfo("", 0, "", True)

    def refusal(self) -> str:
        if self.election is None:
            return f"store master {self.service.address} is starting: not ready, retry"
        known = self.election.leader
        if known is None or known.address == self.service.address:
            return (f"store master {self.service.address} is a standby, not the leader; "
                    f"no leader is known yet (election in progress)")
        return (f"store master {self.service.address} is a standby, not the leader; "
                f"the leader is {known.address} (term {known.term})")

    def _changed(self, leading: bool, info: LeaderInfo | None) -> None:
        if leading:
            self.service.master = self._fresh()
            self.service.acks.warm_until = time.monotonic() + WARM_UP
            self.service.standby = None
        else:
            self.service.standby = self.refusal
            self.service.master = self._fresh()  # forget the lost term's objects
        if self._on_change is not None:
            self._on_change(leading, info)

    def close(self) -> None:
        self.service.standby = self.refusal
        if self.election is not None:
            self.election.close()


def _b64(text: str) -> str:
    import base64

    return base64.b64encode(text.encode()).decode()


def _refresh(client: Any, lease_id: int) -> int:
    from etcd3gw.lease import Lease

    return int(Lease(lease_id, client).refresh())


def _quietly(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception as e:  # best effort: the lease expires anyway
        log.debug("etcd: %s", e)
