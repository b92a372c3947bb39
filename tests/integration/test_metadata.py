"""Metadata backends (p2p, HTTP, a real etcd) through `open_metadata`, descriptor expiry when the
publishing process dies, transfers between engines that found each other through metadata, and
the HTTP metadata server's GET/PUT/DELETE contract."""

from __future__ import annotations

import http.client
import os
import socket
import time
import urllib.parse
import uuid

import pytest

from mooncake_cli.interfaces import ConfigError, MetadataError, RegionInfo, SegmentDescriptor
from mooncake_cli.registry import Registry
from mooncake_cli.transfer.batch import Op, State, TransferRequest
from mooncake_cli.transfer.metadata import KEY_PREFIX
from mooncake_cli.transfer.metadata_http import MAX_VALUE
from mooncake_cli.transfer.metadata_open import open_metadata
from tests.conftest import free_port, wait_for

pytestmark = pytest.mark.timeout(60)

TRANSPORTS = sorted(p.name for p in Registry().plugins("mooncake.transports") if p.available)


def descriptor(name: str, *lengths: int) -> SegmentDescriptor:
    regions = tuple(RegionInfo(i * (1 << 20), n) for i, n in enumerate(lengths))
    return SegmentDescriptor(name, "127.0.0.1", 4242, "boot", os.getpid(), False, regions)


def unique(prefix: str = "seg") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(params=["http", "etcd"])
def url(request: pytest.FixtureRequest) -> str:
    """The URL of a live metadata service of each kind."""
    if request.param == "http":
        return str(request.getfixturevalue("metadata_server").url)
    return str(request.getfixturevalue("etcd"))


def gone(client, name: str) -> bool:
    try:
        client.lookup(name)
    except MetadataError:
        return True
    return False


# -- open_metadata ----------------------------------------------------------------------------
def test_open_metadata_kinds(url: str) -> None:
    client = open_metadata(url, ttl=5)
    try:
        assert client.kind == url.split(":")[0]
    finally:
        client.close()
    for p2p in ("p2p", "P2PHANDSHAKE", "", "  p2p "):
        assert open_metadata(p2p).kind == "p2p"


