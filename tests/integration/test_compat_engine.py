"""Upstream `mooncake.engine`'s TransferEngine as a specification, held against our compat
module (mooncake_cli.compat.engine) and, where upstream's wheel is installed, upstream's own
class in the same session: raw-address registration, sync/async/batch transfers both ways, a
peer in another process, managed buffers, and the codes of bad input (a remote address outside
registered memory, an unknown peer, mismatched lists, overlapping registrations). Ours alone is
also held to what upstream's cannot do without crashing: calls before initialize, local
addresses outside registered memory, closed engines."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from tests.conftest import free_port, wait_for
from tests.helpers.procs import child_env

os.environ.setdefault("GLOG_minloglevel", "2")
pytestmark = pytest.mark.timeout(120)
N = 1 << 16

# A peer in its own process: registers N bytes (0, 1, 2, ...), prints "PORT ADDR", then
# answers each line on stdin with the buffer's bytes [a, b) as hex.
PEER = f"""
import sys, numpy as np, importlib
m = importlib.import_module(sys.argv[1])
te = m.TransferEngine()
assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
buf = (np.arange({N}) % 251).astype(np.uint8)
assert te.register_memory(buf.ctypes.data, buf.nbytes) == 0
print(te.get_rpc_port(), buf.ctypes.data, flush=True)
for line in sys.stdin:
    a, b = map(int, line.split())
    print(buf[a:b].tobytes().hex(), flush=True)
