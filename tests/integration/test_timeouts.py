"""A peer that accepts and then never answers: every request FAILS within the configured
timeout, with a reason that says so, and the engine keeps working for other peers."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from mooncake_cli.interfaces import RegionInfo, SegmentDescriptor
from mooncake_cli.transfer import wire
from mooncake_cli.transfer.batch import Op, State, TransferRequest
from mooncake_cli.transfer.metadata_http import HttpMetadata

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def silent_peer() -> Iterator[tuple[str, int]]:
    """Sends a valid HELLO, then reads requests and never replies."""
    srv = socket.create_server(("127.0.0.1", 0))
    conns: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                return
            conns.append(c)
            c.sendall(wire.HELLO.pack(b"MCK", wire.VERSION, 0, bytes(32)))

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()[:2]
    stop.set()
    srv.close()
    for c in conns:
        c.close()


@pytest.mark.parametrize("size", [4096, 8 << 20])
def test_silent_peer_fails_within_the_timeout(size, silent_peer, metadata_server,
                                              make_engine) -> None:
    host, port = silent_peer
    HttpMetadata(metadata_server.url, 2, 10).publish(SegmentDescriptor(
        "silent", host, port, "", 1, False, (RegionInfo(0, 16 << 20),)))
    live = make_engine(metadata=metadata_server.url, name="live")
    live_region = live.allocate(1 << 20)
    eng = make_engine(metadata=metadata_server.url, transport="tcp", timeout=1.0)
    region = eng.allocate(16 << 20)
    t0 = time.monotonic()
    [st] = eng.submit([TransferRequest(Op.READ, region, 0, "silent", 0, size)]).wait(10)
    elapsed = time.monotonic() - t0
    assert st.state is State.FAILED
    assert "did not answer within 1 s" in st.reason
    assert elapsed < 5, f"took {elapsed:.1f} s for a 1 s timeout"
    # the engine still serves other peers
    live_region.view[:4] = b"ok!!"
    [st] = eng.submit([TransferRequest(Op.READ, region, 0, "live", live_region.base, 4)]).wait(10)
    assert st.state is State.COMPLETED and bytes(region.view[:4]) == b"ok!!"
