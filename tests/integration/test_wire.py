"""The target's wire protocol under abuse: raw sockets send malformed, truncated, out-of-bounds
and unauthenticated frames straight to a TargetServer; it answers errors, never touches memory
outside its regions, and keeps serving."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from mooncake_cli.transfer import wire
from mooncake_cli.transfer.listener import TargetServer
from mooncake_cli.transfer.segment import Segment

pytestmark = pytest.mark.timeout(30)

SIZE = 64 * 1024 - 1000  # not a multiple of the 4 KiB alignment: a gap follows the region
OTHER = 64 * 1024  # where the second region starts
PATTERN = bytes((i * 7 + 3) & 0xFF for i in range(SIZE))
SECRET = "s3cret"


class Served:
    def __init__(self, secret: str | None) -> None:
        self.segment = Segment("wire-test")
        self.buf = bytearray(PATTERN)
        self.region = self.segment.register(self.buf)
        self.other = self.segment.register(bytearray(100))  # a second region after a gap
        assert (self.region.base, self.other.base) == (0, OTHER)
        self.server = TargetServer(self.segment, lambda: b'{"name":"wire-test"}', "127.0.0.1",
                                   0, secret)
        self.secret = secret

    def connect(self, prove: bool = True) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.server.port), timeout=5)
        magic, version, auth, nonce = wire.HELLO.unpack(wire.recv_exact(s, wire.HELLO.size))
        assert (magic, version, auth) == (b"MCK", wire.VERSION, int(self.secret is not None))
        if auth and prove:
            assert self.secret is not None
            s.sendall(wire.prove(self.secret, nonce))
            assert wire.recv_exact(s, 1) == b"\x00"
        return s


@pytest.fixture
def served() -> Iterator[Served]:
    srv = Served(None)
    yield srv
    srv.server.close()


@pytest.fixture
def served_auth() -> Iterator[Served]:
    srv = Served(SECRET)
    yield srv
    srv.server.close()


def request(s: socket.socket, op: int, off: int, length: int, rid: int = 1,
            payload: bytes = b"") -> tuple[int, int, bytes]:
    """Send one frame; (status, request id, payload) of the reply."""
    s.sendall(wire.REQUEST.pack(op, 0, 0, rid, off, length) + payload)
    status, _z, _r, got_rid, n = wire.RESPONSE.unpack(wire.recv_exact(s, wire.RESPONSE.size))
    return status, got_rid, wire.recv_exact(s, n)


def closed(s: socket.socket) -> bool:
    """True when the server closed its end (EOF or reset) within the socket's timeout."""
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def still_serving(srv: Served) -> None:
    """A fresh connection is accepted and answered (reads what the buffer holds now)."""
    with srv.connect() as s:
        assert request(s, wire.OP_PING, 0, 0, rid=77) == (wire.OK, 77, b"")
        status, _, data = request(s, wire.OP_READ, 0, SIZE, rid=78)
        assert status == wire.OK and data == bytes(srv.buf)
        assert request(s, wire.OP_READ, OTHER, 100, rid=79) == (wire.OK, 79, bytes(100))


def test_valid_frames(served: Served) -> None:
    with served.connect() as s:
        assert request(s, wire.OP_DESCRIBE, 0, 0, rid=5) == (wire.OK, 5, b'{"name":"wire-test"}')
        assert request(s, wire.OP_READ, 100, 50, rid=6) == (wire.OK, 6, PATTERN[100:150])
        assert request(s, wire.OP_WRITE, 10, 4, rid=7, payload=b"abcd") == (wire.OK, 7, b"")
        assert request(s, wire.OP_READ, 8, 8, rid=8) == (wire.OK, 8, PATTERN[8:10] + b"abcd"
                                                         + PATTERN[14:16])
    assert served.buf[10:14] == b"abcd"


@pytest.mark.parametrize("op", [0, 6, 99, 255])
def test_bad_op_code_gets_an_error_and_the_connection_closed(served: Served, op: int) -> None:
    with served.connect() as s:
        status, rid, msg = request(s, op, 0, 16, rid=42)
        assert (status, rid) == (wire.E_BADOP, 42)
        assert b"malformed" in msg
        assert closed(s)
    still_serving(served)
    assert bytes(served.buf) == PATTERN


def test_absurd_length_is_malformed_and_nothing_is_read(served: Served) -> None:
    with served.connect() as s:
        status, _, msg = request(s, wire.OP_WRITE, 0, wire.MAX_REQUEST + 1, rid=3)
        assert status == wire.E_BADOP and b"malformed" in msg
        assert closed(s)
    still_serving(served)
    assert bytes(served.buf) == PATTERN


@pytest.mark.parametrize("off,length", [
    (SIZE, 1),  # just past the end
    (SIZE - 3, 8),  # crossing the end
    (SIZE - 100, OTHER + 50 - (SIZE - 100)),  # first region, across the gap, into the second
    (SIZE + 10, 20),  # inside the gap
    (OTHER + 90, 20),  # crossing the end of the second region
    (1 << 63, 16),  # huge
    ((1 << 64) - 1, 1),  # the largest offset
    ((1 << 64) - 8, 16),  # offset + length wraps 64 bits
])
def test_out_of_bounds_write_is_refused_and_the_connection_stays_usable(
        served: Served, off: int, length: int) -> None:
    with served.connect() as s:
        status, rid, msg = request(s, wire.OP_WRITE, off, length, rid=9, payload=b"\xee" * length)
        assert (status, rid) == (wire.E_BOUNDS, 9)
        assert b"out of bounds" in msg
        # the payload was drained: the next frame on the same connection is understood
        assert request(s, wire.OP_READ, 0, SIZE, rid=10) == (wire.OK, 10, PATTERN)
        status, _, msg = request(s, wire.OP_READ, off, length, rid=11)
        assert status == wire.E_BOUNDS and b"out of bounds" in msg
        assert request(s, wire.OP_PING, 0, 0, rid=12) == (wire.OK, 12, b"")
    assert bytes(served.buf) == PATTERN
    assert bytes(served.other.view) == bytes(100)


