"""The store master as a real process: ready line, SIGTERM, strict decoding of raw messages sent
straight to its port, the shared secret, and clients facing a dead master."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest
import zmq

from mooncake_cli.store import StoreCode, StoreError
from mooncake_cli.store.client import StoreClient
from mooncake_cli.store.wire import protocol as p
from tests.conftest import free_port
from tests.helpers.store_procs import Proc, start_master

pytestmark = pytest.mark.timeout(60)
SECRET = "s3cret"


@pytest.fixture
def master() -> Iterator[Proc]:
    m = start_master(free_port(), "--client-ttl", "2")
    yield m
    assert m.stop() == 0  # SIGTERM ends it cleanly


@pytest.fixture
def raw() -> Iterator[Callable[[str], zmq.Socket[Any]]]:
    ctx: zmq.Context[Any] = zmq.Context()

    def connect(address: str, kind: int = zmq.DEALER) -> zmq.Socket[Any]:
        s = ctx.socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVTIMEO, 5000)
        s.connect(f"tcp://{address}")
        return s

    yield connect
    ctx.destroy(linger=0)


def ask(sock: zmq.Socket[Any], *frames: bytes) -> p.Reply:
    sock.send_multipart(list(frames))
    return p.decode_reply(sock.recv_multipart()[0])


def enc(**fields: Any) -> bytes:
    return msgspec.msgpack.encode(fields)


SEG = {"name": "seg", "client_id": "c", "host": "h", "base": 0, "size": 1 << 20}
BAD = {
    "empty": b"",
    "garbage": b"\xc1\xff\x00junk",
    "truncated": enc(op="put_start", key="k", size=10)[:-3],
    "not a map": msgspec.msgpack.encode([1, 2, 3]),
    "unknown op": enc(op="format_disk"),
    "no op": enc(key="k"),
    "missing field": enc(op="put_start", key="k"),
    "wrong type": enc(op="put_start", key=7, size=10),
    "size as str": enc(op="put_start", key="k", size="10"),
    "unknown field": enc(op="exists", key="k", evil=1),
    "key too long": enc(op="put_start", key="k" * 5000, size=10),
    "empty key": enc(op="exists", key=""),
    "negative size": enc(op="put_start", key="k", size=-1),
    "zero size": enc(op="put_start", key="k", size=0),
    "huge size": enc(op="put_start", key="k", size=(1 << 64) - 1),
    "bad replicas": enc(op="put_start", key="k", size=1, config={"replica_num": 0}),
    "bad segment": enc(op="mount_segment", segment={**SEG, "size": -5}),
    "batch of ints": enc(op="batch_exists", keys=[1, 2]),
    "batch mismatch": enc(op="batch_put_start", keys=["a", "b"], sizes=[1]),
    "deep nesting": b"\x91" * 5000 + b"\xc0",
}


def test_malformed_requests_get_errors_and_change_nothing(master: Proc, raw: Any) -> None:
    address = master.ready["address"]
    sock = raw(address)
    assert ask(sock, enc(op="mount_segment", segment=SEG)).ok
    before = p.result(ask(sock, enc(op="stats")), p.StoreStats)
    for what, body in BAD.items():
        reply = ask(sock, body)
        assert not reply.ok, what
        assert reply.code in (StoreCode.INVALID_PARAMS, StoreCode.INVALID_KEY), (what, reply)
    reply = ask(sock, enc(op="exists", key="k"), b"mac?", b"third frame")
    assert reply.code == StoreCode.INVALID_PARAMS
    req = raw(address, zmq.REQ)  # a REQ peer's delimiter frame is understood too
    assert p.decode_reply(req.send(enc(op="exists", key="k")) or req.recv()).ok
    after = p.result(ask(sock, enc(op="stats")), p.StoreStats)
    assert after.objects == before.objects == 0 and after.pending == 0
    assert after.tiers["dram"].bytes_used == 0
    assert ask(sock, enc(op="put_start", key="k", size=100)).ok  # still serving


def test_batch_replies_one_result_per_key(master: Proc, raw: Any) -> None:
    sock = raw(master.ready["address"])
    assert ask(sock, enc(op="mount_segment", segment=SEG)).ok
    items = p.result(ask(sock, enc(op="batch_put_start", keys=["a", "a", "b"],
                                   sizes=[10, 10, 1 << 30])), list[p.Reply])
    assert [i.ok for i in items] == [True, False, False]
    assert items[1].code == StoreCode.OBJECT_ALREADY_EXISTS
    assert items[2].code == StoreCode.NO_AVAILABLE_HANDLE


def test_secret_refuses_bad_macs(raw: Any, make_engine: Callable[..., Any]) -> None:
    m = start_master(free_port(), "--secret", SECRET)
    try:
        address = m.ready["address"]
        sock = raw(address)
        body = enc(op="stats")
        for frames in ([body], [body, b"x" * 32], [body, p.mac(b"wrong", body)]):
            reply = ask(sock, *frames)
            assert not reply.ok and reply.code == StoreCode.RPC_FAIL
        assert ask(sock, body, p.mac(SECRET.encode(), body)).ok
        engine = make_engine()
        for secret in (None, "wrong"):
            with pytest.raises(StoreError) as e:
                StoreClient(address, engine, 1 << 20, secret=secret, timeout=2)
            assert e.value.code == StoreCode.RPC_FAIL
        with StoreClient(address, engine, 1 << 20, secret=SECRET) as c:
            c.put("k", b"secret value")
            assert c.get("k") == b"secret value"
    finally:
        assert m.stop() == 0


def test_dead_master_fails_fast(make_engine: Callable[..., Any]) -> None:
    engine = make_engine()
    t = time.monotonic()
    with pytest.raises(StoreError) as e:
        StoreClient(f"127.0.0.1:{free_port()}", engine, 1 << 20, timeout=0.5)
    assert e.value.code == StoreCode.RPC_FAIL and time.monotonic() - t < 3


def test_master_gone_mid_session(make_engine: Callable[..., Any]) -> None:
    m = start_master(free_port())
    c = StoreClient(m.ready["address"], make_engine(), 1 << 20, timeout=0.5)
    c.put("k", b"v")
    assert m.stop() == 0
    t = time.monotonic()
    for op in (lambda: c.get("k"), lambda: c.exists("k"), lambda: c.put("j", b"x")):
        with pytest.raises(StoreError) as e:
            op()
        assert e.value.code == StoreCode.RPC_FAIL
    assert time.monotonic() - t < 5
    c.close()  # unmounting a dead master's segment must not hang either


def test_bad_settings_and_busy_port_exit_with_a_message() -> None:
    m = start_master(free_port())
    try:
        for extra in (["--client-ttl", "0"], ["--high-watermark", "2"],
                      ["--port", m.ready["address"].rpartition(":")[2]]):
            cmd = [sys.executable, "-m", "mooncake_cli.store.service", "--port",
                   str(free_port()), *extra]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            assert r.returncode != 0 and r.stderr.startswith("error:"), (extra, r.stderr)
    finally:
        assert m.stop() == 0