@pytest.mark.parametrize("bad,error,match", [
    ("zookeeper://127.0.0.1:2181", ConfigError, "unknown metadata"),
    ("127.0.0.1:2379", ConfigError, "unknown metadata"),
    ("etcd://", MetadataError, "no etcd endpoint"),
    ("etcd://localhost", ConfigError, "HOST:PORT"),
    ("etcd://127.0.0.1:99999", ConfigError, "HOST:PORT"),
])
def test_open_metadata_refuses_bad_urls(bad: str, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        open_metadata(bad)


# -- publish / lookup / withdraw ----------------------------------------------------------------
def test_publish_lookup_withdraw(url: str) -> None:
    a, b = open_metadata(url, ttl=10), open_metadata(url, ttl=10)
    try:
        name = unique()
        desc = descriptor(name, 4096, 100)
        a.publish(desc)
        assert b.lookup(name) == desc  # another client sees exactly what was published
        assert a.lookup(name) == desc
        bigger = descriptor(name, 4096, 100, 1 << 20)
        a.publish(bigger)  # republishing replaces
        assert b.lookup(name) == bigger
        a.withdraw(name)
        assert gone(b, name)
        a.withdraw(name)  # withdrawing twice is harmless
        with pytest.raises(MetadataError, match="not found"):
            b.lookup(name)
    finally:
        a.close()
        b.close()


def test_lookup_of_a_missing_name_raises(url: str) -> None:
    client = open_metadata(url)
    try:
        with pytest.raises(MetadataError, match="not found"):
            client.lookup(unique("never-published"))
    finally:
        client.close()


def test_close_withdraws_what_the_client_published(url: str) -> None:
    a, b = open_metadata(url, ttl=10), open_metadata(url, ttl=10)
    names = [unique() for _ in range(3)]
    for n in names:
        a.publish(descriptor(n, 10))
    assert all(b.lookup(n).name == n for n in names)
    a.close()
    assert all(gone(b, n) for n in names)
    b.close()


def test_malformed_descriptor_is_a_metadata_error(metadata_server) -> None:
    name = unique()
    metadata_server.store.put(KEY_PREFIX + name, b"{not json", None)
    client = open_metadata(metadata_server.url)
    with pytest.raises(MetadataError, match="malformed"):
        client.lookup(name)
    metadata_server.store.put(KEY_PREFIX + name, b'{"name": "x"}', None)
    with pytest.raises(MetadataError, match="malformed"):
        client.lookup(name)


def test_unreachable_services_raise_metadata_error() -> None:
    port = free_port()  # nothing listens there
    http_client = open_metadata(f"http://127.0.0.1:{port}/metadata", timeout=2)
    with pytest.raises(MetadataError, match="unreachable"):
        http_client.publish(descriptor("x", 1))
    with pytest.raises(MetadataError, match="unreachable"):
        http_client.lookup("x")
    etcd_client = open_metadata(f"etcd://127.0.0.1:{port}", timeout=2)
    with pytest.raises(MetadataError, match="every endpoint"):
        etcd_client.lookup("x")
    with pytest.raises(MetadataError, match="every endpoint"):
        etcd_client.publish(descriptor("x", 1))


def test_etcd_fails_over_to_the_next_endpoint(etcd: str) -> None:
    dead = f"127.0.0.1:{free_port()}"
    live = etcd[len("etcd://"):]
    client = open_metadata(f"etcd://{dead},{live}", timeout=2, ttl=5)
    observer = open_metadata(etcd)
    try:
        name = unique()
        client.publish(descriptor(name, 64))
        assert observer.lookup(name).name == name
        assert client.lookup(name).regions[0].length == 64
        client.withdraw(name)
        assert gone(observer, name)
    finally:
        client.close()
        observer.close()


def test_etcd_descriptor_is_attached_to_a_lease(etcd: str) -> None:
    import etcd3gw

    host, port = etcd[len("etcd://"):].split(":")
    raw = etcd3gw.client(host=host, port=int(port), timeout=5)
    client = open_metadata(etcd, ttl=3)
    try:
        name = unique()
        client.publish(descriptor(name, 1))
        [(value, meta)] = raw.get(KEY_PREFIX + name, metadata=True)
        assert SegmentDescriptor.from_json(value).name == name
        assert int(meta.get("lease", 0)) != 0, meta
    finally:
        client.close()


def test_etcd_republishes_after_its_lease_is_lost(etcd: str) -> None:
    import etcd3gw

    host, port = etcd[len("etcd://"):].split(":")
    raw = etcd3gw.client(host=host, port=int(port), timeout=5)
    client = open_metadata(etcd, ttl=3)
    try:
        name = unique()
        client.publish(descriptor(name, 1))
        [(_, meta)] = raw.get(KEY_PREFIX + name, metadata=True)
        raw.post(raw.get_url("/kv/lease/revoke"), json={"ID": int(meta["lease"])})
        assert raw.get(KEY_PREFIX + name) == []  # as if etcd had lost it
        wait_for(lambda: raw.get(KEY_PREFIX + name) != [], timeout=5,
                 what="the descriptor to be published again under a fresh lease")
        assert client.lookup(name).name == name
    finally:
        client.close()


def test_p2p_asks_the_peer_itself(make_engine) -> None:
    target = make_engine()
    region = target.allocate(1 << 20)
    client = open_metadata("p2p", timeout=2)
    desc = client.lookup(target.name)
    assert desc.name == target.name == f"127.0.0.1:{desc.port}"
    assert desc.pid == os.getpid()
    assert desc.regions == (region.info(),)
    client.publish(desc)  # no-ops: there is nothing to publish to
    client.withdraw(desc.name)
    assert client.lookup(target.name) == desc
    with pytest.raises(MetadataError, match="cannot connect"):
        client.lookup(f"127.0.0.1:{free_port()}")
    with pytest.raises(ConfigError, match="HOST:PORT"):
        client.lookup("not-an-address")


def test_p2p_lookup_of_a_secret_target_needs_the_secret(make_engine) -> None:
    target = make_engine(secret="open sesame")
    with pytest.raises(MetadataError, match="secret"):
        open_metadata("p2p", None, 2).lookup(target.name)
    with pytest.raises(MetadataError, match="secret"):
        open_metadata("p2p", "wrong", 2).lookup(target.name)
    assert open_metadata("p2p", "open sesame", 2).lookup(target.name).auth is True


# -- expiry when the publishing process dies -----------------------------------------------------
TTL = 2.0


@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
def test_descriptor_of_a_dead_engine_expires(url: str, how: str, spawn_target) -> None:
    name = unique("dying")
    t = spawn_target(1 << 20, metadata=url, name=name,
                     env={"MOONCAKE_TRANSFER_METADATA_TTL": f"{TTL:g}"})
    assert t.segment == name
    client = open_metadata(url, ttl=10)
    try:
        assert client.lookup(name).pid == t.pid
        if how == "sigkill":
            # alive, it keeps its descriptor well past the TTL (the keeper refreshes it)
            deadline = time.monotonic() + 1.5 * TTL
            while time.monotonic() < deadline:
                assert client.lookup(name).pid == t.pid
                time.sleep(0.25)  # sleep: behaviour - 1.5 TTLs pass in real time
            t.kill()
            wait_for(lambda: gone(client, name), timeout=3 * TTL + 2,
                     what=f"the descriptor of killed pid {t.pid} to expire")
        else:
            assert t.stop() == 0
            assert gone(client, name), "a cleanly stopped engine must withdraw at once"
    finally:
        client.close()


# -- engines that find each other through metadata -----------------------------------------------
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_transfer_between_engines_found_through_metadata(url: str, transport: str,
                                                         spawn_target, make_engine) -> None:
    name = unique("target")
    t = spawn_target(8 << 20, metadata=url, name=name)
    eng = make_engine(metadata=url, transport=transport, name=unique("initiator"))
    assert eng.name != eng.address  # names are free-form, not HOST:PORT, with a metadata service
    assert eng.transport_for(name) == transport
    data = os.urandom(5 << 20)  # several slices
    src = eng.register(bytearray(data))
    dst = eng.register(bytearray(len(data)))
    assert eng.transfer(Op.WRITE, src, 0, name, t.offset + 12345, len(data)).state \
        is State.COMPLETED
    assert eng.transfer(Op.READ, dst, 0, name, t.offset + 12345, len(data)).state \
        is State.COMPLETED
    assert bytes(dst.view) == data
    # the initiator published itself too: a third party finds it
    observer = open_metadata(url)
    try:
        assert observer.lookup(eng.name).regions == tuple(r.info() for r in eng.segment.regions)
    finally:
        observer.close()
    # an unknown segment name fails the request with the metadata's reason
    [st] = eng.submit([TransferRequest(Op.READ, dst, 0, "no-such-segment", 0, 16)]).wait(10)
    assert st.state is State.FAILED and "not found" in st.reason


# -- the HTTP server's contract ----------------------------------------------------------------
def call(server, method: str, query: str, body: bytes | None = None,
         path: str = "/metadata") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.request(method, f"{path}{query}", body=body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def q(key: str, **extra: str) -> str:
    return "?" + urllib.parse.urlencode({"key": key, **extra})


def test_http_get_put_delete_status_codes(metadata_server) -> None:
    s = metadata_server
    key = "mooncake/segments/a b&c=d"  # needs URL encoding
    value = bytes(range(256)) * 3
    assert call(s, "GET", q(key))[0] == 404
    assert call(s, "PUT", q(key), value)[0] == 200
    assert call(s, "GET", q(key)) == (200, value)
    assert call(s, "PUT", q(key), b"v2")[0] == 200
    assert call(s, "GET", q(key)) == (200, b"v2")
    assert call(s, "GET", q("other"))[0] == 404
    assert call(s, "DELETE", q(key))[0] == 200
    assert call(s, "GET", q(key))[0] == 404
    assert call(s, "DELETE", q(key))[0] == 404
    assert call(s, "PUT", q("empty"), b"")[0] == 200
    assert call(s, "GET", q("empty")) == (200, b"")


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
def test_http_missing_key_is_400_and_unknown_path_404(metadata_server, method: str) -> None:
    body = b"x" if method == "PUT" else None
    assert call(metadata_server, method, "", body)[0] == 400
    assert call(metadata_server, method, "?key=", body)[0] == 400
    assert call(metadata_server, method, "?other=1", body)[0] == 400
    assert call(metadata_server, method, q("k"), body, path="/elsewhere")[0] == 404
    assert call(metadata_server, "GET", q("k"))[0] == 404  # nothing was stored


def test_http_oversize_value_is_refused(metadata_server) -> None:
    s = metadata_server
    assert call(s, "PUT", q("max"), b"m" * MAX_VALUE)[0] == 200
    assert call(s, "GET", q("max")) == (200, b"m" * MAX_VALUE)
    # announce one byte too many and send no body: refused without reading it
    with socket.create_connection(("127.0.0.1", s.port), timeout=5) as sock:
        sock.sendall(f"PUT /metadata{q('big')} HTTP/1.1\r\nHost: x\r\n"
                     f"Content-Length: {MAX_VALUE + 1}\r\n\r\n".encode())
        reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:60]
    assert call(s, "GET", q("big"))[0] == 404
    assert call(s, "PUT", q("neg"), None)[0] == 200  # no body at all is an empty value
    with socket.create_connection(("127.0.0.1", s.port), timeout=5) as sock:
        sock.sendall(f"PUT /metadata{q('bad')} HTTP/1.1\r\nHost: x\r\n"
                     "Content-Length: lots\r\n\r\n".encode())
        assert sock.recv(4096).startswith(b"HTTP/1.1 400")


def test_http_ttl(metadata_server) -> None:
    s = metadata_server
    assert call(s, "PUT", q("short", ttl="0.3"), b"v")[0] == 200
    assert call(s, "PUT", q("forever"), b"v")[0] == 200
    assert call(s, "GET", q("short")) == (200, b"v")
    wait_for(lambda: call(s, "GET", q("short"))[0] == 404, timeout=5, what="ttl expiry")
    assert call(s, "GET", q("forever")) == (200, b"v")
    for bad in ("0", "-1", "soon"):
        assert call(s, "PUT", q("t", ttl=bad), b"v")[0] == 400
    assert call(s, "GET", q("t"))[0] == 404


def test_http_unsupported_method(metadata_server) -> None:
    assert call(metadata_server, "POST", q("k"), b"v")[0] == 405  # not allowed on the path
    assert call(metadata_server, "GET", q("k"))[0] == 404