def test_large_refused_write_payload_is_drained(served: Served) -> None:
    n = 3 * (1 << 20) + 123  # bigger than the server's 1 MiB scratch buffer
    with served.connect() as s:
        status, _, _ = request(s, wire.OP_WRITE, SIZE - 10, n, rid=1, payload=b"\xee" * n)
        assert status == wire.E_BOUNDS
        assert request(s, wire.OP_READ, 0, 16, rid=2) == (wire.OK, 2, PATTERN[:16])
    assert bytes(served.buf) == PATTERN


@pytest.mark.parametrize("sent", [b"", b"\x02", wire.REQUEST.pack(wire.OP_READ, 0, 0, 1, 0, 8)[:23],
                                  wire.REQUEST.pack(wire.OP_WRITE, 0, 0, 1, 0, 64) + b"x" * 10])
def test_truncated_frame_then_close_leaves_the_server_running(served: Served,
                                                              sent: bytes) -> None:
    s = served.connect()
    s.sendall(sent)
    s.close()
    still_serving(served)
    # a truncated WRITE is applied whole or not at all: nothing of it landed
    assert bytes(served.buf) == PATTERN
    assert bytes(served.other.view) == bytes(100)


def test_many_clients_disconnecting_abruptly(served: Served) -> None:
    for _ in range(50):
        s = socket.create_connection(("127.0.0.1", served.server.port), timeout=5)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()  # RST before even reading the hello
    still_serving(served)


# -- HMAC handshake ---------------------------------------------------------------------------
def test_right_proof_is_accepted(served_auth: Served) -> None:
    still_serving(served_auth)


@pytest.mark.parametrize("proof", [
    b"\x00" * 32,
    wire.prove("wrong secret", b"\x00" * 32),
    wire.REQUEST.pack(wire.OP_READ, 0, 0, 1, 0, SIZE) + b"\x00" * 8,  # skipping the handshake
])
def test_wrong_proof_is_refused(served_auth: Served, proof: bytes) -> None:
    s = served_auth.connect(prove=False)
    s.sendall(proof)
    assert wire.recv_exact(s, 1) == b"\x01"
    # nothing more is served on that connection
    try:
        s.sendall(wire.REQUEST.pack(wire.OP_READ, 0, 0, 2, 0, SIZE))
    except OSError:
        pass
    assert closed(s)
    s.close()
    assert bytes(served_auth.buf) == PATTERN
    still_serving(served_auth)


def test_replayed_proof_is_refused(served_auth: Served) -> None:
    """A proof recorded from one connection does not open another: every nonce is fresh."""
    first = socket.create_connection(("127.0.0.1", served_auth.server.port), timeout=5)
    nonce1 = wire.HELLO.unpack(wire.recv_exact(first, wire.HELLO.size))[3]
    recorded = wire.prove(SECRET, nonce1)
    first.sendall(recorded)
    assert wire.recv_exact(first, 1) == b"\x00"
    first.close()
    second = socket.create_connection(("127.0.0.1", served_auth.server.port), timeout=5)
    nonce2 = wire.HELLO.unpack(wire.recv_exact(second, wire.HELLO.size))[3]
    assert nonce2 != nonce1
    second.sendall(recorded)
    assert wire.recv_exact(second, 1) == b"\x01"
    assert closed(second)
    second.close()


def test_short_proof_then_close(served_auth: Served) -> None:
    s = served_auth.connect(prove=False)
    s.sendall(b"\x00" * 5)
    s.close()
    still_serving(served_auth)


def test_server_close_drops_its_connections(served: Served) -> None:
    s = served.connect()
    served.server.close()
    assert closed(s)
    s.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", served.server.port), timeout=2).close()


def test_silent_newcomer_is_dropped_after_the_handshake_timeout(monkeypatch) -> None:
    from mooncake_cli.transfer import listener as server_mod

    monkeypatch.setattr(server_mod, "HANDSHAKE_TIMEOUT", 0.3)
    srv = Served(SECRET)  # built after the patch: its connections use the short timeout
    try:
        s = srv.connect(prove=False)  # reads HELLO, never answers the challenge
        s.settimeout(5)
        assert closed(s)  # the server gave up on it instead of holding a thread forever
        still_serving(srv)
    finally:
        srv.server.close()


def test_a_full_table_closes_the_longest_idle_connection_for_a_newcomer() -> None:
    segment = Segment("limited")
    segment.register(bytearray(16))
    srv = TargetServer(segment, lambda: b"{}", "127.0.0.1", 0, None, max_connections=2)
    try:
        held = []
        for _ in range(2):  # each taken in (greeted) before the next: held[0] is the longest idle
            held.append(socket.create_connection(("127.0.0.1", srv.port), timeout=5))
            wire.recv_exact(held[-1], wire.HELLO.size)
        extra = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        wire.recv_exact(extra, wire.HELLO.size)
        assert request(extra, wire.OP_PING, 0, 0, rid=7)[:2] == (wire.OK, 7)
        assert closed(held[0])  # made room for the newcomer
        assert request(held[1], wire.OP_PING, 0, 0, rid=8)[:2] == (wire.OK, 8)
        for s in (*held, extra):
            s.close()
    finally:
        srv.close()
