"""A conductor's etcd lease with `--peers` (in-process conductors, a real etcd): a lost lease is
granted again with the member record and every live booking written anew; a conductor that has
not caught up refuses requests with 503."""

from __future__ import annotations

import json
from collections.abc import Iterator

import etcd3gw
import pytest
from etcd3gw.lease import Lease

from mooncake_cli.api.errors import ServingError
from mooncake_cli.api.registration import parse
from mooncake_cli.conductor.peers import Peers
from mooncake_cli.conductor.service import ConductorService
from mooncake_cli.config.conductor import ConductorConfig
from mooncake_cli.scheduler.state import Request
from tests.conftest import free_port, wait_for

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def client(etcd: str) -> Iterator[etcd3gw.Etcd3Client]:
    (host, port), *_ = parse(etcd)[0]
    yield etcd3gw.client(host=host, port=port)


def record(client: etcd3gw.Etcd3Client, key: str) -> dict | None:
    found = client.get(key)
    return json.loads(found[0]) if found else None


def test_a_lost_lease_is_granted_again_with_the_member_and_bookings(
        etcd: str, client: etcd3gw.Etcd3Client) -> None:
    svc = ConductorService(ConductorConfig(port=0, peers=f"{etcd}/lease", peer_ttl=2)).start()
    try:
        peers = svc.peers
        assert peers is not None and peers.ready
        peers.booked("r1", "d0", 64)  # as Bookings.decide books a request
        member = peers.layout.member(peers.cid)
        booking = peers.layout.booking(peers.cid, "r1")
        first = wait_for(lambda: record(client, booking), 30, what="the booking in etcd")
        assert isinstance(first, dict) and first["tokens"] == 64
        Lease(int(first["lease"]), client).revoke()  # as if etcd had lost it (keys go too)
        again = wait_for(lambda: record(client, booking), 30, what="the booking written again")
        assert isinstance(again, dict) and again["lease"] != first["lease"]
        assert record(client, member) is not None
        peers.released("r1")
        wait_for(lambda: record(client, booking) is None, 30, what="the booking deleted")
    finally:
        svc.close()
    assert client.get_prefix("/mooncake/conductors/lease/members/") == []  # lease revoked


def test_a_conductor_that_has_not_caught_up_refuses_with_503() -> None:
    nowhere = f"etcd://127.0.0.1:{free_port()}/x"
    svc = ConductorService(ConductorConfig(port=0, peers=nowhere))
    peers = svc.peers
    assert isinstance(peers, Peers)
    try:
        peers.start(wait=0.2)
        assert not peers.ready and peers.snapshot()["ready"] is False
        with pytest.raises(ServingError) as refused:
            svc.conductor.bookings.decide(Request("r", 4, 2, ()))
        assert refused.value.status == 503 and "catching up" in refused.value.message
    finally:
        peers.close()
        svc.conductor.close()