"""


def _upstream() -> Any:
    from mooncake_cli.bench import store_upstream

    ok, why = store_upstream.available()
    if not ok:
        pytest.skip(why)
    import mooncake.engine as theirs

    return theirs


@pytest.fixture(scope="module", params=["ours", "upstream"])
def m(request: pytest.FixtureRequest) -> Any:
    if request.param == "ours":
        from mooncake_cli.compat import engine as ours

        return ours
    return _upstream()


@pytest.fixture
def make(m: Any) -> Iterator[Callable[[], Any]]:
    made: list[Any] = []

    def new() -> Any:
        te = m.TransferEngine()
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        made.append(te)
        return te

    yield new
    for te in made:
        if hasattr(te, "close"):  # ours; upstream's lives until collected
            te.close()


def reg(te: Any, buf: np.ndarray) -> int:
    assert te.register_memory(buf.ctypes.data, buf.nbytes) == 0
    return int(buf.ctypes.data)


def name(te: Any) -> str:
    return f"127.0.0.1:{te.get_rpc_port()}"


def test_sync_transfers_move_bytes_between_registered_addresses(
        make: Callable[[], Any], m: Any) -> None:
    a, b = make(), make()
    assert a.get_rpc_port() > 0 and a.get_rpc_port() != b.get_rpc_port()
    src = (np.arange(N) % 253).astype(np.uint8)
    dst = np.zeros(N, np.uint8)
    s = reg(a, src)
    assert b.batch_register_memory([dst.ctypes.data], [dst.nbytes]) == 0
    d = int(dst.ctypes.data)
    assert a.transfer_sync_write(name(b), s, d, 4096) == 0
    assert a.batch_transfer_sync_write(name(b), [s + 4096, s + 20000], [d + 4096, d + 20000],
                                       [8192, 30000]) == 0
    assert np.array_equal(dst[:12288], src[:12288])
    assert np.array_equal(dst[20000:50000], src[20000:50000])
    assert a.transfer_sync_read(name(b), s + 100, d + 10, 10) == 0
    assert np.array_equal(src[100:110], dst[10:20])
    assert a.transfer_sync(name(b), s, d + 60000, 16, m.TransferOpcode.Write) == 0
    assert np.array_equal(dst[60000:60016], src[:16])
    assert a.batch_transfer_sync(name(b), [s], [d], [8], m.TransferOpcode.Read) == 0
    assert np.array_equal(src[:8], dst[:8])
    assert int(m.TransferOpcode.Read) == 0 and int(m.TransferOpcode.Write) == 1
    assert a.get_first_buffer_address(name(b)) == d
    assert a.send_probe(name(b)) == 0


def test_async_batches_and_their_status(make: Callable[[], Any]) -> None:
    a, b = make(), make()
    src, dst = np.full(N, 7, np.uint8), np.zeros(N, np.uint8)
    s, d = reg(a, src), reg(b, dst)
    w = a.batch_transfer_async_write(name(b), [s, s + 1000], [d, d + 1000], [1000, 1000])
    r = a.batch_transfer_async_read(name(b), [s + 5000], [d + 5000], [10])
    assert w != 0 and r != 0
    assert a.get_batch_transfer_status([w, r]) == 0
    assert (dst[:2000] == 7).all() and (src[5000:5010] == 0).all()
    src[:] = 9
    bid = a.transfer_submit_write(name(b), s, d, 3000)
    wait_for(lambda: a.transfer_check_status(bid) == 1, 10)
    assert (dst[:3000] == 9).all() and (dst[3000:] != 9).all()


def test_a_peer_in_another_process(m: Any, make: Callable[[], Any]) -> None:
    peer = subprocess.Popen([sys.executable, "-c", PEER, m.__name__], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        assert peer.stdin is not None and peer.stdout is not None
        port, addr = map(int, peer.stdout.readline().split())
        a = make()
        src = np.frombuffer(b"mooncake" * 512, np.uint8).copy()
        s = reg(a, src)
        target = f"127.0.0.1:{port}"
        assert a.transfer_sync_write(target, s, addr + 1000, 4096) == 0
        peer.stdin.write("1000 5096\n")
        peer.stdin.flush()
        assert bytes.fromhex(peer.stdout.readline().strip()) == src[:4096].tobytes()
        back = np.zeros(64, np.uint8)
        b = reg(a, back)
        assert a.transfer_sync_read(target, b, addr, 64) == 0
        assert np.array_equal(back, (np.arange(64) % 251).astype(np.uint8))
        # past the end of the peer's buffer: refused whole, nothing written there
        assert a.transfer_sync_write(target, s, addr + N - 100, 200) == -1
        peer.stdin.write(f"{N - 100} {N}\n")
        peer.stdin.flush()
        expect = (np.arange(N - 100, N) % 251).astype(np.uint8).tobytes()
        assert bytes.fromhex(peer.stdout.readline().strip()) == expect
        assert a.transfer_sync_write(target, s, 4096, 16) == -1  # not its memory at all
        assert a.transfer_sync_write(target, s, addr, 16) == 0  # and it still serves
    finally:
        peer.kill()
        peer.wait()


def test_bad_input_is_a_code_and_moves_nothing(make: Callable[[], Any]) -> None:
    a, b = make(), make()
    src, dst = np.ones(N, np.uint8), np.zeros(N, np.uint8)
    s, d = reg(a, src), reg(b, dst)
    assert a.register_memory(s, N) == -7  # overlapped memory region
    assert a.register_memory(s + 100, 10) == -7
    assert a.transfer_sync_write(name(b), s, d + N - 10, 100) == -1
    assert a.transfer_sync_write(name(b), s, 12345, 100) == -1
    assert not dst.any()
    assert a.batch_transfer_sync_write(name(b), [s], [d, d + 1], [1]) == -1
    assert a.transfer_sync_write("127.0.0.1:1", s, d, 100) == -1  # nobody there
    assert a.transfer_sync_write(name(b), s, d, 0) == 0
    assert not dst.any()
    assert a.unregister_memory(s) == 0 and a.unregister_memory(s) == -3
    assert b.transfer_sync_write(name(a), d, s, 10) == -1  # a's memory is gone


def test_managed_buffers(make: Callable[[], Any]) -> None:
    a, b = make(), make()
    p = a.allocate_managed_buffer(1 << 20)
    assert p != 0
    assert a.write_bytes_to_buffer(p + 10, b"hello mooncake", 14) == 0
    assert a.read_bytes_from_buffer(p + 10, 14) == b"hello mooncake"
    dst = np.zeros(64, np.uint8)
    d = reg(b, dst)
    assert a.transfer_sync_write(name(b), p + 10, d, 14) == 0
    assert dst[:14].tobytes() == b"hello mooncake"
    assert b.transfer_sync_read(name(a), d + 20, p + 16, 8) == 0
    assert dst[20:28].tobytes() == b"mooncake"
    assert a.free_managed_buffer(p, 1 << 20) == 0


def test_wrong_types_raise_type_error_as_the_binding_does(make: Callable[[], Any],
                                                        m: Any) -> None:
    a = make()
    buf = np.zeros(64, np.uint8)
    p = reg(a, buf)
    for call in (lambda: a.register_memory(-1, 10), lambda: a.register_memory(2**70, 10),
                 lambda: a.register_memory(None, 1), lambda: a.register_memory(1.5, 1),
                 lambda: a.get_first_buffer_address(None), lambda: a.send_probe(5),
                 lambda: a.batch_unregister_memory(None), lambda: a.unregister_memory([1]),
                 lambda: a.transfer_sync_write("x", -1, 0, 0),
                 lambda: a.batch_transfer_sync_write("x", None, [], []),
                 lambda: a.batch_transfer_sync_write("x", [1.0], [1], [1]),
                 lambda: a.transfer_sync("x", p, p, 1, 1),  # an int is not a TransferOpcode
                 lambda: a.get_batch_transfer_status(None),
                 lambda: a.allocate_managed_buffer(-1)):
        with pytest.raises(TypeError, match="incompatible function arguments"):
            call()
    assert a.batch_unregister_memory((p,)) == 0  # any sequence of addresses
    assert a.register_memory(p, True) == 0  # a bool is an int to the binding


# -- ours only: what upstream's answers with a crash ----------------------------------------------
@pytest.fixture
def ours() -> Any:
    from mooncake_cli.compat import engine

    return engine


def test_ours_never_crashes_the_host(ours: Any) -> None:
    te = ours.TransferEngine()  # not initialized: upstream's segfaults on each of these
    assert te.get_rpc_port() == -1 and te.register_memory(4096, 10) == -1
    assert te.transfer_sync_write("127.0.0.1:1", 1, 1, 1) == -1
    assert te.allocate_managed_buffer(100) == 0 and te.unregister_memory(5) == -1
    assert te.read_bytes_from_buffer(4096, 8) == b"" and te.get_first_buffer_address("x") == 0
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == -1  # once
    other = ours.TransferEngine()
    assert other.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    dst = np.zeros(64, np.uint8)
    d = reg(other, dst)
    private = np.ones(64, np.uint8)  # never registered: refused, not read (upstream reads it)
    assert te.transfer_sync_write(name(other), private.ctypes.data, d, 64) == -1
    assert te.write_bytes_to_buffer(private.ctypes.data, b"x", 1) == -1
    assert te.read_bytes_from_buffer(0, 8) == b"" and te.transfer_check_status(999) == -1
    assert te.batch_register_memory([d], [1 << 60]) == -1  # a size past any address space
    assert te.transfer_sync(name(other), 0, d, 1, ours.Write, ours.TransferNotify("n", "m")) \
        == -1  # notifications are not carried
    te.close()
    assert te.transfer_sync_write(name(other), 0, d, 1) == -1 and te.get_rpc_port() == -1
    assert not dst.any()
    other.close()


@pytest.mark.parametrize("protocol", ["tcp", "rdma", "auto", "shm", ""])
def test_ours_protocols_fall_back_as_upstream(ours: Any, protocol: str) -> None:
    a, b = ours.TransferEngine(), ours.TransferEngine()
    try:
        assert a.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") == 0
        assert b.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") == 0
        p = a.allocate_managed_buffer(N)  # shared memory: shm maps it on one host
        dst = np.zeros(N, np.uint8)
        d = reg(b, dst)
        assert a.write_bytes_to_buffer(p, b"z" * N, N) == 0
        assert a.transfer_sync_write(name(b), p, d, N) == 0 and (dst == ord("z")).all()
        assert b.transfer_sync_read(name(a), d, p, 16) == 0
        # unless tcp is forced, shm reaches a same-host peer: a's managed buffer is shared
        # memory, which b maps; b's is private, which a copies into by the kernel's
        # cross-memory calls (rdma without a NIC: as auto)
        want = "tcp" if protocol == "tcp" else "shm"
        assert a.get_engine().transport_for(name(b)) == want
        assert b.get_engine().transport_for(name(a)) == want
        if protocol != "tcp":
            why = a.get_engine().transport_choices()[name(b)][1]
            assert "private memory (cross-memory copies)" in why
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("kind", ["http", "etcd"])
def test_ours_with_a_metadata_server(ours: Any, kind: str, request: pytest.FixtureRequest) -> None:
    url = (request.getfixturevalue("metadata_server").url if kind == "http"  # type: ignore
           else request.getfixturevalue("etcd"))
    a, b = ours.TransferEngine(), ours.TransferEngine()
    try:
        # the segment is named local_hostname in the metadata server, as upstream's
        assert a.initialize(f"127.0.0.1:{free_port()}", url, "tcp", "") == 0
        assert b.initialize(f"127.0.0.1:{free_port()}", url, "tcp", "") == 0
        src, dst = np.full(128, 3, np.uint8), np.zeros(128, np.uint8)
        s, d = reg(a, src), reg(b, dst)
        peer = b.get_engine().name
        assert a.transfer_sync_write(peer, s, d, 128) == 0 and (dst == 3).all()
        assert a.get_first_buffer_address(peer) == d
        assert a.transfer_sync_write("no-such-segment", s, d, 1) == -1
    finally:
        a.close()
        b.close()
