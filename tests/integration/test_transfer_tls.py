"""Encryption in transit on the tcp transport: a real target process started with --encrypt
speaks TLS 1.3 bound to the secret. A relay that records the bytes sees none of the payload;
a man in the middle with its own certificate is refused; plain and encrypting sides refuse to
pretend to each other."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator

import pytest

from mooncake_cli.config import TransferConfig
from mooncake_cli.interfaces import TransferError
from mooncake_cli.registry import Registry
from mooncake_cli.transfer import tls, wire
from mooncake_cli.transfer.batch import Op
from mooncake_cli.transfer.client import TargetClient
from mooncake_cli.transfer.engine import TransferEngine
from tests.conftest import Target, start_target

pytestmark = pytest.mark.timeout(60)
SECRET = "tls-secret"
MiB = 1 << 20


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    t = start_target(4 * MiB, secret=SECRET, env={"MOONCAKE_TRANSFER_ENCRYPT": "1"})
    yield t
    t.kill()


def port_of(t: Target) -> int:
    return int(t.address.rpartition(":")[2])


class Relay:
    """A TCP relay to `port` keeping every byte it forwards (both ways)."""

    def __init__(self, port: int) -> None:
        self.seen = bytearray()
        self._lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self._lsock.getsockname()[1]
        self._to = port
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                a, _ = self._lsock.accept()
            except OSError:
                return
            b = socket.create_connection(("127.0.0.1", self._to))
            for src, dst in ((a, b), (b, a)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(1 << 16):
                self.seen += chunk
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            dst.close()

    def close(self) -> None:
        self._lsock.close()


def test_the_payload_never_crosses_in_clear(target: Target) -> None:
    relay = Relay(port_of(target))
    payload = os.urandom(256 << 10)
    c = TargetClient("127.0.0.1", relay.port, SECRET, 10)
    try:
        assert c.tls
        c.write(target.offset, memoryview(payload))
        back = bytearray(len(payload))
        c.read(target.offset, memoryview(back))
        assert back == payload
    finally:
        c.close()
        relay.close()
    assert len(relay.seen) > 2 * len(payload)
    assert payload[:64] not in relay.seen and payload[-64:] not in relay.seen


def test_a_man_in_the_middle_with_its_own_certificate_is_refused(target: Target) -> None:
    """It terminates TLS itself (knowing no secret): the client's proof names the MITM's
    certificate and the MITM cannot answer with the target's proof."""
    ctx, _ = tls.server_context()
    lsock = socket.create_server(("127.0.0.1", 0))
    got: list[bytes] = []

    def mitm() -> None:
        conn, _ = lsock.accept()
        real = socket.create_connection(("127.0.0.1", port_of(target)))
        hello = wire.recv_exact(real, wire.HELLO.size)
        conn.sendall(hello)  # the target's own nonce
        s = ctx.wrap_socket(conn, server_side=True)
        got.append(wire.recv_exact(s, 32))
        s.sendall(b"\x00" + os.urandom(32))
        real.close()

    threading.Thread(target=mitm, daemon=True).start()
    with pytest.raises(TransferError, match="did not prove the secret"):
        TargetClient("127.0.0.1", lsock.getsockname()[1], SECRET, 5)
    lsock.close()
    assert got and len(got[0]) == 32


def test_a_wrong_secret_is_refused_over_tls(target: Target) -> None:
    with pytest.raises(TransferError, match="refused our secret"):
        TargetClient("127.0.0.1", port_of(target), "wrong", 5)


def test_an_engine_that_wants_encryption_refuses_a_plain_target() -> None:
    plain = start_target(MiB, secret=SECRET)
    try:
        with pytest.raises(TransferError, match="does not encrypt"):
            TargetClient("127.0.0.1", port_of(plain), SECRET, 5, encrypt=True)
    finally:
        plain.kill()


def test_engines_move_bytes_over_tls(target: Target) -> None:
    eng = TransferEngine(TransferConfig(secret=SECRET, encrypt=True, transport="tcp"),
                         Registry())
    try:
        src = eng.register(bytearray(os.urandom(3 * MiB)))
        eng.transfer(Op.WRITE, src, 0, target.segment, target.offset, 3 * MiB)
        back = eng.register(bytearray(3 * MiB))
        eng.transfer(Op.READ, back, 0, target.segment, target.offset, 3 * MiB)
        assert back.view is not None and src.view is not None
        assert bytes(back.view) == bytes(src.view)
    finally:
        eng.close()


def test_encryption_needs_a_secret() -> None:
    with pytest.raises(Exception, match="needs the cluster secret"):
        TransferEngine(TransferConfig(encrypt=True), Registry())
